"""verl's console, watched: one compact line per training step for the person at the terminal, verl's every
line kept in the run folder's log, and each step's metrics appended to its metrics file for `verlbox report`.

verl 0.4.1's console logger prints a step as `step:N - key:value - key:value ...` (some fifty pairs, Ray's
`(TaskRunner pid=...)` prefix and colour codes in front). The line shown instead answers the questions asked
at 3 a.m.: alive, how far, how fast, reward, response length, memory against the limit, when it ends.

A week unattended bounds what the watch holds: verl's output is read in chunks (a line has no bound of its own: one
of 200 MB took the supervisor to 1.4 GiB), a line is kept in verl.log up to LOG_LINE_BYTES and shown and parsed up to
SHOWN_LINE_BYTES, each cut marked, and a progress bar's carriage-return updates keep only their last one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import statistics
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from rich.text import Text

from verlbox.runtime.training import utilization
from verlbox.runtime.training.console import ConsoleGuard
from verlbox.runtime.training.overrides import override_int
from verlbox.runtime.training.run_record import now
from verlbox.runtime.training.save_watch import SaveWatch

LOG_FILE = "verl.log"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_FOLDER = "tensorboard"

ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\([^)]*\)\s*")
STEP_LINE = re.compile(r"^step:(\d+) - (.*)$")
TOTAL_LINE = re.compile(r"Total training steps: (\d+)")
# printed by verl as a save begins; its step's line follows once the save is written
SAVE_STARTS = "local_global_step_folder: "
# verl's own tqdm bar repeats what the compact line says, as carriage-return noise
TQDM_BAR = "Training Progress:"

STEP_SECONDS = "timing_s/step"
REWARD = "critic/score/mean"
RESPONSE_LENGTH = "response_length/mean"
MEMORY_RESERVED = "perf/max_memory_reserved_gb"
VALIDATION_REWARD = re.compile(r"^val-core/.+/reward/mean@\d+$")

CHUNK_BYTES = 64 * 1024
# kept whole in verl.log up to here: a traceback or a config dump fits, a runaway line does not fill the disk
LOG_LINE_BYTES = 1024 * 1024
# shown and parsed up to here: verl's step line is some 3 KiB, and a terminal has no use for more
SHOWN_LINE_BYTES = 64 * 1024
LINE_BREAK = re.compile(rb"[\r\n]")
# Ray's `(TaskRunner pid=...)` in its colours: a carriage return after it overwrites the text, not whose it is
RAY_HEAD = re.compile(rb"^(?:\x1b\[[0-9;]*m)*\([^)]*\)(?:\x1b\[[0-9;]*m)*\s*$")

Shown = TypeVar("Shown")


def plain(line: str) -> str:
    """LINE without colour codes and Ray's process prefix."""
    return RAY_PREFIX.sub("", ANSI_CODE.sub("", line)).strip()


def parse_step(line: str) -> tuple[int, dict[str, float]] | None:
    """A console step line's step and numeric metrics; None for any other line."""
    match = STEP_LINE.match(plain(line))
    if not match:
        return None
    metrics: dict[str, float] = {}
    for pair in match.group(2).split(" - "):
        key, colon, value = pair.partition(":")
        if not colon:
            continue
        try:
            metrics[key.strip()] = float(value)
        except ValueError:
            continue  # verl prints non-numbers as they are; the compact line and report need numbers
    return int(match.group(1)), metrics


def responses_per_step(overrides: list[str]) -> int:
    """What one step generates: its prompts (data.train_batch_size) times the answers to each (rollout.n)."""
    return override_int(overrides, "data.train_batch_size", 0) * override_int(
        overrides, "actor_rollout_ref.rollout.n", 1
    )


def validation_reward(metrics: dict[str, float]) -> float | None:
    return next((value for key, value in metrics.items() if VALIDATION_REWARD.match(key)), None)


def show_eta(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass
class Progress:
    """What the compact line needs beyond one step's metrics: the run's length, its batch, the memory limit."""

    samples_per_step: int  # responses per step: prompts x rollout.n
    memory_limit_gib: float | None  # the cap (--gpu-memory-gib) or the card's memory; None when unknown
    total_steps: int | None = None
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    # for the achieved fp32 rate: the model's shape, the GPUs training, the card (None: not shown)
    shape: utilization.ModelShape | None = None
    gpus: int = 1
    gpu_name: str | None = None
    epochs: dict[str, int] = field(default_factory=dict)  # the updates' ppo_epochs by model

    def with_utilization(self, metrics: dict[str, float]) -> dict[str, float]:
        """METRICS and the step's achieved fp32 TFLOP/s per GPU and share of the card's peak, where known."""
        if self.shape is None:
            return metrics
        return metrics | utilization.step_utilization(self.shape, metrics, self.gpus, self.gpu_name, self.epochs)

    def line(self, step: int, metrics: dict[str, float]) -> Text:
        seconds = metrics.get(STEP_SECONDS)
        if seconds:
            self.recent.append(seconds)
        text = Text(f"step {step}" + (f"/{self.total_steps}" if self.total_steps else ""), style="bold")
        if seconds:
            text.append(f"  {seconds:.1f} s/step  {self.samples_per_step / seconds:.2f} samples/s")
        if (achieved := utilization.describe(metrics)) is not None:
            text.append(f"  {achieved}")
        if (reward := metrics.get(REWARD)) is not None:
            text.append(f"  reward {reward:.3f}")
        if (validation := validation_reward(metrics)) is not None:
            text.append(f"  validation {validation:.3f}", style="cyan")
        if (length := metrics.get(RESPONSE_LENGTH)) is not None:
            text.append(f"  length {length:.0f}")
        if (reserved := metrics.get(MEMORY_RESERVED)) is not None:
            self._append_memory(text, reserved)
        if self.total_steps and self.recent and step < self.total_steps:
            # the median: a validation or save step is slow without the run having slowed down
            text.append(f"  ETA {show_eta((self.total_steps - step) * statistics.median(self.recent))}")
        elif self.total_steps and step >= self.total_steps:
            text.append("  last step")
        return text

    def _append_memory(self, text: Text, reserved: float) -> None:
        if self.memory_limit_gib is None:
            text.append(f"  memory {reserved:.1f} GiB")
            return
        share = reserved / self.memory_limit_gib
        style = "red" if share > 0.95 else "yellow" if share > 0.85 else ""
        text.append(f"  memory {reserved:.1f}/{self.memory_limit_gib:.0f} GiB", style=style)


class FileSink:
    """One file appended to line by line. A failed write (a full disk for a moment) is said once and tried
    again at the next line, so the file recovers with the disk; text resumes on a line of its own. Written from
    the reader and, for a note, from the supervisor's thread: one line is never split by another."""

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        self.path = path
        self.say = say
        self.failing = False
        self._handle: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            self._write(text)

    def _write(self, text: str) -> None:
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                cut = _ends_mid_line(self.path)  # a line a failure or a crash cut short: not glued onto
                self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open while it works
                if cut:
                    self._handle.write("\n")
            self._handle.write(text)
            self._handle.flush()
        except (OSError, ValueError) as exc:  # ValueError: closed meanwhile by a reader still draining
            self._close()
            if not self.failing:
                self.failing = True
                why = getattr(exc, "strerror", None) or exc
                self.say(f"verlbox: cannot write {self.path} ({why}); trying again at each line")
            return
        if self.failing:
            self.failing = False
            self.say(f"verlbox: writing {self.path} again")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None


def _ends_mid_line(path: Path) -> bool:
    with contextlib.suppress(OSError), path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    return False


@dataclass(frozen=True)
class Line:
    """One line of verl's: as much of it as is kept (LOG_LINE_BYTES), and how long it was."""

    kept: bytes
    length: int

    def logged(self) -> str:
        return _marked(self.kept, self.length)

    def shown(self) -> str:
        return _marked(self.kept[:SHOWN_LINE_BYTES], self.length)


def _marked(kept: bytes, length: int) -> str:
    text = kept.decode("utf-8", errors="replace")
    # glued on, with no " - ": the last pair of a cut step line must not parse as a number
    return text if len(kept) == length else f"{text}[verlbox: cut, the line has {length} bytes]"


class Lines:
    """verl's output, chunk by chunk, into bounded lines. A carriage return overwrites the line on a terminal
    (tqdm's bars, 200,000 updates of one made a 12 MB line): only its last segment is kept, behind Ray's prefix
    where the line has one. Past LOG_LINE_BYTES a line is counted, not kept."""

    def __init__(self) -> None:
        self._head = b""  # Ray's prefix, kept over the overwrites
        self._text = bytearray()
        self._length = 0
        self._returned = False  # a carriage return came: the next text, not a newline, starts the segment anew

    def feed(self, chunk: bytes) -> Iterator[Line]:
        start = 0
        for match in LINE_BREAK.finditer(chunk):
            self._add(chunk[start : match.start()])
            start = match.end()
            if match.group() == b"\n":
                yield self._end()
            else:
                self._carriage_return()
        self._add(chunk[start:])

    def rest(self) -> Iterator[Line]:
        """The text after the last newline, once the output has ended."""
        if self._head or self._length:
            yield self._end()

    def _add(self, data: bytes) -> None:
        if not data:
            return
        if self._returned:
            self._returned = False
            self._text.clear()
            self._length = 0
        self._text += data[: LOG_LINE_BYTES - len(self._text)]
        self._length += len(data)

    def _carriage_return(self) -> None:
        if not self._head and not self._returned and RAY_HEAD.match(self._text):
            self._head = bytes(self._text)
            self._text.clear()
            self._length = 0
        self._returned = True

    def _end(self) -> Line:
        line = Line(self._head + self._text, len(self._head) + self._length)
        self._head, self._length, self._returned = b"", 0, False
        self._text.clear()
        return line


class RunWatch:
    """Takes verl's output line by line: everything to FOLDER/verl.log, steps to FOLDER/metrics.jsonl and the
    compact line to SHOW, other lines to SHOW as they are (a warning or a traceback is seen where it happens).

    Three things fail apart, and none stops the others: the files (each said once, retried at each line and
    each attempt), the console (CONSOLE: a closed or failing stderr, noted in verl.log; the lines still reach the
    files), and the reading itself, which always drains verl's pipe (verl blocks on a full one). Save detection
    needs none."""

    def __init__(
        self,
        folder: Path | None,
        progress: Progress,
        show: Callable[[Text | str], None],
        saves: SaveWatch | None = None,
        guard: ConsoleGuard | None = None,
    ) -> None:
        """FOLDER None: plain (VERLBOX_PROGRESS=plain): verl's lines shown as they are, no files, and the
        save still seen, so that a stop during a save is still held. SAVES: the checkpoint folder, which says
        when a save began (before verl's line arrives) and when it is written, whatever verl's loggers print."""
        self.folder = folder
        self.progress = progress
        self.show = show
        self._saving = threading.Event()
        self._saves = saves
        self._saving_into: Path | None = None
        self._attempt = 0
        self._log = FileSink(folder / LOG_FILE, self._say) if folder else None
        self._metrics = FileSink(folder / METRICS_FILE, self._say) if folder else None
        # one guard for the console from train's first line: a console that died before verl started is still news
        self.console = guard or ConsoleGuard()
        self.console.kept_in = f"; verl's lines are in {folder / LOG_FILE}" if folder else ""

    @property
    def saving(self) -> bool:
        """verl is writing a checkpoint: a step folder is being written on disk, or verl's line said a save began
        and neither is it written (the tracker names it, its files are whole) nor has its step's line come."""
        return self.saving_into is not None

    @property
    def saving_into(self) -> Path | None:
        """The step folder verl is writing, as far as the disk and the console tell; None: no save under way."""
        if self._saves is not None and (under_way := self._saves.under_way()) is not None:
            return under_way
        if not self._saving.is_set():
            return None
        into = self._saving_into
        if into is not None and self._saves is not None and self._saves.written(into):
            self._saving.clear()
            return None
        return into

    @property
    def console_failed(self) -> str | None:
        """Why the console stopped taking lines, once it has."""
        return self.console.failed

    def follow(self, stream: io.BufferedIOBase) -> threading.Thread:
        """Read STREAM (verl's stdout and stderr) to its end in a thread of its own."""
        self._attempt += 1
        self._saving.clear()
        if self._saves is not None:
            self._saves.mark()
        reader = threading.Thread(target=self._read, args=(stream, self._attempt), daemon=True, name="verl-output")
        reader.start()
        return reader

    def _say(self, text: Text | str) -> None:
        self.console.write(self.show, text)

    def note_console(self) -> None:
        """A failed console, once, in verl.log: called by the supervisor as it watches verl, so that verl.log
        says when the console stopped showing its lines."""
        if (news := self.console.news()) and self._log:
            self._log.write(f"# verlbox: {news}\n")

    def _read(self, stream: io.BufferedIOBase, attempt: int) -> None:
        if self._log:
            self._log.write(f"# verlbox: verl attempt {attempt} started {now()}\n")
        lines = Lines()
        # read1: what the pipe holds now, at most a chunk; a line's end is never waited for whole
        while chunk := stream.read1(CHUNK_BYTES):
            self._take_all(lines.feed(chunk), attempt)
        self._take_all(lines.rest(), attempt)
        for sink in (self._log, self._metrics):
            if sink:
                sink.close()
        stream.close()

    def _take_all(self, lines: Iterable[Line], attempt: int) -> None:
        for line in lines:
            if self._log:
                self._log.write(line.logged() + "\n")
            shown = line.shown()
            try:
                self.take(shown, attempt)
            except Exception as exc:  # a line verlbox misreads is still shown, and the reading goes on
                self._say(f"verlbox: could not read a line of verl's ({type(exc).__name__}: {exc})")
                self._say(shown)

    def take(self, line: str, attempt: int) -> None:
        if self._metrics is None:  # plain: the save marker is all that is read
            if (text := plain(line)).startswith(SAVE_STARTS):
                self._save_began(text)
            elif parse_step(line) is not None:
                self._saving.clear()
            self._say(line)
            return
        parsed = parse_step(line)
        if parsed is not None:
            self._saving.clear()
            step, metrics = parsed[0], self.progress.with_utilization(parsed[1])
            self._record(step, metrics, attempt)
            self._say(self.progress.line(step, metrics))
            return
        text = plain(line)
        if total := TOTAL_LINE.search(text):
            self.progress.total_steps = int(total.group(1))
        if text.startswith(SAVE_STARTS):
            self._save_began(text)
        if TQDM_BAR not in text:
            self._say(line)

    def _save_began(self, text: str) -> None:
        # verl names the folder as it joins it, relative to its working directory, which is train's
        self._saving_into = Path(text.removeprefix(SAVE_STARTS).strip()).absolute()
        self._saving.set()

    def _record(self, step: int, metrics: dict[str, float], attempt: int) -> None:
        entry = {"step": step, "at": now(), "attempt": attempt, "metrics": metrics}
        if self._metrics:
            self._metrics.write(json.dumps(entry) + "\n")


@dataclass(frozen=True)
class StepRecord:
    step: int
    at: str
    attempt: int
    metrics: dict[str, float]


def read_metrics(path: Path) -> list[StepRecord]:
    """A metrics file's steps; a line cut short by a crash (the last one, say) is skipped, not fatal."""
    return list(_entries(path.read_text(encoding="utf-8").splitlines()))


def _entries(lines: Iterable[str]) -> Iterable[StepRecord]:
    for line in lines:
        try:
            entry = json.loads(line)
            yield StepRecord(int(entry["step"]), str(entry["at"]), int(entry["attempt"]), dict(entry["metrics"]))
        except (ValueError, KeyError, TypeError):
            continue
