"""Shared fixtures: the real verl 0.4.1 wheel (for patching and its Hydra config) and the Docker engine."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

from standins import closed_port_url
from verlbox.host.runs.remembered import build_records

# the run's time by phase, one line at its end (tests/phases.py)
pytest_plugins = ["phases"]

REPO = Path(__file__).resolve().parents[1]
# tests import this module as `conftest`, as pytest does: a second copy would run what follows again
if __name__ != "conftest":
    raise ImportError(f"tests/conftest.py imported as {__name__}: write `from conftest import ...`")
# tests never reach an upstream: a source archive missing from the cache is "fetched" from a port
# where nothing listens, and fails in one line (tests/test_archives.py serves its own)
os.environ.setdefault("VERLBOX_SOURCES_URL", closed_port_url())
# what verlbox remembers (the run folders init made, the last build) never goes to the user's own state
# folder: the session's fixtures write to one of their own, each test to its own (state_folder)
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="verlbox-test-state-")


@pytest.fixture(autouse=True)
def state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_STATE_HOME for this test alone: no test sees another's run folders or last build. The records of the
    images the session's fixtures built are there (linked), as a host keeps its builds' records for `verify`."""
    folder = tmp_path_factory.mktemp("state")
    # the session's folder as its builds saw it: os.environ's, since a second import of this module (as
    # `tests.conftest`) would make another and point the environment at that one
    records, own = build_records(), build_records({"XDG_STATE_HOME": str(folder)})
    monkeypatch.setenv("XDG_STATE_HOME", str(folder))
    if records.is_dir():
        own.mkdir(parents=True)
        for record in records.iterdir():
            os.link(record, own / record.name)
    return folder


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reaches the engine through the docker_engine fixture is a `docker` test, marked so or not:
    .ci/run runs every other test in a second process beside them, with a DOCKER_HOST that answers nothing (one
    that needs the engine all the same fails there; `docker compose config` needs none)."""
    for item in items:
        if "docker_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def sources_dir() -> Path:
    """The project's shared source archives, Apex's among them (.ci/run sets VERLBOX_SOURCES)."""
    folder = os.environ.get("VERLBOX_SOURCES")
    if not folder or not any(Path(folder).glob("apex-*.tar.gz")):
        if os.environ.get("CI"):
            pytest.fail("CI sets VERLBOX_SOURCES to the shared source archives")
        pytest.skip("VERLBOX_SOURCES does not name a folder with Apex's pinned archive")
    return Path(folder)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An experiment's checkpoint folder (verl's trainer.default_local_dir), empty."""
    folder = tmp_path / "checkpoints" / "exp"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verlbox installed from its wheel (not editable) into a fresh venv, as a user's `pip install` gets it."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(REPO)],
        check=True,
        capture_output=True,
    )
    venv.create(root / "venv", with_pip=True)
    wheel = next((root / "dist").glob("verlbox-*.whl"))
    python = root / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    return root / "venv"


@pytest.fixture(scope="session")
def verl_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl==0.4.1 exactly as PyPI serves it (downloaded once per session)."""
    target = tmp_path_factory.mktemp("verl-wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "verl==0.4.1", "-d", str(target)],
        check=True,
        capture_output=True,
    )
    return next(target.glob("verl-0.4.1-*.whl"))


@pytest.fixture
def verl_tree(verl_wheel: Path, tmp_path: Path) -> Path:
    """A fresh, unpatched site-packages-like folder holding verl 0.4.1."""
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(verl_wheel) as wheel:
        wheel.extractall(site)
    return site


@pytest.fixture(scope="session")
def verl_config_dir(verl_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("verl-config")
    with zipfile.ZipFile(verl_wheel) as wheel:
        wheel.extractall(site)
    return site / "verl" / "trainer" / "config"


def _unavailable(reason: str) -> None:
    # CI starts an engine (.ci/run); there, a missing engine is a failure, never a skip
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Docker tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> object:
    if shutil.which("docker") is None:
        _unavailable("no docker CLI on PATH")
    import docker

    try:
        engine = docker.from_env()
        engine.ping()
    except docker.errors.DockerException as exc:
        _unavailable(f"no Docker engine answers: {exc}")
    if subprocess.run(["docker", "buildx", "version"], capture_output=True, check=False).returncode != 0:
        _unavailable("docker buildx is missing")
    return engine


@pytest.fixture(scope="session")
def compose_cli() -> None:
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        _unavailable("docker compose v2 is missing")


def run_verlbox(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verlbox.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=os.environ | (env or {}),
        timeout=timeout,
        check=False,
    )


IMAGE = "verlbox-test/p40-cu124:ci"
# These machines re-sign TLS on the way out; the build trusts the host's bundle as a BuildKit secret.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def ca_arguments() -> list[str]:
    return ["--ca-bundle", str(HOST_CA_BUNDLE)] if HOST_CA_BUNDLE.is_file() else []


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr[-3000:]}"
    return result


def staging_tags() -> set[str]:
    """The temporary tags `verlbox build` gives an image until it succeeds."""
    return set(docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "verlbox-build/*").stdout.split())


@pytest.fixture(scope="session")
def staging_tags_before_build(docker_engine: object) -> set[str]:
    """Staging tags already there when the session started: a build killed by SIGKILL leaves one."""
    return staging_tags()


def build_cache_ids(engine: Any) -> set[str]:
    return {record["ID"] for record in engine.df().get("BuildCache") or []}


def prune_build_cache_since(engine: Any, kept: set[str]) -> None:
    """Drop the build-cache records made since KEPT was read (a `--no-cache` build's, say), nothing older.

    BuildKit prunes a record only once nothing is built on it, so each pass frees the next layer down.
    Records of another build running on the engine at the time go too (unless in use): the tests
    build one image at a time. This reaches the engine's own BuildKit, the builder verlbox uses.
    """
    while True:
        passes = [engine.api.prune_builds(filters={"id": f"^{record}$"}) for record in build_cache_ids(engine) - kept]
        if not any(result.get("CachesDeleted") for result in passes):
            return


@pytest.fixture(scope="session")
def build_output(docker_engine: object, staging_tags_before_build: set[str]) -> subprocess.CompletedProcess[str]:
    """p40-cu124 built once per test session, FROM a debootstrapped base, as `verlbox build` does it."""
    result = run_verlbox("build", "p40-cu124", "--bootstrap-base", "--tag", IMAGE, *ca_arguments(), timeout=3000)
    assert result.returncode == 0, result.stderr[-5000:]
    import phases  # the plugin pytest loaded (pytest_plugins above): imported first, it could not be rewritten

    phases.note_build(result.stderr)
    return result


@pytest.fixture(scope="session")
def image(build_output: subprocess.CompletedProcess[str]) -> str:
    return IMAGE


def pass_the_gpu_preflight(monkeypatch: pytest.MonkeyPatch, train_module: Any) -> None:
    """`train` on a machine without a GPU, past its preflight as on one P40 (the GPU probe, checks and the data
    they prepare faked)."""
    from verlbox.runtime.training import preflight

    p40 = preflight.GpuFacts([preflight.GpuDevice("Tesla P40", "6.1", 22.4, 22.2)], ["sm_61"], "12.4", "550.54.14")
    monkeypatch.setattr(train_module, "local_gpu_facts", lambda cap: p40)
    monkeypatch.setattr(train_module, "run_preflight", lambda *args: [preflight.Check("gpu", True, "a fake P40")])
    # the faked preflight made no data to measure: the profile's prompt width stays (smoke's GPU runs check the fit)
    monkeypatch.setattr(train_module, "fit_prompt_length", lambda overrides, user, say: overrides)


def git_shaped_archive(folder: Path, commit: str, files: dict[str, bytes], mtime: int = 0) -> Path:
    """A `git archive`-shaped tarball: the commit in the pax header, the tree under one folder, each
    entry with the commit's time (MTIME)."""
    path = folder / f"apex-{commit}.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": commit}) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"apex-{commit}/{name}")
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return path
