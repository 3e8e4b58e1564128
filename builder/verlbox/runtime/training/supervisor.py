"""verl under watch: a crash restarts it (it resumes from its newest checkpoint) for as long as the run makes
progress; a crash loop stops with its reason.

Docker's `restart: on-failure:N` counts failures over the container's whole life, so three crashes spread
over a week ended a run, and a preflight failure spent the same budget looping into the same error. Here the
container's process stays up while verl restarts, so Docker restarts only what died with the machine (a
reboot, a daemon restart). A run that cannot go on halts: under compose (VERLBOX_ON_HALT=wait) it holds, its
reason in the log and in HALT_FILE for the healthcheck, instead of exiting into Docker's restart.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import FrameType

from verlbox.errors import RunHalted, UsageError
from verlbox.runtime.training.console import ConsoleGuard
from verlbox.runtime.training.environment import number, setting
from verlbox.runtime.training.progress import RunWatch

# compose's healthcheck looks for it: a halted run shows as unhealthy in `docker compose ps`
HALT_FILE = Path("/tmp/verlbox-halted")
ON_HALT = "VERLBOX_ON_HALT"
POLL_S = 0.1  # how soon a stop is acted on
RETRY_S = 60.0  # a held run tries a record the full disk kept from being written again this often
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# in the environment of verl and all it starts: what is still running after it has ended is found by it
ATTEMPT_MARKER = "VERLBOX_ATTEMPT"
TEMP_ROOM_BYTES = 2 * 2**30  # below this, Ray's logs and spilled objects of the next attempt may not fit


@dataclass(frozen=True)
class RestartPolicy:
    """FAILURES failures within WINDOW_S seconds is a crash loop, and so is FAILURES failures in a row that
    left no newer checkpoint (each attempt dies before its first save: restarting only repeats it). Restarts
    back off (DELAY_S, doubled after each failure in a row that saved nothing, up to MAX_DELAY_S), and a crash
    loop is tried again after HALT_RETRY_S (0: never): an outage of minutes (NFS away, a GPU reset) must not end a
    week's run for good."""

    failures: int = 3
    window_s: float = 900.0
    delay_s: float = 30.0  # before a restart: GPU memory of the dead processes is freed, a shared folder settles
    max_delay_s: float = 600.0
    halt_retry_s: float = 1800.0
    # a stop that comes while verl writes a checkpoint waits this long for it (compose's stop_grace_period is longer)
    save_grace_s: float = 240.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RestartPolicy:
        return cls(
            failures=int(number(environ, "VERLBOX_RESTART_FAILURES", cls.failures, minimum=1, whole=True)),
            window_s=number(environ, "VERLBOX_RESTART_WINDOW_S", cls.window_s, minimum=0),
            delay_s=number(environ, "VERLBOX_RESTART_DELAY_S", cls.delay_s, minimum=0),
            max_delay_s=number(environ, "VERLBOX_RESTART_DELAY_MAX_S", cls.max_delay_s, minimum=0),
            halt_retry_s=number(environ, "VERLBOX_HALT_RETRY_S", cls.halt_retry_s, minimum=0),
            save_grace_s=number(environ, "VERLBOX_SAVE_GRACE_S", cls.save_grace_s, minimum=0),
        )

    def halt_reason(self, attempts: Sequence[Attempt]) -> str | None:
        """Why the run stops after these failed attempts (oldest first); None: restart it."""
        last = attempts[-1]
        recent = [a for a in attempts if a.ended_at >= last.ended_at - self.window_s]
        if len(recent) >= self.failures:
            return f"{len(recent)} failures within {show_duration(self.window_s)}: a crash loop"
        tail = attempts[-self.failures :]
        if len(tail) == self.failures and not any(a.progressed for a in tail):
            return f"{self.failures} failures in a row, none after a new checkpoint: every restart dies before saving"
        return None

    def delay(self, attempts: Sequence[Attempt]) -> float:
        """How long to wait before the next restart: doubled for each failure in a row that saved nothing."""
        in_a_row = 0
        for attempt in reversed(attempts):
            if attempt.progressed:
                break
            in_a_row += 1
        return min(self.delay_s * 2 ** min(max(in_a_row - 1, 0), 30), max(self.max_delay_s, self.delay_s))


@dataclass(frozen=True)
class Attempt:
    """One failed run of verl."""

    exit_code: int
    ran_s: float
    ended_at: float
    progressed: bool  # a newer complete checkpoint than the one it started from


def show_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class StopRequest:
    """The signals that stop the run (docker stop's SIGTERM, Ctrl-C), passed on to verl's process group, except
    while verl writes a checkpoint (HOLDS_OFF): then none reaches verl, however many come (a second `docker compose
    stop`, `down`), until the save is on disk or the grace has passed. Outside a save, a second one kills the
    group at once.

    The handler only records the signal: deciding reads the disk (a slow one, an NFS server away), and a handler
    that did so could be entered again by a second signal before it had decided, or block the process on a lock
    it holds itself. The supervisor's loop decides, every POLL_S."""

    def __init__(self, holds_off: Callable[[], bool] = lambda: False) -> None:
        self.signal: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.held_since: float | None = None  # a stop kept from verl while HOLDS_OFF said so (a save running)
        self.repeated = 0  # stops that came again while one was held
        self._holds_off = holds_off
        self._received: list[int] = []  # appended by the handler only: no lock, nothing else
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._received.append(signum)

    def decide(self) -> None:
        """Act on the signals received since the last call, in order."""
        while self._received:
            signum = self._received.pop(0)
            if self.held_since is not None:  # the save goes on: this stop waits with the first
                self.repeated += 1
            elif self.signal is not None:
                self._send(signal.SIGKILL)
            else:
                self.signal = signum
                running = self.child is not None and self.child.poll() is None
                if running and self._holds_off():
                    self.held_since = time.monotonic()
                else:
                    self._send(signum)

    def _send(self, signum: int) -> None:
        self.held_since = None
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group has ended already
                os.killpg(self.child.pid, signum)

    def started(self, child: subprocess.Popen[bytes]) -> None:
        """CHILD is the one to stop; a signal that came while it was being started is passed on at the next
        decision."""
        self.child = child

    def release(self, grace_s: float) -> bool:
        """Pass a held stop on once verl's save is written, or once GRACE_S seconds have gone by; True: the grace
        ran out with the save still under way."""
        if self.held_since is None or self.signal is None:
            return False
        if not self._holds_off():
            self._send(self.signal)
            return False
        if time.monotonic() - self.held_since > grace_s:
            self._send(self.signal)
            return True
        return False

    def wait(self, seconds: float) -> bool:
        """Sleep up to SECONDS; True when a stop signal came."""
        deadline = time.monotonic() + seconds
        while True:
            self.decide()
            if self.signal is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))

    @property
    def exit_code(self) -> int:
        return 128 + (self.signal or 0)


def supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    policy: RestartPolicy,
    *,
    newest_step: Callable[[], int | None],
    before_restart: Callable[[str, int | None], None],
    say: Callable[[str], None],
    watch: RunWatch | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run COMMAND until it succeeds (0), is stopped by a signal (128 + the signal), or halts (RunHalted).
    With WATCH, verl's output goes through it, and a stop that comes during a save waits for the save. What
    is said goes through the watch's console guard: a dead console neither ends the run nor stops a restart."""
    console = watch.console if watch else ConsoleGuard()
    try:
        return _supervise(command, env, policy, newest_step, before_restart, console.guarding(say), watch, clock)
    finally:
        if watch:
            watch.note_console()
        console.tell_at_end()


def _supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    policy: RestartPolicy,
    newest_step: Callable[[], int | None],
    before_restart: Callable[[str, int | None], None],
    say: Callable[[str], None],
    watch: RunWatch | None,
    clock: Callable[[], float],
) -> int:
    attempts: list[Attempt] = []
    sessions = RaySessions(env)
    with StopRequest(holds_off=lambda: watch is not None and watch.saving) as stop:
        while True:
            stop.decide()
            if stop.signal is not None:  # asked to stop while the last attempt was being cleaned up after
                return stop.exit_code
            started_from = newest_step()
            started = clock()
            code = run_attempt(command, env, stop, policy.save_grace_s, watch, say, sessions)
            if code == 0:
                return 0
            stop.decide()
            if stop.signal is not None:
                say(f"verl stopped ({describe_exit(code)}) on {signal.Signals(stop.signal).name}")
                return stop.exit_code
            saved = newest_step()
            ended = clock()
            attempts.append(Attempt(code, ended - started, ended, saved is not None and saved != started_from))
            where = f"global_step_{saved}" if saved is not None else "the start (no complete checkpoint)"
            reason = policy.halt_reason(attempts)
            if reason:
                raise RunHalted(
                    f"verl failed ({describe_exit(code)} after {show_duration(ended - started)}); {reason}, so it is "
                    f"not restarted: the cause is in the lines above. Fixed, the next start resumes from {where}"
                )
            delay = policy.delay(attempts)
            say(
                f"verl failed ({describe_exit(code)} after {show_duration(ended - started)}); restart "
                f"{len(attempts)} in {show_duration(delay)}, resuming from {where}"
            )
            if stop.wait(delay):
                return stop.exit_code
            before_restart(describe_exit(code), saved)


def run_attempt(
    command: Sequence[str],
    env: Mapping[str, str],
    stop: StopRequest,
    save_grace_s: float,
    watch: RunWatch | None,
    say: Callable[[str], None],
    sessions: RaySessions,
) -> int:
    """One run of verl, in a process group of its own (a stop reaches what it started, not only the driver),
    and marked: whatever it leaves behind (Ray's processes, a worker that left the group) is ended after it."""
    sessions.attempt_starts()
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if watch else {}
    child_env = dict(env) | {ATTEMPT_MARKER: marker} | ({"PYTHONUNBUFFERED": "1"} if watch else {})
    child = subprocess.Popen(list(command), env=child_env, start_new_session=True, **output)  # type: ignore[call-overload]
    stop.started(child)
    reader = watch.follow(child.stdout) if watch and child.stdout else None
    told, repeated, polls = False, 0, 0
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            stop.decide()
            polls += 1
            if polls % 5 == 0:  # every half second: what does not need to be prompt
                reap_orphans(keep=child.pid)
                if watch:
                    watch.note_console()
            if stop.held_since is not None and not told:
                say(f"stopping once verl has written the checkpoint it is saving (at most {save_grace_s:.0f} s)")
                told = True
            if stop.held_since is not None and stop.repeated > repeated:
                repeated = stop.repeated
                waited = time.monotonic() - stop.held_since
                say(f"another stop: still holding for the save ({max(save_grace_s - waited, 0):.0f} s of grace left)")
            if stop.release(save_grace_s):
                say(
                    f"the checkpoint was not written within {save_grace_s:.0f} s: stopping verl anyway (the next "
                    "start resumes from the newest whole save)"
                )
    left = end_leftovers(marker)
    if left:
        say(f"ended {left} process(es) verl left running")
    sessions.attempt_ended(say)
    if reader:
        reader.join(timeout=5)  # its end of the pipe is closed once the last holder has gone
    return code


class RaySessions:
    """The session folders Ray makes for this train's attempts (logs, sockets, spilled objects): a week of restarts
    piled them up in /tmp. After each attempt those of the attempts before it go; the last attempt's stay for its
    logs. Folders this train did not see appear (another experiment's Ray in the same container) are left alone."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        # where Ray puts them: $RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray (ray._private.utils)
        self.root = Path(environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp") / "ray"
        self._before: set[Path] = set()
        self._last: list[Path] = []

    def _present(self) -> set[Path]:
        try:
            return set(self.root.glob("session_2*"))
        except OSError:
            return set()

    def attempt_starts(self) -> None:
        self._before = self._present()

    def attempt_ended(self, say: Callable[[str], None]) -> None:
        """Remove the sessions of the attempts before this one, and say when their folder is short of room."""
        for stale in self._last:
            shutil.rmtree(stale, ignore_errors=True)
        self._last = sorted(self._present() - self._before)
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(self.root if self.root.exists() else self.root.parent).free
            if free < TEMP_ROOM_BYTES:
                say(f"note: {self.root} has {free / 2**30:.1f} GiB free: the next Ray session (its logs) may not fit")


def processes_marked(marker: str) -> list[int]:
    """The processes whose environment carries MARKER (as a CI server finds a job's processes): those started
    under verl keep it, whichever group or parent they have by now."""
    wanted = f"{ATTEMPT_MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if wanted in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def end_leftovers(marker: str, grace_s: float = 10.0) -> int:
    """End every process marked MARKER: SIGTERM, then SIGKILL for those still there after GRACE_S seconds."""
    first = processes_marked(marker)
    for pid in first:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (remaining := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    # what was killed here and had become this process's child (as PID 1) is collected once it has died
    deadline = time.monotonic() + 5.0
    while (children := children_of(os.getpid())) and any(children.get(pid, "Z") != "Z" for pid in remaining):
        if time.monotonic() > deadline:  # one stuck in the kernel (D state): collected after a later attempt
            break
        time.sleep(0.05)
    reap_orphans()
    return len(first)


def reap_orphans(keep: int | None = None) -> None:
    """Collect this process's exited children other than KEEP (verl itself, which Popen waits for). As a
    container's PID 1 (`docker run` without --init) every orphan of the container becomes its child, and
    an exited one stays a zombie until collected. (`train` starts no other child while verl runs: one it
    did would lose its exit status here.)"""
    for pid, state in children_of(os.getpid()).items():
        if state == "Z" and pid != keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def children_of(parent: int) -> dict[int, str]:
    """PARENT's children with their state ("Z": exited and not yet collected), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:  # the fields after the command name, which may itself hold spaces or parentheses
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # not a process, or gone
            continue
        if fields[1] == str(parent):
            found[int(entry.name)] = fields[0]
    return found


def holds(environ: Mapping[str, str], on_halt: str | None = None) -> bool:
    """Whether a halt waits: ON_HALT as `train --on-halt` gives it (compose's train service says wait in its
    command, so one-off commands on the same service exit), else VERLBOX_ON_HALT, which run folders made
    before the flag set in compose's environment."""
    value = on_halt or environ.get(ON_HALT, "exit")
    if value not in ("exit", "wait"):
        raise UsageError(
            f"{setting(environ, ON_HALT, value)}: expected exit (the default) or wait (compose: no restart into it)"
        )
    return value == "wait"


def clear_halt() -> None:
    HALT_FILE.unlink(missing_ok=True)


def hold(
    exit_code: int,
    reason: str,
    say: Callable[[str], None],
    retry: Callable[[], bool] | None = None,
    run_again_after_s: float | None = None,
) -> int | None:
    """Stay up with the reason on record until stopped, then exit with EXIT_CODE: an exit would have Docker
    restart the container into the same failure. RETRY (a record the full disk kept from being written) is
    tried every RETRY_S seconds until it says it is done: room freed during the hold lets it land. With
    RUN_AGAIN_AFTER_S (a crash loop) the hold ends by itself after that long, said in HALT_FILE: None, run again."""
    say = ConsoleGuard().guarding(say)  # a dead console must not end the hold: the reason is in HALT_FILE
    again_at = time.monotonic() + run_again_after_s if run_again_after_s else None
    record = reason + "\n"
    if run_again_after_s:
        at = datetime.now(timezone.utc) + timedelta(seconds=run_again_after_s)
        record += (
            f"tried again on its own at {at.isoformat(timespec='seconds')} ({show_duration(run_again_after_s)} after "
            "the halt: VERLBOX_HALT_RETRY_S)\n"
        )
    try:
        HALT_FILE.write_text(record)
    except OSError as exc:
        say(f"halted; cannot write {HALT_FILE} for the healthcheck ({exc.strerror or exc})")
    again = f"tried again on its own in {show_duration(run_again_after_s)}; " if run_again_after_s else ""
    say(
        f"halted: holding here (no restart into the same failure); {again}after fixing it: "
        "`docker compose up -d --force-recreate train`, or stop with `docker compose down`"
    )
    with StopRequest() as stop:
        while True:
            wait_s = RETRY_S if retry else 3600.0
            if again_at is not None:
                wait_s = min(wait_s, max(again_at - time.monotonic(), 0.0))
            if stop.wait(wait_s):
                return exit_code
            if retry is not None and retry():
                retry = None
            if again_at is not None and time.monotonic() >= again_at:
                return None
