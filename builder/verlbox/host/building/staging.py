"""The temporary tag a build works under until it succeeds, and the removal of those a killed build left.

A build interrupted by SIGKILL (or a power cut) cannot untag its image. Its tag names the host, the
PID namespace and the process that made it, so a later build on the same host and in the same PID
namespace (a PID means nothing in another container's) can tell a dead build's tag from one a running
build still needs, and remove only the dead one's.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from typing import Any

from verlbox.host.clients.engine import untag

REPOSITORY = "verlbox-build"
_NOT_IN_A_TAG = re.compile(r"[^A-Za-z0-9_.-]")


def _host() -> str:
    return _NOT_IN_A_TAG.sub("-", socket.gethostname())[:80] or "host"


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:  # no /proc (not Linux): such tags are never judged dead
        return "0"


def staging_tag(recipe: str) -> str:
    """`verlbox-build/RECIPE:PID-TOKEN-NS-HOST`: the token keeps two builds of one process apart."""
    return f"{REPOSITORY}/{recipe}:{os.getpid()}-{secrets.token_hex(4)}-{_pid_namespace()}-{_host()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def build_process(tag: str) -> str:
    """The process ID staging TAG names (its build's), as written in the tag."""
    return tag.rpartition(":")[2].split("-", 1)[0]


def build_running(tag: str) -> bool | None:
    """Whether the build that made staging TAG still runs; None when that cannot be told from here (another
    host or PID namespace, no /proc, a tag of another shape)."""
    pid, _token, namespace, host = [*tag.rpartition(":")[2].split("-", 3), "", "", ""][:4]
    if not pid.isdigit() or host != _host() or namespace != _pid_namespace() or namespace == "0":
        return None
    return _alive(int(pid))


def remove_dead_builds_tags(engine: Any, recipe: str) -> list[str]:
    """Untag RECIPE's staging tags whose build process, on this host and in this PID namespace, is gone;
    returns them. Other tags of the same image (the final one, a user's) are never looked at."""
    removed = []
    ours = f"{REPOSITORY}/{recipe}:"
    for image in engine.images.list(name=f"{REPOSITORY}/{recipe}"):
        for tag in image.tags:
            if tag.startswith(ours) and build_running(tag) is False:
                untag(engine, tag)
                removed.append(tag)
    return removed
