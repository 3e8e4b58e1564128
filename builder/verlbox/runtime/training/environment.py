"""Settings read from environment variables (.env through compose): a bad one is named in one line, with the
file it came from when compose passed it.

compose.yaml sets SETTINGS_SOURCE beside the settings it interpolates, so that a message inside the container
names `.env` (compose takes a variable from the shell it runs in first, then from .env); a command run by hand,
with no compose in between, names only the variable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from verlbox.errors import UsageError

SETTINGS_SOURCE = "VERLBOX_SETTINGS_SOURCE"
GPUS = "VERLBOX_GPUS"  # compose.yaml: every service's `count: ${VERLBOX_GPUS:-1}`, and passed to train too


def origin(environ: Mapping[str, str]) -> str:
    """ " from .env (...)" where compose passed the settings; empty where nothing says where they came from."""
    source = environ.get(SETTINGS_SOURCE)
    return f" from {source}" if source else ""


def setting(environ: Mapping[str, str], name: str, value: str | None = None) -> str:
    """NAME=VALUE (VALUE: NAME's own unless given) as a message names it, with where compose took it from."""
    return f"{name}={environ.get(name, '') if value is None else value}{origin(environ)}"


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
        raise UsageError(f"{setting(environ, name, raw)}: expected {kind} >= {minimum:g}")
    return value


def gpu_count_ok(value: str | None) -> bool:
    """VERLBOX_GPUS as compose reserves it: unset or empty (1), a whole number >= 1, or `all`. compose drops a
    count of 0 as if none were given, and Docker then hands over every GPU: 0 is refused, not taken as none."""
    return not value or value == "all" or (value.isascii() and value.isdigit() and int(value) >= 1)


def check_gpu_count(environ: Mapping[str, str]) -> None:
    if not gpu_count_ok(environ.get(GPUS)):
        raise UsageError(
            f"{setting(environ, GPUS)}: expected how many GPUs train reserves, a whole number >= 1, or `all` "
            "(compose reads 0 as no count, and Docker then gives the container every GPU)"
        )
