"""A run folder's settings that compose.yaml decodes itself, checked before compose reads them.

compose refuses a bad one only deep in its own decoding ("error decoding 'services[ray-worker].deploy...'
invalid value"), naming a service the user may never run; verlbox says which variable, where it was set
and what it takes, as bad input (exit 2). The values are taken as compose takes them: the environment's
first (set, even empty), then the project folder's .env.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError
from verlbox.runtime.training.environment import GPUS as GPUS_VARIABLE
from verlbox.runtime.training.environment import gpu_count_ok


def compose_setting(variable: str, project: Path, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """VARIABLE as compose reads it for the project in PROJECT, and where it came from."""
    if variable in environ:
        return environ[variable], "the environment"
    return dotenv_values(project / ".env").get(variable), str(project / ".env")


def check_gpu_count(project: Path, environ: Mapping[str, str]) -> None:
    """VERLBOX_GPUS is unset or empty (compose's default: 1), a whole number >= 1, or `all`."""
    value, where = compose_setting(GPUS_VARIABLE, project, environ)
    if gpu_count_ok(value):  # the rule train applies to the value compose passes it
        return
    raise UsageError(
        f"{GPUS_VARIABLE}={value!r} (from {where}): expected how many GPUs train reserves, a whole number >= 1, "
        "or `all`"
    )
