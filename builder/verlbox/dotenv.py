"""A run folder's .env, read as compose reads its KEY=VALUE lines: quoted values unquoted, an unquoted value's
` # comment` cut (`verlbox init` writes neither).
Shared: `init` and `shell` read it on the host, and so does `fetch` (which also runs in the image)."""

from __future__ import annotations

from pathlib import Path


def _value(raw: str) -> str:
    """compose's reading of a value: quotes removed from a quoted one, ` #...` cut from an unquoted one."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw.split(" #", 1)[0].rstrip()


def dotenv_values_of(text: str) -> dict[str, str]:
    lines = (line.strip() for line in text.splitlines())
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key.strip().removeprefix("export ").strip(): _value(value) for key, value in pairs}


def dotenv_values(path: Path) -> dict[str, str]:
    """A .env's values; none where there is none or it cannot be read."""
    try:
        return dotenv_values_of(path.read_text(errors="replace"))
    except OSError:
        return {}
