"""The memory cap's sitecustomize runs the one it hides; the cluster commands keep the user's PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_compose import compose_config
from verlbox.runtime.training.memory_cap import SITECUSTOMIZE_DIR

# torch.cuda as far as the cap touches it: one 48 GiB device, the fraction the cap sets recorded
FAKE_TORCH_CUDA = """\
fractions = []


class _Properties:
    total_memory = 48 * 2**30


def device_count():
    return 1


def get_device_properties(device):
    return _Properties()


def set_per_process_memory_fraction(fraction, device):
    fractions.append((fraction, device))


def _lazy_call(callable):
    callable()
"""
# what the child prints: the fractions the cap set, and the module `import sitecustomize` gives
PROBE = "import sitecustomize, torch.cuda; print(torch.cuda.fractions, sitecustomize.__file__)"


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    folder = tmp_path / "fake-torch"
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text("")
    (folder / "torch" / "cuda.py").write_text(FAKE_TORCH_CUDA)
    return folder


def user_site(folder: Path, marker: Path, body: str = "") -> Path:
    """A user's sitecustomize that appends a line to MARKER each time it runs, then runs BODY."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"with open({str(marker)!r}, 'a') as f:\n    f.write('ran\\n')\n{body}")
    return folder


def python(*path: Path, cap: str | None = "24", code: str = PROBE) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONVERBOSE")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    if cap is not None:
        env["VERLBOX_GPU_MEMORY_GIB"] = cap
    else:
        env.pop("VERLBOX_GPU_MEMORY_GIB", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)


def test_the_users_sitecustomize_runs_once_and_the_cap_still_applies(tmp_path: Path, fake_torch: Path) -> None:
    marker = tmp_path / "marker"
    user = user_site(tmp_path / "user", marker)
    result = python(SITECUSTOMIZE_DIR, user, fake_torch)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "ran\n"
    # 24 of the device's 48 GiB; and `import sitecustomize` is the user's module, as without the cap
    assert result.stdout.split() == ["[(0.5,", "0)]", str(user / "sitecustomize.py")]


def test_the_chain_runs_without_a_cap_and_with_the_folder_listed_twice(tmp_path: Path, fake_torch: Path) -> None:
    marker = tmp_path / "marker"
    user = user_site(tmp_path / "user", marker)
    # a second name for the cap's folder: site drops exact duplicates only
    link = tmp_path / "memcap-link"
    link.symlink_to(SITECUSTOMIZE_DIR)
    result = python(SITECUSTOMIZE_DIR, link, user, fake_torch, cap=None)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "ran\n"
    assert result.stdout.split() == ["[]", str(user / "sitecustomize.py")]


def test_a_failing_user_sitecustomize_is_reported_as_python_reports_it(tmp_path: Path, fake_torch: Path) -> None:
    marker = tmp_path / "marker"
    user = user_site(tmp_path / "user", marker, "raise RuntimeError('boom')\n")
    code = "import torch.cuda; print(torch.cuda.fractions)"
    plain = python(user, fake_torch, cap=None, code=code)
    capped = python(SITECUSTOMIZE_DIR, user, fake_torch, code=code)
    # Python's site prints one line and starts anyway; the chain changes nothing in that
    assert plain.returncode == capped.returncode == 0
    assert (
        plain.stderr
        == capped.stderr
        == "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: boom\n"
    )
    assert marker.read_text() == "ran\nran\n"  # once per child
    assert capped.stdout == "[(0.5, 0)]\n"


def test_a_bad_cap_is_one_line_and_the_users_sitecustomize_still_runs(tmp_path: Path, fake_torch: Path) -> None:
    marker = tmp_path / "marker"
    user = user_site(tmp_path / "user", marker)
    result = python(SITECUSTOMIZE_DIR, user, fake_torch, cap="24G")
    assert result.returncode == 0 and marker.read_text() == "ran\n"
    assert result.stderr.startswith("verlbox: GPU memory cap not applied: VERLBOX_GPU_MEMORY_GIB='24G'")
    assert result.stdout.split()[0] == "[]"


STUB = '#!/bin/sh\necho "$PYTHONPATH" >> "$STUB_OUT"\n'


@pytest.mark.docker
@pytest.mark.parametrize("service", ["ray-head", "ray-worker"])
@pytest.mark.parametrize("users", [None, "/opt/user-site"], ids=["unset", "set"])
def test_the_cluster_commands_keep_the_users_pythonpath(
    tmp_path: Path, compose_cli, service: str, users: str | None
) -> None:
    project = tmp_path / "run"
    for folder in ("models", "data", "checkpoints", "hf-cache"):
        (project / folder).mkdir(parents=True)
    rendered = compose_config(project, {}, "cluster")
    assert rendered.returncode == 0, rendered.stderr
    [command] = json.loads(rendered.stdout)["services"][service]["command"]
    # `config` writes the command with compose's $$ escaping: the container's shell gets single $
    command = command.replace("$$", "$")
    # `ray` and `verlbox` are stand-ins that record the PYTHONPATH they were started with
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in ("ray", "verlbox"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {
        "PATH": os.pathsep.join([str(stubs), str(Path(sys.executable).parent), env["PATH"]]),
        "STUB_OUT": str(tmp_path / "seen"),
        "VERLBOX_HEAD_ADDRESS": "10.0.0.1",
        "VERLBOX_RAY_PORT": "6379",
        "VERLBOX_NODES": "2",
        "RAY_PORTS": "--disable-usage-stats",
    }
    if users:
        env["PYTHONPATH"] = users
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr
    # no trailing ':' without a user PYTHONPATH: an empty entry would put the working folder on sys.path
    expected = os.pathsep.join(filter(None, [str(SITECUSTOMIZE_DIR), users]))
    seen = (tmp_path / "seen").read_text().splitlines()
    assert seen == [expected] * (2 if service == "ray-head" else 1)
