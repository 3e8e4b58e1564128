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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from rich.console import Console

from verlbox import paths
from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError, VerlboxError
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


@contextlib.contextmanager
def _stops_end_the_container(engine: Any, container: str, compose: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM or SIGHUP to verlbox stop the one-off container (compose then returns), whether or not
    compose got the signal too (Ctrl-C in a terminal reaches both; `kill` or `timeout` only verlbox); before
    compose has made the container, compose itself is stopped. Yields the signals that came. A Python handler,
    unlike SIG_IGN, is not inherited by compose."""
    import docker

    came: list[int] = []

    def stop(signum: int, frame: object) -> None:
        came.append(signum)
        try:
            engine.containers.get(container).stop(timeout=10)
        except docker.errors.NotFound:  # not made yet: compose goes, and what it made is removed after
            with contextlib.suppress(ProcessLookupError):
                compose.terminate()
        except docker.errors.APIError:  # going already
            pass

    previous = {signum: signal.signal(signum, stop) for signum in STOPS}
    try:
        yield came
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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


def run_checked(args: argparse.Namespace, run: ComposeRun, where: str | None = None) -> int:
    """Checks, then the run; WHERE (the run folder used) is said once the checks pass: a failure stays one line.
    However the run ends, its container and the networks made for it are gone after."""
    from verlbox.host.clients.engine import client

    engine = client()
    project = resolved_project(run)
    check_before_run(args, engine, project["services"]["train"])
    if where:
        err.print(where, markup=False)
    before = {network.name for network in _project_networks(engine, project["name"])}
    reaper = _start_reaper(run.container, project["name"], before)
    try:
        with (
            subprocess.Popen(run.command, env=os.environ | run.environment) as compose,
            _stops_end_the_container(engine, run.container, compose) as came,
        ):
            returncode = compose.wait()
    finally:
        try:
            remove_one_off(engine, run.container, project["name"], before)
        except VerlboxError as exc:  # the engine gone meanwhile: the reaper, still there, tries again
            err.print(f"verlbox: could not remove {run.container} ({exc})", markup=False)
        except Exception as exc:  # an engine error mid-removal must not hide the run's own exit code
            err.print(f"verlbox: could not remove {run.container} ({type(exc).__name__}: {exc})", markup=False)
        else:
            reaper.terminate()
    if came:
        return 128 + came[0]
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
