"""`python -m verlbox.host.runs.reaper PID CONTAINER PROJECT [NETWORK...]`: once process PID (the `verlbox shell`
that started a one-off container) has ended, remove CONTAINER and the networks of PROJECT made for it (those not
in NETWORK...), unless a container of the project still uses them.

verlbox shell cleans up itself when it can; this covers the way it cannot: killed (SIGKILL, the OOM killer),
its compose client left behind with the container running. verlbox shell ends it (SIGTERM) after its own
cleanup, so it acts only on an unclean end.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5


def alive(pid: int) -> bool:
    """PID runs: a zombie (ended, its parent not yet told) has gone, though it still answers signals."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False
    try:  # no /proc (not Linux): ask with a signal
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: someone else's process under a reused number
        return False
    return True


def main(argv: list[str]) -> int:
    parent, container, project, *networks_before = argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the shell cleaned up itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the shell
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the terminal closing is why it has to stay
    while alive(int(parent)):
        time.sleep(POLL_S)
    from verlbox.host.clients.engine import client
    from verlbox.host.runs.shell import remove_one_off

    remove_one_off(client(), container, project, set(networks_before))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
