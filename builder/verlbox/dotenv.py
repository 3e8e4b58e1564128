"""A run folder's .env, read as compose reads its plain KEY=VALUE lines (`verlbox init` writes no quotes).
Shared: `init` and `shell` read it on the host, and so does `fetch` (which also runs in the image)."""

from __future__ import annotations

from pathlib import Path


def dotenv_values_of(text: str) -> dict[str, str]:
    lines = (line.strip() for line in text.splitlines())
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def dotenv_values(path: Path) -> dict[str, str]:
    """A .env's values; none where there is none or it cannot be read."""
    try:
        return dotenv_values_of(path.read_text(errors="replace"))
    except OSError:
        return {}
