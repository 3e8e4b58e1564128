"""The person's console while `train` runs: it may fail (a terminal closed, a reader gone, a full disk under a
redirect) or block (an attached `docker compose up` whose terminal stalls, Ctrl-S, `train | less`), and neither may
end, stall or slow the run.

A failure gives the console up for the run. A block is outlasted: once verl runs, every line goes to the console
from a thread of its own (`start_relay`), through a bounded queue; lines that do not fit are dropped and counted,
and the count is said once the console takes lines again. Neither verl's reader (verl would block on a full pipe),
the supervisor (its restarts and held stops) nor a hold ever waits on the console. As verl's run ends, `settle` gives
the console a few seconds to take what is queued; one still blocked then is left behind: every later line goes to
the queue, and commands.train exits without Python's own flush of it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from rich.console import Console

from verlbox.runtime.training.run_record import now

Shown = TypeVar("Shown")
# lines waiting for a console that does not take them: a few screens, so a short stall loses nothing
QUEUE_LINES = 2000
SETTLE_S = 5.0
DROPPED_KEPT = " (verl.log keeps verl's)"


class _Relay:
    """Lines to the console, written in order from one thread; what does not fit the queue is counted, not kept."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[[object], None], object]] = deque()
        self._changed = threading.Condition()
        self._busy = False
        self._closing = False
        self.delivered = 0
        self.dropped = 0  # since the console last took a line
        self.blocked_since: str | None = None  # when lines were first dropped, until the console takes one again
        threading.Thread(target=self._run, daemon=True, name="console").start()

    def put(self, deliver: Callable[[object], None], text: object) -> bool:
        """Queue TEXT (or count it, the queue full); False: the relay has closed, the caller writes it itself."""
        with self._changed:
            if self._closing:
                return False
            if len(self._queue) >= QUEUE_LINES:
                self.dropped += 1
                self.blocked_since = self.blocked_since or now()
                return True
            self._queue.append((deliver, text))
            self._changed.notify_all()
            return True

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queue) or self._closing)
                if not self._queue:
                    return
                deliver, text = self._queue.popleft()
                dropped, self.dropped, self.blocked_since = self.dropped, 0, None
                self._busy = True
            if dropped:
                _write_stderr(f"verlbox: {dropped} line(s) not shown: the console was not taking them{DROPPED_KEPT}\n")
            deliver(text)
            with self._changed:
                self._busy = False
                self.delivered += 1
                self._changed.notify_all()

    def settle(self, timeout_s: float) -> bool:
        """Wait for every queued line to be written, as long as the console takes one every TIMEOUT_S (a slow link
        still gets the run's last lines); False: it took none for TIMEOUT_S, it blocks."""
        with self._changed:
            while self._queue or self._busy:
                seen = self.delivered
                if not self._changed.wait_for(
                    lambda seen=seen: self.delivered != seen or not (self._queue or self._busy), timeout_s
                ):
                    return False
            return True

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()


_relay: _Relay | None = None
_relay_lock = threading.Lock()


def start_relay() -> None:
    """From here on, every guarded line reaches the console from the relay's thread (idempotent)."""
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = _Relay()


def settle(timeout_s: float = SETTLE_S) -> bool:
    """True once every line said so far has reached the console (or failed to): lines are written directly again.
    False after TIMEOUT_S with the console still blocked: the relay stays, so that nothing said later waits on the
    console, and the process must end without writing to it again."""
    global _relay
    with _relay_lock:
        if _relay is None:
            return True
        if not _relay.settle(timeout_s):
            return False
        _relay.close()
        _relay = None
        return True


class ConsoleGuard:
    """The console as one speaker uses it (the reader's lines, the supervisor's, a hold's). Its first failure (EIO,
    a full disk under a redirect, a reader gone from the pipe, which rich turns into SystemExit(1)) gives it up for
    the run: nothing it does may end the reader or the supervisor. The failure is news once, for the run's files,
    and said again as the run ends; so is a console that blocked."""

    def __init__(self, kept_in: str = "") -> None:
        self.failed: str | None = None
        self.failed_at = ""
        self.kept_in = kept_in  # where verl's lines still go, once a run watch takes them
        self._told = False
        self._told_blocked: str | None = None
        self._lock = threading.Lock()

    @property
    def failure(self) -> str:
        """The sentence that says it."""
        return f"the console failed at {self.failed_at} ({self.failed}) and was not written to again{self.kept_in}"

    def write(self, show: Callable[[Shown], None], text: Shown) -> None:
        if self.failed is not None:
            return
        relay = _relay  # read once: settle() may let it go meanwhile, from another thread
        if relay is None or not relay.put(lambda line: self._deliver(show, line), text):  # type: ignore[arg-type]
            self._deliver(show, text)

    def _deliver(self, show: Callable[[Shown], None], text: Shown) -> None:
        if self.failed is not None:
            return
        try:
            show(text)
        except (Exception, SystemExit) as exc:
            self._fail(exc)

    def guarding(self, show: Callable[[str], None]) -> Callable[[str], None]:
        return lambda text: self.write(show, text)

    def _fail(self, exc: BaseException) -> None:
        # rich raises SystemExit from within its `except BrokenPipeError`: that error is the news
        cause = exc.__context__ if isinstance(exc, SystemExit) and exc.__context__ else exc
        with self._lock:  # the reader and the supervisor may find it dead at once
            if self.failed is None:
                self.failed, self.failed_at = f"{type(cause).__name__}: {cause}", now()

    def news(self) -> str | None:
        """The failure, the first time it is asked for once there is one; else a console that stopped taking lines,
        once each time it does."""
        with self._lock:
            if self.failed is not None:
                if self._told:
                    return None
                self._told = True
                return self.failure
            relay = _relay
            blocked = relay.blocked_since if relay is not None else None
            if blocked is None or blocked == self._told_blocked:
                return None
            self._told_blocked = blocked
            return f"the console stopped taking lines at {blocked}; lines for it are dropped until it takes them again"

    def tell_at_end(self) -> None:
        """The failure said again as the run ends, on stderr: the console may be back (a terminal, a disk with room
        again) or was not stderr, and rich stays quiet for good after a broken pipe. Through the relay once it runs:
        a console that blocks must not hold the end."""
        if self.failed is None:
            return
        line = f"verlbox: {self.failure}\n"
        relay = _relay
        if relay is None or not relay.put(_write_stderr, line):
            _write_stderr(line)


def _write_stderr(text: object) -> None:
    with contextlib.suppress(Exception):  # still dead: the run's files have it
        sys.stderr.write(str(text))
        sys.stderr.flush()


class GuardedConsole:
    """A rich Console whose print a dead console cannot turn into an exit (rich's SystemExit on a broken pipe, an
    EIO): from the first line `train` says, before the run watch takes over the console."""

    def __init__(self, console: Console, guard: ConsoleGuard | None = None) -> None:
        self._console = console
        self.guard = guard or ConsoleGuard()

    def print(self, *objects: object, **options: object) -> None:
        self.guard.write(lambda _: self._console.print(*objects, **options), "")

    def __getattr__(self, name: str) -> object:  # status, file, width: the console's own
        return getattr(self._console, name)
