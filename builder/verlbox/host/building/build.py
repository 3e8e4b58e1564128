"""Build an image with BuildKit (`docker buildx build`), streaming its steps, tagging only on success."""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.status import Status
from rich.text import Text

from verlbox.errors import BuildError, VerlboxError
from verlbox.host.building.clamp import clamp_image
from verlbox.host.building.context import OfflineRepository, write_context
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.sources import BuildSources
from verlbox.host.building.staging import remove_dead_builds_tags, staging_tag
from verlbox.host.clients.engine import client, image_exists, require_cli, retag, untag
from verlbox.host.clients.reference import ImageReference, parse_tag

_STEP_START = re.compile(r"^#(\d+) (\[.+|exporting.+|naming.+|writing.+|unpacking.+)$")
# what a step line shows: its instruction without mount flags and the CA-trust preamble
_NOISE = re.compile(r"--mount=\S+\s*|bash /tmp/verlbox/steps/(?=steps\.sh)")
_STEP_END = re.compile(r"^#(\d+) (DONE [0-9.]+s|CACHED|ERROR.*|CANCELED)$")
_STEP_ERROR = re.compile(r"^#(\d+) ERROR: ")
_ECHOED_COMMAND = re.compile(r'process ".*" did not complete successfully')
# BuildKit's running count of an export (a bundle's files, an image's layers)
_STEP_PROGRESS = re.compile(r"^#(\d+) ((?:copying files|sending tarball|transferring|writing layer) .+)$")
# a running step's own output: `#ID SECONDS-SINCE-THE-STEP-STARTED TEXT`
_STEP_OUTPUT = re.compile(r"^#(\d+) ([0-9.]+) (.*)$")
# what the installers and compilers print that can be counted: pip's and uv's downloads with their sizes, apt's
# archives (`Get:N ... [SIZE]`) and the packages it sets up, ninja's `[DONE/TOTAL]` and a compiler run per file
_DOWNLOAD = re.compile(r"^\s*Downloading \S+ \(([0-9.]+) ?([kMG]i?B|B)\)")
_APT_GET = re.compile(r"^Get:\d+ .* \[([0-9.]+) ([kMG]?B)\]$")
_APT_SET_UP = re.compile(r"^Setting up \S+ \(")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\] ")
_COMPILER_RUN = re.compile(r"^\S*(?:gcc|g\+\+|c\+\+|nvcc)\s.*\s-c\s+\S+\.(?:c|cc|cpp|cu)\b")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
# in a pipe (no status line), a running step says how far it has got at most this often
PIPE_EVERY_S = 60.0
# buildx's last word when Ctrl-C stopped it before verlbox saw the interrupt itself (a failed step also cancels
# the steps beside it, but then the last word is that step's error)
_CANCELED = re.compile(r"^ERROR: failed to solve: (?:Canceled: )?context canceled\s*$", re.MULTILINE)


def failure_excerpt(log: str, lines: int = 15) -> str:
    """What the failed step itself printed last (an installer's message naming the package) and its
    ERROR line, with BuildKit's echo of the whole instruction cut out; the log's last lines when no
    step failed."""
    every_line = log.splitlines(keepends=True)
    errors = [line for line in every_line if _STEP_ERROR.match(line)]
    if not errors:
        return "".join(every_line[-lines:])
    error = errors[-1]
    prefix = error.split(" ", 1)[0] + " "
    printed = [line for line in every_line if line.startswith(prefix) and not _STEP_ERROR.match(line)][-(lines - 1) :]
    return "".join(printed) + _ECHOED_COMMAND.sub("its command did not complete successfully", error)


# BuildKit's words when the registry of a FROM cannot be reached: a name that does not resolve, a refused or
# timed-out connection, while it resolves the base's metadata
_UNREACHABLE = re.compile(
    r"failed to (?:resolve source metadata|do request).*?"
    r"(?:lookup (?P<lookup>[^\s:]+)|dial tcp (?P<dial>\[[^\]]+\]|[^\s:]+))"
)


def canceled(log: str) -> bool:
    """Whether buildx ended because it was interrupted, not because a step failed."""
    errors = [line for line in log.splitlines() if line.startswith("ERROR: ")]
    return bool(errors) and _CANCELED.match(errors[-1]) is not None


def unreachable_registry(log: str) -> str | None:
    """The registry host a build's base could not be fetched from, when that is why it failed."""
    if found := _UNREACHABLE.search(log):
        return found["lookup"] or found["dial"]
    return None


def _without_a_registry(plan: BuildPlan) -> str:
    """How to build PLAN where its base's registry cannot be reached: --bootstrap-base where the recipe says how
    (and whether its base is already on the engine), else a copy of the base loaded or a mirror's."""
    bootstrap = plan.recipe.base.bootstrap
    if bootstrap is None:
        return f"`docker load` a saved {plan.base_image}, or name a mirror's copy with --base-image REF"
    try:
        present = image_exists(client(), bootstrap.reference)
    except VerlboxError:
        present = False
    return "build with --bootstrap-base" + (
        f" ({bootstrap.reference}, the base it makes, is already on this engine)" if present else ""
    )


@dataclass
class StepTiming:
    name: str
    seconds: float | None = None
    cached: bool = False


@dataclass
class BuildResult:
    image_id: str
    tags: list[str]
    seconds: float
    steps: list[StepTiming] = field(default_factory=list)


def default_tag(plan: BuildPlan) -> str:
    return f"verlbox/{plan.recipe.name}:{plan.verlbox_version}"


def check_tags(tags: list[str]) -> list[ImageReference]:
    """Every tag parsed before the build starts: a bad one costs nothing and leaves nothing behind."""
    return [parse_tag(tag) for tag in tags]


def log_directory() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "verlbox" / "build-logs"


@dataclass
class StepCounts:
    """What a running step's output lets one count: downloads and their bytes, Debian packages set up, units
    compiled (ninja's own DONE/TOTAL, or one compiler run a file)."""

    downloads: int = 0
    download_bytes: float = 0.0
    packages: int = 0
    compiled: int = 0
    compile_total: int | None = None

    def feed(self, text: str) -> None:
        if download := _DOWNLOAD.match(text) or _APT_GET.match(text):
            self.downloads += 1
            self.download_bytes += float(download.group(1)) * _UNITS[download.group(2)]
        elif _APT_SET_UP.match(text):
            self.packages += 1
        elif ninja := _NINJA.match(text):
            self.compiled, self.compile_total = int(ninja.group(1)), int(ninja.group(2))
        elif _COMPILER_RUN.match(text):
            self.compiled += 1

    def describe(self) -> str:
        said = []
        if self.downloads:
            said.append(f"{self.downloads} downloads ({_size(self.download_bytes)})")
        if self.packages:
            said.append(f"{self.packages} packages set up")
        if self.compiled:
            said.append(f"{self.compiled}{f'/{self.compile_total}' if self.compile_total else ''} compiled")
        return ", ".join(said)


def _size(count: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


@dataclass
class _Running:
    """A step under way: when it started here, what its output counted, when a pipe was last told of it."""

    name: str
    started: float
    counts: StepCounts = field(default_factory=StepCounts)
    said_at: float = 0.0

    def line(self, now: float) -> str:
        counts = self.counts.describe()
        return f"{_elapsed(now - self.started)}  {self.name[:90]}{f': {counts}' if counts else ''}"

    def __rich__(self) -> Text:  # the status line renders this anew at every refresh: the elapsed time ticks
        return Text(f"running {self.line(time.monotonic())}")  # `[system 4/4]` is no markup


class _StepReporter:
    """Turns BuildKit's plain progress into one line per finished step (or every line with `plain`). A running
    step shows its elapsed time and what its output counts: on a terminal in the status line, in a pipe as a
    `running` line at most every PIPE_EVERY_S seconds."""

    def __init__(self, console: Console, verbose: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.verbose = verbose
        self.clock = clock
        self.steps: dict[str, StepTiming] = {}
        self.running: dict[str, _Running] = {}
        # on a terminal, the step now running shows under the finished ones (rich hides it elsewhere)
        self.status: Status | None = None

    def feed(self, line: str) -> None:
        if self.verbose:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if start := _STEP_START.match(line):
            step = self.steps.setdefault(start.group(1), StepTiming(" ".join(_NOISE.sub("", start.group(2)).split())))
            running = self.running.setdefault(start.group(1), _Running(step.name, self.clock()))
            running.said_at = running.started
            if self.status is not None:
                self.status.update(running)
        elif (output := _STEP_OUTPUT.match(line)) and (running := self.running.get(output.group(1))):
            running.counts.feed(output.group(3))
            now = self.clock()
            if self.status is not None:
                self.status.update(running)
            if not self.console.is_terminal and now - running.said_at >= PIPE_EVERY_S:
                running.said_at = now
                show_step(self.console, "running", running.line(now))
        elif (moving := _STEP_PROGRESS.match(line)) and moving.group(1) in self.steps:
            if self.status is not None:  # a 3 GB export: how far it has got, not a still spinner
                self.status.update(f"{self.steps[moving.group(1)].name[:80]}: {moving.group(2)}")
        elif (end := _STEP_END.match(line)) and end.group(1) in self.steps:
            self.running.pop(end.group(1), None)
            if self.status is not None:  # a finished step's time must not tick on: another one still running
                self.status.update(next(reversed(self.running.values()), "building"))
            step = self.steps[end.group(1)]
            outcome = end.group(2)
            step.cached = outcome == "CACHED"
            if outcome.startswith("DONE"):
                step.seconds = float(outcome.split()[1].rstrip("s"))
            shown = (
                "cached"
                if step.cached
                else outcome.split()[0].lower() + (f" {outcome.split()[1]}" if outcome.startswith("DONE") else "")
            )
            show_step(self.console, shown, step.name)


def show_step(console: Console, shown: str, name: str) -> None:
    """A finished step's line: its outcome (`done 12.3s`, `cached`) right-aligned, then the step."""
    console.print(f"  {shown:>12}  {name[:110]}", markup=False, highlight=False)


def run_buildx(
    plan: BuildPlan,
    arguments: list[str],
    *,
    sources: BuildSources,
    progress: str,
    console: Console,
    what: str,
    offline_repository: OfflineRepository | None = None,
) -> list[StepTiming]:
    """`docker buildx build` of PLAN's Dockerfile on a fresh context, steps streamed, the log kept on failure."""
    secret_arguments, secret_environment = sources.secret_arguments()
    docker_cli = require_cli()
    token = secrets.token_hex(6)
    log_directory().mkdir(parents=True, exist_ok=True)
    # the token keeps two builds started in the same second from sharing (and deleting) one log
    log_path = log_directory() / f"{plan.recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}-{token}.log"
    reporter = _StepReporter(console, verbose=progress == "plain")
    with tempfile.TemporaryDirectory(prefix="verlbox-context-") as context:
        write_context(plan, Path(context), sources, offline_repository)
        command = [docker_cli, "buildx", "build", "--progress", "plain", "--file", str(Path(context) / "Dockerfile")]
        command += arguments + secret_arguments + [context]
        console.print(
            f"{what} {plan.recipe.name} FROM {plan.base_image} (log: {log_path})", markup=False, highlight=False
        )
        with (
            log_path.open("w") as log,
            console.status("starting the build") as reporter.status,
            stopped_by_sigterm(),
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                env=os.environ | secret_environment,
            ) as process,
        ):
            assert process.stdout is not None
            try:
                for line in process.stdout:
                    log.write(line)
                    reporter.feed(line.rstrip("\n"))
            except BaseException:
                # Ctrl-C reaches buildx through the terminal's process group; a SIGTERM to verlbox alone
                # (a service manager, `kill`) does not: the build stops with verlbox either way
                process.terminate()
                process.wait()
                raise
            returncode = process.wait()
    if returncode != 0:
        said = log_path.read_text()
        if canceled(said):  # Ctrl-C reached buildx first: the same "interrupted" as at any other moment
            log_path.unlink()
            raise KeyboardInterrupt
        if unreachable := unreachable_registry(said):
            raise BuildError(
                f"the build of {plan.recipe.name} could not fetch its base {plan.base_image}: {unreachable} cannot "
                f"be reached. On a machine without a registry, {_without_a_registry(plan)}. Full log: {log_path}"
            )
        raise BuildError(
            f"the build of {plan.recipe.name} failed (exit {returncode}); previous images and "
            f"tags are untouched. Full log: {log_path}\n{failure_excerpt(said)}"
        )
    log_path.unlink()
    return list(reporter.steps.values())


@contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """A SIGTERM becomes KeyboardInterrupt meanwhile, so that the build's clean-up runs (its staging tag
    removed, buildx stopped) as for Ctrl-C, instead of the process vanishing mid-build."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_image(
    plan: BuildPlan,
    tags: list[str],
    *,
    sources: BuildSources | None = None,
    bundle: Path | None = None,
    offline_repository: OfflineRepository | None = None,
    no_cache: bool = False,
    progress: str = "auto",
    console: Console | None = None,
) -> BuildResult:
    """Build PLAN's final stage under a temporary tag, then move TAGS to it: a failure leaves every tag as it was.

    An offline plan builds from BUNDLE (a named build context), its apt steps from OFFLINE_REPOSITORY (the
    bundle's signed indexes), and is clamped to the lock's date.
    """
    console = console or Console(stderr=True)
    references = check_tags(tags)
    sources = sources or BuildSources()
    if not plan.offline:
        sources = sources.with_torch_index(plan.recipe.name, plan.torch_index)
    engine = client()
    for tag in remove_dead_builds_tags(engine, plan.recipe.name):
        console.print(f"removed {tag}: the build that made it was killed", markup=False, highlight=False)
    temporary_tag = staging_tag(plan.recipe.name)
    arguments = ["--load", "--target", "final", "--tag", temporary_tag] + (["--no-cache"] if no_cache else [])
    if plan.offline:
        assert bundle is not None and plan.source_date_epoch is not None
        arguments += ["--build-context", f"bundle={bundle.resolve()}"]
        arguments += ["--build-arg", f"SOURCE_DATE_EPOCH={plan.source_date_epoch}"]
    started = time.monotonic()
    clamped_tag = staging_tag(plan.recipe.name)
    try:
        steps = run_buildx(
            plan,
            arguments,
            sources=sources,
            progress=progress,
            console=console,
            what="building",
            offline_repository=offline_repository,
        )
        image_id = engine.images.get(temporary_tag).id
        if plan.source_date_epoch is not None:
            # a step of its own after BuildKit's (a `docker save` and `docker load` of the whole image: minutes)
            clamp = StepTiming(f"clamping file times to SOURCE_DATE_EPOCH={plan.source_date_epoch}")
            clamp_started = time.monotonic()
            with console.status(clamp.name):
                image_id = clamp_image(temporary_tag, plan.base_image, plan.source_date_epoch, clamped_tag)
            clamp.seconds = time.monotonic() - clamp_started
            show_step(console, f"done {clamp.seconds:.1f}s", clamp.name)
            steps.append(clamp)
            untag(engine, temporary_tag)
            temporary_tag = clamped_tag
    except BaseException:
        untag(engine, temporary_tag)
        untag(engine, clamped_tag)
        raise
    retag(engine, temporary_tag, references)
    return BuildResult(image_id, [str(r) for r in references], time.monotonic() - started, steps)


def image_for(args: argparse.Namespace) -> str:
    """--image, else the tag `verlbox build` gives the recipe's image."""
    from verlbox.host.recipes.recipe import load_recipe

    return args.image or default_tag(BuildPlan(load_recipe(args.recipe)))
