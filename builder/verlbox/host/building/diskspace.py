"""Free space in Docker's data folder, checked before work that needs much of it.

An offline build fills the disk for a moment (its layers, then `docker save`'s and `docker load`'s
temporary copies during the clamp): without this check it fails minutes in with "No space left on
device" from deep inside a step.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

from verlbox.errors import VerlboxError

GIB = 2**30
# the peak an offline build of p40-cu124 added to the disk, over its bundle's size (docs/benchmarks.md:
# 17-19 GiB for a 3.3 GiB bundle, sampled every 10 s), and room for what sampling missed
OFFLINE_BUILD_FACTOR = 6
MARGIN = 2 * GIB


class DiskSpaceError(VerlboxError):
    pass


def local_data_folder(engine: Any) -> Path | None:
    """Docker's data folder when the engine runs on this machine (a remote or VM engine's is not ours)."""
    info = engine.info()
    root = Path(info.get("DockerRootDir") or "/nonexistent")
    if info.get("Name") != socket.gethostname() or not root.is_dir():
        return None
    return root


def require_free_space(engine: Any, needed: int, what: str) -> None:
    """Refuse WHAT before it starts when Docker's data folder has less than NEEDED bytes free."""
    root = local_data_folder(engine)
    if root is None:
        return
    free = shutil.disk_usage(root).free
    if free < needed:
        raise DiskSpaceError(
            f"{what} needs about {needed / GIB:.1f} GiB free in {root} (Docker's data folder) for a moment; "
            f"it has {free / GIB:.1f} GiB. `docker system df` shows what holds it, `docker buildx prune` frees "
            "BuildKit's cache (--skip-space-check starts anyway)"
        )


def offline_build_need(bundle_bytes: int) -> int:
    return OFFLINE_BUILD_FACTOR * bundle_bytes + MARGIN
