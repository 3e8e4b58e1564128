"""Numbers read from environment variables (.env through compose): a bad one is named in one line."""

from __future__ import annotations

import math
from collections.abc import Mapping

from verlbox.errors import UsageError


def number(environ: Mapping[str, str], name: str, default: float, *, minimum: float, whole: bool = False) -> float:
    """NAME's value, DEFAULT when unset or empty; anything but a finite number >= MINIMUM is a UsageError."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value: float | None = int(raw) if whole else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum:
        kind = "a whole number" if whole else "a number of seconds"
        raise UsageError(f"{name}={raw}: expected {kind} >= {minimum:g}")
    return value
