"""`verlbox shell`: `docker compose run --rm` on the train service, checked first, cleaned up after.

The command it builds is checked through the CLI with the run itself faked; the checks, the --no-gpu
run and the cleanup run the installed verlbox against the real engine with a tiny local image (three
hand-made static executables, imported without a registry).
"""

from __future__ import annotations

import fcntl
import io
import os
import platform
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from docker.errors import APIError, NotFound

from conftest import REPO, docker, run_verlbox
from verlbox import cli
from verlbox.host.runs import shell
from verlbox.host.runs.doctor import NVIDIA_HOOK, SERVICE_PATH

RUN_FOLDERS = ("models", "data", "checkpoints", "hf-cache")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, object]:
    """What `verlbox shell` would run (and its --no-gpu override's text), without an engine."""
    seen: dict[str, object] = {}

    def fake_run(args: object, run: shell.ComposeRun, where: str | None = None) -> int:
        files = [Path(word) for before, word in zip(run.compose, run.compose[1:], strict=False) if before == "-f"]
        seen.update(run=run, args=run.command, env=run.environment, files=files, where=where)
        seen.update(overrides=[file.read_text() for file in files[1:]])
        return 7

    monkeypatch.setattr(shell, "run_checked", fake_run)
    monkeypatch.chdir(tmp_path)
    for variable in ("VERLBOX_IMAGE", "VERLBOX_UID", "VERLBOX_GID"):
        monkeypatch.delenv(variable, raising=False)
    return seen


def run(*argv: str) -> None:
    assert cli.main(["shell", *argv]) == 7  # the run's exit code is verlbox's


def after_run(captured: dict) -> list[str]:
    """The words after `docker compose ... run`."""
    return captured["args"][captured["args"].index("run") + 1 :]


def one_off(captured: dict) -> list[str]:
    """What every shell run adds: a name verlbox removes it by, and no hold on a halt (a one-off exits)."""
    name = captured["run"].container
    assert name.startswith(f"verlbox-shell-{os.getpid()}-")
    return ["--name", name, "-e", "VERLBOX_ON_HALT=exit"]


def test_interactive_shell_uses_the_train_service_in_the_users_folder(captured: dict, tmp_path: Path) -> None:
    run("p40-cu124")
    assert captured["args"][1:4] == ["compose", "--progress", "quiet"] and captured["files"][0] == REPO / "compose.yaml"
    assert after_run(captured) == ["--rm", *one_off(captured), "--entrypoint", "bash", "train"]
    assert captured["args"][captured["args"].index("--project-directory") + 1] == str(tmp_path)
    env = captured["env"]
    assert env["VERLBOX_IMAGE"] == "verlbox/p40-cu124:0.1.0"
    assert (env["VERLBOX_UID"], env["VERLBOX_GID"]) == (str(os.getuid()), str(os.getgid()))
    # the GPU reservation stays; outside a run folder, none of its folders is mounted
    assert captured["overrides"] == [shell.OVERRIDE_HEAD + shell.NO_FOLDERS]


def test_one_command_after_the_double_dash(captured: dict) -> None:
    run("p40", "--", "python", "-V")
    assert after_run(captured) == ["--rm", *one_off(captured), "--entrypoint", "python", "train", "-V"]
    assert captured["env"]["VERLBOX_IMAGE"] == "verlbox/p40:0.1.0"


def test_one_command_with_an_image_and_no_recipe(captured: dict) -> None:
    run("--image", "mine:1", "--", "nvidia-smi", "-L")
    assert after_run(captured) == ["--rm", *one_off(captured), "--entrypoint", "nvidia-smi", "train", "-L"]
    assert captured["env"]["VERLBOX_IMAGE"] == "mine:1"


def test_without_a_recipe_the_dotenv_decides(captured: dict, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=verlbox/p40-cu124:0.1.0\nVERLBOX_UID=1234\n")
    (tmp_path / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    run()
    env = captured["env"]
    # compose reads .env itself; a variable verlbox exported would win over it, so none is exported
    assert "VERLBOX_IMAGE" not in env and "VERLBOX_UID" not in env
    assert env["VERLBOX_GID"] == str(os.getgid())
    assert captured["args"][5] == str(tmp_path / "compose.yaml")  # the folder's own compose file wins


def test_run_dir_is_the_project_from_anywhere_and_is_named(captured: dict, tmp_path: Path) -> None:
    """--run DIR: compose's project folder (so its .env and relative mounts) is DIR wherever verlbox runs,
    and the run says which folder it used; a folder that is not a run folder is one line, nothing run."""
    folder = tmp_path / "runs" / "first"
    folder.mkdir(parents=True)
    (folder / ".env").write_text("VERLBOX_IMAGE=verlbox/p40-cu124:0.1.0\n")
    run("--run", str(folder))
    assert captured["args"][1:8] == [
        "compose", "--progress", "quiet", "-f", str(REPO / "compose.yaml"), "--project-directory", str(folder)
    ]  # fmt: skip
    assert captured["where"] == f"run folder {folder} (its .env)" and "VERLBOX_IMAGE" not in captured["env"]
    captured.clear()
    assert cli.main(["shell", "--run", str(tmp_path / "runs")]) == 2 and captured == {}


def test_no_gpu_adds_one_override_that_resets_the_reservation(captured: dict, tmp_path: Path) -> None:
    run("--no-gpu", "--image", "mine:1", "--", "true")
    files = captured["files"]
    assert files[0] == REPO / "compose.yaml" and len(files) == 2
    assert captured["overrides"] == [shell.OVERRIDE_HEAD + shell.NO_GPU + shell.NO_FOLDERS]
    assert captured["args"][-3:] == ["--entrypoint", "true", "train"]
    assert not files[1].exists()  # a temporary file, gone after the run
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=mine:1\n")  # in a run folder: its folders are mounted
    run("--no-gpu", "--", "true")
    assert captured["overrides"] == [shell.OVERRIDE_HEAD + shell.NO_GPU]


def test_a_missing_image_names_the_recipe_that_builds_it() -> None:
    assert shell.missing_image_fix("verlbox/p40:0.1.0", None) == "build it first: verlbox build p40"
    assert shell.missing_image_fix("verlbox/p40-cu124:0.1.0", "p40-cu124") == "build it first: verlbox build p40-cu124"
    assert shell.missing_image_fix("mine:1", "p40") == "build it first: verlbox build p40 --tag mine:1"
    assert (
        shell.missing_image_fix("mine:1", None)
        == "build it first (verlbox build RECIPE --tag mine:1) or load it (docker load)"
    )


def test_only_bind_mounts_docker_may_not_create_are_required(tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    volumes = [
        {"type": "bind", "source": str(tmp_path / "here"), "bind": {}},
        {"type": "bind", "source": str(tmp_path / "absent"), "bind": {}},
        {"type": "bind", "source": str(tmp_path / "made"), "bind": {"create_host_path": True}},
        {"type": "volume", "source": "named"},
    ]
    assert shell.missing_mounts({"volumes": volumes}) == [str(tmp_path / "absent")]


class FakeNetwork:
    def __init__(self, name: str, removed: list[str]) -> None:
        self.name, self.removed = name, removed

    def remove(self) -> None:
        self.removed.append(self.name)


class FakeEngine:
    """The docker SDK calls the cleanup makes: the project's containers and networks."""

    def __init__(self, containers: list[str], networks: list[str]) -> None:
        self.removed: list[str] = []
        self.containers = SimpleNamespace(list=lambda **filters: containers)
        nets = [FakeNetwork(name, self.removed) for name in networks]
        self.networks = SimpleNamespace(list=lambda **filters: nets)


def test_cleanup_removes_only_networks_made_for_the_run_and_only_when_no_container_remains() -> None:
    engine = FakeEngine([], ["p_default", "p_other"])
    shell.remove_networks_made(engine, "p", before={"p_other"})
    assert engine.removed == ["p_default"]
    # a train started meanwhile (running or stopped) may use it: Docker would let a stopped one's go
    engine = FakeEngine(["a train"], ["p_default"])
    shell.remove_networks_made(engine, "p", before=set())
    assert engine.removed == []


class RemovedByComposeMeanwhile:
    """The one-off as compose's own --rm leaves it after a Ctrl-C: verlbox's removal is refused (409, removal
    already in progress) and the container lists for a few more looks, then is gone."""

    def __init__(self, looks_left: int) -> None:
        self.looks_left = looks_left

    def get(self, name: str) -> SimpleNamespace:
        if self.looks_left == 0:
            raise NotFound(f"no container {name}")
        self.looks_left -= 1
        return SimpleNamespace(remove=self.refuse)

    def refuse(self, force: bool) -> None:
        raise APIError(
            "removal is already in progress",
            response=SimpleNamespace(status_code=409, url="http://engine/containers", reason="Conflict"),
        )

    def list(self, **filters: object) -> list[str]:
        return ["the one-off"] if self.looks_left else []


def test_a_one_off_compose_is_removing_already_is_waited_for_then_its_network_goes() -> None:
    engine = FakeEngine([], ["p_default"])
    engine.containers = RemovedByComposeMeanwhile(looks_left=3)
    shell.remove_one_off(engine, "one-off", "p", set(), wait_s=10)
    assert engine.removed == ["p_default"]


def test_an_engine_error_other_than_a_removal_under_way_is_raised() -> None:
    class Broken(RemovedByComposeMeanwhile):
        def refuse(self, force: bool) -> None:
            raise APIError(
                "boom", response=SimpleNamespace(status_code=500, url="http://engine/containers", reason="Server Error")
            )

    engine = FakeEngine([], ["p_default"])
    engine.containers = Broken(looks_left=1)
    with pytest.raises(APIError, match="500 Server Error"):
        shell.remove_one_off(engine, "one-off", "p", set(), wait_s=1)
    assert engine.removed == []


def _relayed(chunks: list[bytes], came: list[int], ran: bool = False, terminal: bool = True) -> tuple[bytes, bool]:
    """What an ErrorRelay passes on of compose's error output CHUNKS, once compose has ended, and whether it saw the
    engine refuse the one-off's start."""
    source, sink = os.pipe()
    passed_source, passed_sink = os.pipe()
    relay = shell.ErrorRelay(source, passed_sink, SimpleNamespace(came=came, ran=ran), terminal)
    relay.start()
    for chunk in chunks:
        os.write(sink, chunk)
    os.close(sink)
    relay.finish()
    os.close(passed_sink)
    with os.fdopen(passed_source, "rb") as passed:
        return passed.read(), relay.stopped_before_start


def test_compose_errors_pass_but_a_refused_or_cancelled_start_is_kept_back() -> None:
    refused = (
        b"Error response from daemon: OCI runtime start failed: cannot start a container that has stopped: unknown\n"
    )
    assert _relayed([b"a prompt$ "], came=[], ran=True) == (b"a prompt$ ", False)  # no newline: not held back
    failed = [b"line one\nError response", b" from daemon: no such network\n"]
    assert _relayed(failed, came=[]) == (b"line one\nError response from daemon: no such network\n", False)
    assert _relayed([b"before\n", refused], came=[]) == (b"before\n", True)
    assert _relayed([refused], came=[], terminal=False) == (refused, False)  # no console a key could reach
    assert _relayed([b"Error response from daemon: cannot start a stopped process: unknown"], came=[]) == (b"", True)
    # a stop before the one-off ran: compose's words on the start it gave up (the docker CLI's usage text too)
    assert _relayed([b"canceled\n", b"unknown flag: --progress\nUsage:  docker [OPTIONS]\n"], came=[2]) == (b"", False)
    # once it ran, what follows a stop is the command's own (without a terminal its errors come this way)
    assert _relayed([b"Terminated\n"], came=[15], ran=True) == (b"Terminated\n", False)


# --- against the real engine ---


def _exit(code: int) -> bytes:
    return b"\xbf" + struct.pack("<I", code) + b"\xb8\x3c\x00\x00\x00\x0f\x05"  # mov edi, CODE; exit


PAUSE = b"\xb8\x22\x00\x00\x00\x0f\x05" + _exit(0)  # pause() until a signal, then exit(0)


def _static_executable(code_bytes: bytes) -> bytes:
    """A complete x86-64 Linux executable running CODE_BYTES: an ELF header and one loaded segment."""
    base, start = 0x400000, 64 + 56
    size = start + len(code_bytes)
    header = struct.pack(
        "<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 2, 62, 1, base + start, 64, 0, 0, 64, 56, 1, 0, 0, 0
    )
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return header + segment + code_bytes


@pytest.fixture(scope="module")
def tiny_image(docker_engine: object, compose_cli: None) -> Iterator[str]:
    """An image holding only /bin/true, /bin/false and /bin/pause, made here; removed afterwards."""
    if platform.machine() != "x86_64":
        pytest.skip("the tiny test image's executables are x86-64 code")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, code in (("bin/true", _exit(0)), ("bin/false", _exit(1)), ("bin/pause", PAUSE)):
            data = _static_executable(code)
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o755
            tar.addfile(member, io.BytesIO(data))
    image = f"verlbox-test/shell-tiny:{os.getpid()}"
    subprocess.run(["docker", "import", "-", image], input=archive.getvalue(), check=True, capture_output=True)
    yield image
    docker("image", "rm", image)


def engine_state() -> tuple[list[str], list[str]]:
    networks = docker("network", "ls", "--format", "{{.Name}}").stdout.split()
    containers = docker("ps", "-a", "--format", "{{.ID}} {{.Names}} {{.Status}}").stdout.splitlines()
    return sorted(networks), sorted(containers)


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    folder = tmp_path / f"shelltest{os.getpid()}"  # the compose project is named after it
    for name in RUN_FOLDERS:
        (folder / name).mkdir(parents=True)
    return folder


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("verlbox: error: "), result.stderr
    return lines[0]


def test_a_missing_image_is_one_line_and_creates_nothing(tiny_image: str, run_folder: Path) -> None:
    before = engine_state()
    absent = f"verlbox-test/absent:{os.getpid()}"
    line = one_error_line(run_verlbox("shell", "--image", absent, "--", "true", cwd=run_folder), code=2)
    assert line == (
        f"verlbox: error: {absent} is not on this engine: "
        f"build it first (verlbox build RECIPE --tag {absent}) or load it (docker load)"
    )
    (run_folder / ".env").write_text(f"VERLBOX_IMAGE={absent}\n")  # no recipe, no --image: the .env's image
    line = one_error_line(run_verlbox("shell", "--no-gpu", cwd=run_folder), code=2)
    assert line.startswith(f"verlbox: error: {absent} is not on this engine")
    assert engine_state() == before


def test_outside_a_run_folder_it_says_so_instead_of_naming_a_recipe_to_build(run_folder: Path) -> None:
    """No .env or compose.yaml here, no image named: not advice to build p40 (a long build of a recipe this
    user may not want), but where to go."""
    result = run_verlbox("shell", "--no-gpu", "--", "true", cwd=run_folder)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"verlbox: error: {run_folder} is not a run folder (no .env or compose.yaml): `verlbox init DIR` makes one; "
        "cd into yours or give --run DIR, or name the image: verlbox shell RECIPE, or --image REF"
    ]


def test_the_checkout_is_not_taken_for_a_run_folder() -> None:
    """Its compose.yaml is init's template: it once asked to build p40, a recipe nobody built here."""
    result = run_verlbox("shell", "--no-gpu", "--", "true", cwd=REPO)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"verlbox: error: {REPO} is verlbox's source tree, not a run folder (its compose.yaml is init's template): "
        "`verlbox init ~/run` makes one; cd into yours or give --run DIR, or name the image: verlbox shell RECIPE, "
        "or --image REF"
    ]


def test_with_a_dotenv_and_no_image_named_compose_default_is_checked_not_pulled(
    tiny_image: str, run_folder: Path
) -> None:
    before = engine_state()
    (run_folder / ".env").write_text("VERLBOX_PROFILE=\n")  # a run folder whose .env names no image
    result = run_verlbox("shell", "--no-gpu", "--", "true", cwd=run_folder)
    if docker("image", "inspect", "verlbox/p40:0.1.0", check=False).returncode == 0:
        assert result.returncode == 0, result.stderr  # built here earlier: it runs
    else:
        line = one_error_line(result, code=2)
        assert line == "verlbox: error: verlbox/p40:0.1.0 is not on this engine: build it first: verlbox build p40"
    assert engine_state() == before


def test_without_the_nvidia_runtime_one_line_names_it_and_no_gpu(tiny_image: str, run_folder: Path) -> None:
    if shutil.which(NVIDIA_HOOK, path=os.pathsep.join((os.environ["PATH"], SERVICE_PATH))):
        pytest.skip(f"this host has {NVIDIA_HOOK}: the missing-runtime refusal cannot be seen here")
    before = engine_state()
    line = one_error_line(run_verlbox("shell", "--image", tiny_image, "--", "true", cwd=run_folder))
    assert line.startswith(f"verlbox: error: no {NVIDIA_HOOK} on the Docker daemon's PATH")
    assert "nvidia-ctk runtime configure --runtime=docker" in line
    assert line.endswith("; or `verlbox shell --no-gpu` to start without a GPU")
    assert engine_state() == before


def test_missing_run_folders_are_named_before_anything_starts(tiny_image: str, tmp_path: Path) -> None:
    before = engine_state()
    (tmp_path / ".env").write_text(f"VERLBOX_IMAGE={tiny_image}\n")  # a run folder, its folders not made yet
    line = one_error_line(run_verlbox("shell", "--no-gpu", "--", "true", cwd=tmp_path))
    assert f"the train service mounts {tmp_path / 'models'}, {tmp_path / 'data'}," in line
    assert "mkdir -p" in line
    assert engine_state() == before


def test_outside_a_run_folder_a_named_image_runs_alone_without_the_folders(tiny_image: str, tmp_path: Path) -> None:
    """Before: a look at an image demanded models/, data/, checkpoints/ and hf-cache/ here."""
    before = engine_state()
    result = run_verlbox("shell", "--no-gpu", "--image", tiny_image, "--", "true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"no run folder here: {tiny_image} alone, without a run folder's mounts" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing made here
    assert engine_state() == before


def test_no_gpu_runs_the_image_and_leaves_nothing_behind(tiny_image: str, run_folder: Path) -> None:
    before = engine_state()
    result = run_verlbox("shell", "--no-gpu", "--image", tiny_image, "--", "true", cwd=run_folder)
    assert result.returncode == 0, result.stderr
    assert engine_state() == before
    failing = run_verlbox("shell", "--no-gpu", "--image", tiny_image, "--", "false", cwd=run_folder)
    # the command's own exit code: a container really ran
    assert failing.returncode == 1 and "verlbox: error" not in failing.stderr
    assert engine_state() == before
    (run_folder / ".env").write_text(f"VERLBOX_IMAGE={tiny_image}\n")  # --run DIR from elsewhere: its .env's image
    elsewhere = run_verlbox("shell", "--no-gpu", "--run", str(run_folder), "--", "true", cwd=REPO / "tests")
    assert elsewhere.returncode == 0 and f"run folder {run_folder} (its .env)" in elsewhere.stderr, elsewhere.stderr
    assert engine_state() == before


def test_no_gpu_keeps_trains_mounts_user_and_environment(compose_cli: None, run_folder: Path, tmp_path: Path) -> None:
    override = tmp_path / "no-gpu.yaml"
    override.write_text(shell.OVERRIDE_HEAD + shell.NO_GPU)
    args = cli.build_parser().parse_args(["shell", "--image", "mine:1"])
    environ = {"PATH": os.environ["PATH"]}
    plain = shell.resolved_project(shell.shell_command(args, run_folder, environ))["services"]["train"]
    no_gpu = shell.resolved_project(shell.shell_command(args, run_folder, environ, override))["services"]["train"]
    assert plain["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert "deploy" not in no_gpu
    assert {key: value for key, value in plain.items() if key != "deploy"} == no_gpu
    assert no_gpu["user"] == f"{os.getuid()}:{os.getgid()}" and no_gpu["image"] == "mine:1"


@pytest.mark.parametrize(
    "start",
    [["run", "-d", "--entrypoint", "pause", "train"], ["create", "train"]],
    ids=["running", "stopped"],  # a stopped container does not stop Docker removing its network: verlbox must
)
def test_a_train_of_the_project_and_its_network_are_left_alone(
    tiny_image: str, run_folder: Path, start: list[str]
) -> None:
    project = run_folder.name
    environment = os.environ | {"VERLBOX_IMAGE": tiny_image, "VERLBOX_UID": str(os.getuid())}
    override = run_folder.parent / "no-gpu.yaml"
    override.write_text(shell.OVERRIDE_HEAD + shell.NO_GPU)
    compose = ["docker", "compose", "-f", str(REPO / "compose.yaml"), "-f", str(override)]
    compose += ["--project-directory", str(run_folder)]
    started = subprocess.run([*compose, *start], env=environment, capture_output=True, text=True)
    label = f"label=com.docker.compose.project={project}"
    try:
        assert started.returncode == 0, started.stderr
        trains = docker("ps", "-a", "--filter", label, "--format", "{{.ID}} {{.State}}").stdout.splitlines()
        assert len(trains) == 1
        result = run_verlbox("shell", "--no-gpu", "--image", tiny_image, "--", "true", cwd=run_folder)
        assert result.returncode == 0, result.stderr
        assert docker("ps", "-a", "--filter", label, "--format", "{{.ID}} {{.State}}").stdout.splitlines() == trains
        assert f"{project}_default" in docker("network", "ls", "--format", "{{.Name}}").stdout.split()
    finally:
        # pause is PID 1, which ignores SIGTERM: kill it rather than wait out the grace period
        for container in docker("ps", "-a", "-q", "--filter", label).stdout.split():
            docker("rm", "-f", container)
        subprocess.run([*compose, "down"], env=environment, check=True, capture_output=True)


def _started_one_off(tiny_image: str, run_folder: Path) -> tuple[subprocess.Popen[str], str]:
    """`verlbox shell --no-gpu -- pause` in a session of its own, once its container is running: (process, name)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "verlbox.cli", "shell", "--no-gpu", "--image", tiny_image, "--", "pause"],
        cwd=run_folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    name = f"verlbox-shell-{process.pid}-"
    deadline = time.monotonic() + 60
    while True:
        running = docker("ps", "--filter", f"name={name}", "--format", "{{.Names}}").stdout.split()
        if running:
            return process, running[0]
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.2)


def _left_of(container: str, project: str, seconds: float = 30) -> list[str]:
    """The one-off container and the project's networks, once they are gone or SECONDS have passed."""
    deadline = time.monotonic() + seconds
    while True:
        left = docker("ps", "-a", "--filter", f"name={container}", "--format", "{{.Names}}").stdout.split()
        left += docker("network", "ls", "--filter", f"label=com.docker.compose.project={project}", "-q").stdout.split()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("sigterm to verlbox", 128 + signal.SIGTERM),  # `timeout`, `kill`, a supervisor
        ("sigint to verlbox", 128 + signal.SIGINT),  # kill -INT PID: compose never hears of it
        ("sigint to the group", None),  # Ctrl-C without a terminal: both get it; who ends first varies
        ("sighup to verlbox", 128 + signal.SIGHUP),  # the terminal closed
        ("sigkill to verlbox", -signal.SIGKILL),  # nothing of verlbox's runs after: its reaper cleans up
    ],
)
def test_however_a_one_off_ends_no_container_or_network_is_left(
    tiny_image: str, run_folder: Path, how: str, code: int | None
) -> None:
    process, container = _started_one_off(tiny_image, run_folder)
    try:
        signum = {"term": signal.SIGTERM, "int": signal.SIGINT, "hup": signal.SIGHUP, "kill": signal.SIGKILL}
        sent = signum[how.split()[0].removeprefix("sig")]
        if how.endswith("group"):
            os.killpg(process.pid, sent)
        else:
            process.send_signal(sent)
        output, _ = process.communicate(timeout=60)
        if code is not None:
            assert process.returncode == code, output
        assert "Traceback" not in output, output
        assert "could not remove" not in output, output  # compose's own --rm removing it too is not a failure
        assert _left_of(container, run_folder.name) == [], output
    finally:
        docker("rm", "-f", container, check=False)
        if process.poll() is None:
            process.kill()


def _typed_ctrl_c(command: list[str], cwd: Path, delay: float) -> tuple[int, str]:
    """COMMAND on a terminal of its own (a pty: its session's controlling terminal, COMMAND its foreground group), a
    Ctrl-C typed DELAY seconds after it starts: the terminal sends SIGINT to the whole group, or, once compose has
    made it raw, passes the key to the container's console. (Its exit status, what the terminal showed.)"""
    terminal, attached = pty.openpty()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdin=attached,
        stdout=attached,
        stderr=attached,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # after start_new_session's setsid()
    )
    os.close(attached)
    shown = b""
    typed_at, deadline = time.monotonic() + delay, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if typed_at and time.monotonic() >= typed_at:
                os.write(terminal, b"\x03")
                typed_at = 0
            ready, _, _ = select.select([terminal], [], [], 0.02)
            if ready:
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:  # EIO: every process holding the terminal has ended
                    break
                if not chunk:
                    break
                shown += chunk
        return process.wait(timeout=max(1.0, deadline - time.monotonic())), shown.decode(errors="replace")
    finally:
        os.close(terminal)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_ctrl_c_typed_at_any_moment_exits_130_quietly_and_leaves_nothing(tiny_image: str, run_folder: Path) -> None:
    """A user's Ctrl-C while compose made and started the one-off: the engine's `OCI runtime start failed: cannot
    start a container that has stopped` (the key reached the container's console before its start) and exit 1, or
    a container or network that compose's create, under way as it was cancelled, made after verlbox had cleaned
    up. The sweep covers verlbox's checks, compose's network and container, their start and the running command."""
    (run_folder / ".env").write_text(f"VERLBOX_IMAGE={tiny_image}\n")  # as `verlbox shell` in a user's run folder
    command = [sys.executable, "-m", "verlbox.cli", "shell", "--no-gpu", "--", "pause"]
    project = f"label=com.docker.compose.project={run_folder.name}"

    def left_and_removed() -> list[str]:
        containers = docker("ps", "-aq", "--filter", project).stdout.split()
        networks = docker("network", "ls", "-q", "--filter", project).stdout.split()
        for container in containers:
            docker("rm", "-f", container, check=False)
        for network in networks:
            docker("network", "rm", network, check=False)
        return containers + networks

    outcomes = []
    try:
        for delay in (0.3, 0.5, 0.65, 0.75, 0.85, 0.95, 1.05, 1.15, 1.3, 1.6, 2.0):
            code, shown = _typed_ctrl_c(command, run_folder, delay)
            said = [
                line
                for line in shown.replace("^C", "").replace("\r", "\n").splitlines()
                if line.strip() and not line.startswith(f"run folder {run_folder}")
            ]
            outcomes.append((delay, code, left_and_removed(), said))
    finally:
        left_and_removed()
    # -SIGINT: run as `python -m`, Python exits by the signal itself when the key landed in code it exec'd from a
    # string (a dataclass made at import), though verlbox caught it and returned 130; a shell reads 130 either way,
    # and the installed `verlbox` script exits 130
    assert all(code in (130, -signal.SIGINT) for _, code, _, _ in outcomes), outcomes
    assert not any("Error" in line or "OCI" in line or "Traceback" in line for *_, said in outcomes for line in said)
    assert all(len(said) <= 1 for *_, said in outcomes), outcomes
    assert all(not left for _, _, left, _ in outcomes), outcomes
