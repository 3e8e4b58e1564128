"""The temporary tag a build works under until it succeeds, and the removal of those a killed build left.

A build interrupted by SIGKILL (or a power cut) cannot untag its image. Its tag names the host and
the process that made it, so a later build on the same host can tell a dead build's tag from one a
running build still needs, and remove only the dead one's.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from typing import Any

from verlbox.host.engine import untag

REPOSITORY = "verlbox-build"
_NOT_IN_A_TAG = re.compile(r"[^A-Za-z0-9_.-]")


def _host() -> str:
    return _NOT_IN_A_TAG.sub("-", socket.gethostname())[:80] or "host"


def staging_tag(recipe: str) -> str:
    """`verlbox-build/RECIPE:PID-TOKEN-HOST`: the token keeps two builds of one process apart."""
    return f"{REPOSITORY}/{recipe}:{os.getpid()}-{secrets.token_hex(4)}-{_host()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_dead_builds_tags(engine: Any, recipe: str) -> list[str]:
    """Untag RECIPE's staging tags whose build process, on this host, is gone; returns them."""
    removed = []
    for image in engine.images.list(name=f"{REPOSITORY}/{recipe}"):
        for tag in image.tags:
            pid, _, rest = tag.rpartition(":")[2].partition("-")
            host = rest.partition("-")[2]
            if pid.isdigit() and host == _host() and not _alive(int(pid)):
                untag(engine, tag)
                removed.append(tag)
    return removed
