"""`verlbox shell`: a shell (or one command) in the image, through compose's `train` service.

compose.yaml's `train` service is the one definition of GPU, mounts, user and environment, so the
shell runs `docker compose run --rm` on it. Before anything is created, what would otherwise surface
as a raw engine error (with a compose network left behind) is checked: the image is on the engine,
the engine can give a container a GPU (unless --no-gpu), the bind-mounted folders exist. After the
run, the network compose made for it goes when no container of the project uses it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from rich.console import Console

from verlbox import paths
from verlbox.dotenv import dotenv_values
from verlbox.errors import INTERRUPTED, UsageError, VerlboxError
from verlbox.host.building.build import image_for
from verlbox.host.runs.settings import check_gpu_count

err = Console(stderr=True, highlight=False, soft_wrap=True)

# compose's `!reset` (compose >= 2.24) drops the GPU reservation and nothing else: mounts, user,
# environment and shared memory stay train's own
OVERRIDE_HEAD = "services:\n  train:\n"
NO_GPU = "    deploy: !reset null\n"
NO_FOLDERS = "    volumes: !reset []\n"
# compose's --rm and verlbox both remove a one-off that a Ctrl-C ended: how long the networks wait for it
REMOVAL_WAIT_S = 30.0
REMOVAL_POLL_S = 0.25
PROJECT_LABEL = "com.docker.compose.project"
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_POLL_S = 0.1  # how often the one-off's state is looked at until it runs, and after a stop
STOP_TIMEOUT_S = 10  # docker stop's grace for a one-off that was running when the stop came
COMPOSE_CANCEL_S = 5.0  # how long compose has to end or start the one-off after a stop before it is sent SIGTERM
SETTLE_S = 1.0  # how long the one-off's name is held after a stop that came before it was seen
SETTLE_MAX_S = 15.0
# what the engine answers compose when the one-off's first process died between its create and its start: in a
# terminal, a Ctrl-C typed then reaches that process through the container's console (compose has the terminal
# raw by then), not verlbox (runc's text, then containerd's)
ERROR_HEAD = b"Error response from daemon: "
STOPPED_BEFORE_START = (
    b"cannot start a container that has stopped",
    b"cannot start an already running container",  # runc, when the key came as it started the process
    b"cannot start a stopped process",
)
RELAY_JOIN_S = 5.0


@dataclass(frozen=True)
class ComposeRun:
    compose: list[str]  # docker compose -f FILE... --project-directory DIR
    run: list[str]  # run --rm --name NAME ... --entrypoint CMD train ARGS...
    environment: dict[str, str]  # what verlbox adds to the caller's environment

    @property
    def command(self) -> list[str]:
        return [*self.compose, *self.run]

    @property
    def container(self) -> str:
        return self.run[self.run.index("--name") + 1]


def shell_command(
    args: argparse.Namespace, workdir: Path, environ: dict[str, str], override: Path | None = None
) -> ComposeRun:
    """`docker compose run` on the train service, in the user's folder, honouring its .env.

    The compose file in the current folder wins over the shipped one; relative mounts and .env are the
    current folder's. A variable the shell or .env already sets is left alone. OVERRIDE is one more
    compose file on top (--no-gpu's).
    """
    from verlbox.host.clients.engine import require_cli

    compose_file = workdir / "compose.yaml"
    if not compose_file.is_file():
        compose_file = paths.compose_file()
    files = [compose_file, *([override] if override else [])]
    # quiet: compose's "Network ... Creating/Created" lines on every run say nothing a user acts on
    compose = [require_cli(), "compose", "--progress", "quiet", *(word for file in files for word in ("-f", str(file)))]
    compose += ["--project-directory", str(workdir)]
    entrypoint, *rest = args.one_command or ["bash"]
    already = set(environ) | set(dotenv_values(workdir / ".env"))
    environment: dict[str, str] = {}
    if args.recipe or args.image:
        environment["VERLBOX_IMAGE"] = image_for(args)
    for variable, value in (("VERLBOX_UID", os.getuid()), ("VERLBOX_GID", os.getgid())):
        if variable not in already:
            environment[variable] = str(value)
    # a one-off never holds on a halt (a compose.yaml from before `train --on-halt` sets it for every command)
    one_off = ["run", "--rm", "--name", one_off_name(), "-e", "VERLBOX_ON_HALT=exit", "--entrypoint", entrypoint]
    return ComposeRun(compose, [*one_off, "train", *rest], environment)


def one_off_name() -> str:
    """The one-off's container name: verlbox removes it by name however the run ends."""
    return f"verlbox-shell-{os.getpid()}-{secrets.token_hex(4)}"


def resolved_project(run: ComposeRun) -> dict[str, Any]:
    """The compose project as compose itself resolves it (.env, environment, defaults, merged files)."""
    result = subprocess.run(
        [*run.compose, "config", "--format", "json"],
        env=os.environ | run.environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()
        raise VerlboxError(f"docker compose cannot read the project: {said[-1] if said else 'no output'}")
    project = json.loads(result.stdout)
    if "train" not in project.get("services", {}):
        raise VerlboxError("the compose file has no `train` service (compare with `verlbox init`'s compose.yaml)")
    return project


def missing_image_fix(image: str, recipe: str | None) -> str:
    """`verlbox build` of the recipe whose image this is, when one is known."""
    from verlbox.host.building.build import default_tag
    from verlbox.host.building.plan import BuildPlan
    from verlbox.host.recipes.recipe import load_recipe, recipe_names

    if recipe is None:
        recipe = next((name for name in recipe_names() if default_tag(BuildPlan(load_recipe(name))) == image), None)
    if recipe is None:
        return f"build it first (verlbox build RECIPE --tag {image}) or load it (docker load)"
    tag = "" if default_tag(BuildPlan(load_recipe(recipe))) == image else f" --tag {image}"
    return f"build it first: verlbox build {recipe}{tag}"


def missing_mounts(service: dict[str, Any]) -> list[str]:
    """Host folders the service bind-mounts without letting Docker create them, which do not exist."""
    return [
        volume["source"]
        for volume in service.get("volumes") or []
        if volume.get("type") == "bind"
        and not (volume.get("bind") or {}).get("create_host_path")
        and not Path(volume["source"]).exists()
    ]


def check_before_run(args: argparse.Namespace, engine: Any, service: dict[str, Any]) -> None:
    from verlbox.host.building.diskspace import local_data_folder
    from verlbox.host.clients.engine import require_image
    from verlbox.host.runs.doctor import require_nvidia_runtime

    image = service.get("image")  # none where the folder's compose file builds its own
    if image:
        require_image(image, missing_image_fix(image, args.recipe))
    if not args.no_gpu:
        require_nvidia_runtime("; or `verlbox shell --no-gpu` to start without a GPU", engine)
    # bind sources are paths on the engine's machine: only a local engine's can be checked here
    missing = missing_mounts(service) if local_data_folder(engine) is not None else []
    if missing:
        raise VerlboxError(
            f"the train service mounts {', '.join(missing)}, which do not exist: "
            f"create them first (mkdir -p {' '.join(missing)}), or make a run folder with `verlbox init`"
        )


def _project_networks(engine: Any, project: str) -> list[Any]:
    return engine.networks.list(filters={"label": f"{PROJECT_LABEL}={project}"})


def remove_networks_made(engine: Any, project: str, before: set[str]) -> None:
    """Remove the project's networks made since BEFORE, unless a container of the project (a train) has any."""
    import docker

    if engine.containers.list(all=True, filters={"label": f"{PROJECT_LABEL}={project}"}):
        return
    for network in _project_networks(engine, project):
        if network.name not in before:
            with contextlib.suppress(docker.errors.APIError):  # one taken into use since: keep it
                network.remove()


def remove_one_off(
    engine: Any, container: str, project: str, networks_before: set[str], wait_s: float = REMOVAL_WAIT_S
) -> None:
    """The one-off container, if it is still there, then the networks made for it. Compose's own `--rm` may be
    removing the container at the same moment (a Ctrl-C reaches both): then the engine answers 409, and the
    networks can go only once the container has, so its end is waited for (WAIT_S at most)."""
    import docker

    try:
        engine.containers.get(container).remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != HTTPStatus.CONFLICT:
            raise
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                engine.containers.get(container)
            except docker.errors.NotFound:
                break
            time.sleep(REMOVAL_POLL_S)
    remove_networks_made(engine, project, networks_before)


def _state(engine: Any, container: str) -> str | None:
    """The one-off's state (created, running, exited, removing...), None while the engine has none of that name, and
    "unknown" when the engine does not answer (compose, which needs it too, then fails on its own)."""
    import docker

    try:
        return str(engine.containers.get(container).status)
    except docker.errors.NotFound:
        return None
    except (docker.errors.DockerException, OSError):
        return "unknown"


@contextlib.contextmanager
def _stops_recorded() -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM and SIGHUP are only recorded here: the main thread decides what each stops (OneOffWatch), by
    the one-off's state, with no engine call in a handler. Yields the signals that came. A Python handler, unlike
    SIG_IGN, is not inherited by compose."""
    came: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: came.append(signum)) for signum in STOPS}
    try:
        yield came
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class OneOffWatch:
    """Compose's run as verlbox follows it, and what a stop does to it.

    Until the one-off runs its state is looked at every STOP_POLL_S. A stop (Ctrl-C reaches compose too; `kill` or
    `timeout` only verlbox) ends a running one-off through the engine, compose then returns: within docker stop's
    grace when it was running before the stop, at once when it started only after (nothing the user asked for ran).
    A one-off compose has not made or not yet started is left to compose, which ends itself on the terminal's
    Ctrl-C or starts it, to be stopped then; one that does neither within COMPOSE_CANCEL_S (a signal to verlbox
    alone while compose builds or pulls) is sent SIGTERM, then SIGKILL. A container stopped between compose's
    create and start would fail that start with the engine's "cannot start a container that has stopped"."""

    def __init__(self, engine: Any, container: str, came: list[int]) -> None:
        self.engine, self.container, self.came = engine, container, came
        self.seen = False  # the engine had the one-off at a look: compose's create of it had ended
        self.ran = False  # it was running at a look

    def look(self) -> str | None:
        state = _state(self.engine, self.container)
        self.seen = self.seen or state not in (None, "unknown")
        self.ran = self.ran or state == "running"
        return state

    def wait(self, compose: subprocess.Popen[bytes]) -> int:
        """Compose's exit code, once it has ended."""
        import docker

        stop_came = None
        stopped = False
        while True:
            try:
                returncode = compose.wait(timeout=STOP_POLL_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                if self.came:
                    self.look()  # one there now was made: no create of compose's can still be under way
                return returncode
            if not self.came:
                if not self.ran:
                    self.look()
                continue
            ran_before = self.ran
            now = time.monotonic()
            stop_came = now if stop_came is None else stop_came
            state = self.look()
            if state == "running" and not stopped:
                stopped = True
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # gone, or going already
                    self.engine.containers.get(self.container).stop(timeout=STOP_TIMEOUT_S if ran_before else 0)
            elif state != "running" and now - stop_came > COMPOSE_CANCEL_S:
                with contextlib.suppress(ProcessLookupError):
                    if now - stop_came > 2 * COMPOSE_CANCEL_S:
                        compose.kill()
                    else:
                        compose.terminate()


def settle(engine: Any, container: str, image: str | None) -> None:
    """After a stop that came before the one-off was seen: what compose asked of the engine before it ended may
    still land (a container created a second later, its network). The one-off's name is taken by a placeholder
    (never started, on no network) for SETTLE_S, so that a create still under way is refused, or, when the
    engine answers that the name is taken, the container made under it is removed and the name taken then."""
    import docker

    placeholder = None
    deadline = time.monotonic() + SETTLE_MAX_S
    while image and placeholder is None and time.monotonic() < deadline:
        with contextlib.suppress(docker.errors.NotFound):
            engine.containers.get(container).remove(force=True)
        try:
            placeholder = engine.containers.create(
                image, name=container, entrypoint=["verlbox-placeholder"], network_mode="none"
            )
        except docker.errors.APIError as exc:
            if exc.status_code != HTTPStatus.CONFLICT:  # the name cannot be held: the wait alone
                break
            time.sleep(STOP_POLL_S)  # being made, or being removed: look again
    time.sleep(SETTLE_S)
    if placeholder is not None:
        with contextlib.suppress(docker.errors.NotFound):
            placeholder.remove(force=True)


class ErrorRelay(threading.Thread):
    """Compose's error output (the one-off's too, without a terminal), passed on as it comes once the one-off runs.

    Before that compose says nothing (`--progress quiet`) but errors, and what it says is held: written when the
    one-off runs or compose ends without a stop, dropped after a stop (its start given up: "canceled", or the docker
    CLI's usage text when the signal cut its plugin lookup short). In a terminal the engine's answer that the
    one-off died before compose could start it (STOPPED_BEFORE_START) is dropped and recorded: compose had the
    terminal raw, and a Ctrl-C typed went to the container's console, not to verlbox. Only a line that begins
    like the engine's errors waits for its end; everything else, a prompt without its newline too, goes at once."""

    def __init__(self, source: int, sink: int, watch: OneOffWatch, terminal: bool) -> None:
        super().__init__(daemon=True)
        self.source, self.sink, self.watch, self.terminal = source, sink, watch, terminal
        self.held: list[bytes] = []
        self.stopped_before_start = False

    def run(self) -> None:
        pending = b""
        try:
            while True:
                ready, _, _ = select.select([self.source], [], [], STOP_POLL_S)
                if self.held and self.watch.ran:
                    self.write(b"".join(self.held))
                    self.held = []
                if not ready:
                    continue
                chunk = os.read(self.source, 65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._emit(line + b"\n")
                if not (pending.startswith(ERROR_HEAD) or ERROR_HEAD.startswith(pending)):
                    self._emit(pending)
                    pending = b""
            self._emit(pending)
        finally:
            os.close(self.source)

    def _emit(self, text: bytes) -> None:
        if self.terminal and text.startswith(ERROR_HEAD) and any(said in text for said in STOPPED_BEFORE_START):
            self.stopped_before_start = True
        elif self.held or not self.watch.ran:
            self.held.append(text)
        else:
            self.write(text)

    def finish(self) -> None:
        """Once compose has ended: what is held is written, unless a stop came before the one-off ran."""
        self.join(timeout=RELAY_JOIN_S)  # a process compose left holding its end of the pipe is not waited for
        if not self.watch.came or self.watch.ran:
            self.write(b"".join(self.held))
        self.held = []

    def write(self, text: bytes) -> None:
        with contextlib.suppress(OSError):  # the terminal gone: nothing to tell
            while text:
                text = text[os.write(self.sink, text) :]


def _start_reaper(container: str, project: str, networks_before: set[str]) -> subprocess.Popen[bytes]:
    """A watcher of its own session that removes the one-off if verlbox dies without cleaning up (SIGKILL)."""
    command = [sys.executable, "-m", "verlbox.host.runs.reaper", str(os.getpid()), container, project]
    return subprocess.Popen(
        [*command, *sorted(networks_before)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _compose_run(run: ComposeRun, watch: OneOffWatch) -> tuple[int, bool]:
    """Compose's run, its error output through an ErrorRelay: its exit code, and whether the engine said the
    one-off had died before it started."""
    try:
        sink_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stderr of Python's own (tests): compose writes its own
        with subprocess.Popen(run.command, env=os.environ | run.environment) as compose:
            return watch.wait(compose), False
    source, sink = os.pipe()
    relay = ErrorRelay(source, sink_fd, watch, terminal=sys.stdin.isatty())
    try:
        with subprocess.Popen(run.command, env=os.environ | run.environment, stderr=sink) as compose:
            os.close(sink)
            relay.start()  # it closes SOURCE once every holder of SINK (compose) has ended
            returncode = watch.wait(compose)
    except BaseException:
        if not relay.is_alive():
            os.close(source)
            with contextlib.suppress(OSError):
                os.close(sink)
        raise
    relay.finish()
    return returncode, relay.stopped_before_start


def run_checked(args: argparse.Namespace, run: ComposeRun, where: str | None = None) -> int:
    """Checks, then the run; WHERE (the run folder used) is said once the checks pass: a failure stays one line.
    However the run ends, its container and the networks made for it are gone after. A stop before the one-off
    ran, or a Ctrl-C typed into its console before it started, is said in one line: `verlbox: interrupted`."""
    from verlbox.host.clients.engine import client

    engine = client()
    project = resolved_project(run)
    check_before_run(args, engine, project["services"]["train"])
    if where:
        err.print(where, markup=False)
    with _stops_recorded() as came:
        before = {network.name for network in _project_networks(engine, project["name"])}
        reaper = _start_reaper(run.container, project["name"], before)
        watch = OneOffWatch(engine, run.container, came)
        returncode, stopped_before_start = 0, False
        try:
            if not came:  # a stop during the checks: nothing to start
                returncode, stopped_before_start = _compose_run(run, watch)
        finally:
            try:
                if came and not watch.seen:
                    settle(engine, run.container, project["services"]["train"].get("image"))
                remove_one_off(engine, run.container, project["name"], before)
            except VerlboxError as exc:  # the engine gone meanwhile: the reaper, still there, tries again
                err.print(f"verlbox: could not remove {run.container} ({exc})", markup=False)
            except Exception as exc:  # an engine error mid-removal must not hide the run's own exit code
                err.print(f"verlbox: could not remove {run.container} ({type(exc).__name__}: {exc})", markup=False)
            else:
                reaper.terminate()
    stopped_before_start = stopped_before_start and returncode != 0
    if (came[:1] == [signal.SIGINT] and not watch.ran) or (stopped_before_start and not came):
        err.print("verlbox: interrupted", markup=False)
    if came:
        return 128 + came[0]
    if stopped_before_start:  # a Ctrl-C typed while compose started it
        return INTERRUPTED
    return 128 - returncode if returncode < 0 else returncode


def shell(args: argparse.Namespace) -> int:
    from verlbox.run_folder import find_run_folder, not_a_run_folder

    run = find_run_folder(args.run)
    if run is None and not (args.recipe or args.image):
        # compose's default image would be named otherwise: advice to build a recipe this user may not want
        raise UsageError(
            f"{Path.cwd()} is {not_a_run_folder(Path.cwd())}; cd into yours or give --run DIR, or name the image: "
            "verlbox shell RECIPE, or --image REF"
        )
    workdir = run.path if run else Path.cwd()
    check_gpu_count(workdir, os.environ)
    # outside a run folder, a look at the image (`docker run --rm -it` as a user expects): none of the folders
    resets = (NO_GPU if args.no_gpu else "") + (NO_FOLDERS if run is None else "")
    where = run.described if run else f"no run folder here: {image_for(args)} alone, without a run folder's mounts"
    with tempfile.TemporaryDirectory(prefix="verlbox-shell-") as scratch:
        override = None
        if resets:
            override = Path(scratch) / "override.yaml"
            override.write_text(OVERRIDE_HEAD + resets)
        return run_checked(args, shell_command(args, workdir, dict(os.environ), override), where)
