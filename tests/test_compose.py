"""compose.yaml, validated by the real `docker compose config`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.runtime.training import supervisor


def compose_config(project: Path, env: dict[str, str], *profiles: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "docker",
            "compose",
            "-f",
            str(REPO / "compose.yaml"),
            "--project-directory",
            str(project),
            *(word for profile in profiles for word in ("--profile", profile)),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | env,
    )


def test_train_service_reserves_the_gpu_and_runs_as_the_user(tmp_path: Path, compose_cli) -> None:
    for folder in ("models", "data", "checkpoints", "hf-cache"):
        (tmp_path / folder).mkdir()
    (tmp_path / ".env").write_text("VERLBOX_UID=1234\nVERLBOX_GID=5678\nVERLBOX_IMAGE=verlbox/p40-cu124:0.1.0\n")
    result = compose_config(tmp_path, {})
    assert result.returncode == 0, result.stderr
    train = json.loads(result.stdout)["services"]["train"]
    assert train["image"] == "verlbox/p40-cu124:0.1.0" and train["command"] == ["train", "--on-halt", "wait"]
    assert train["user"] == "1234:5678"
    assert train["deploy"]["resources"]["reservations"]["devices"] == [
        {"capabilities": ["gpu"], "driver": "nvidia", "count": 1}
    ]
    assert int(train["shm_size"]) >= 8 * 2**30
    # no lifetime budget: verl's crashes restart inside, and a halt holds (the service's command says so, not
    # the environment a one-off on the same service shares) instead of exiting into a loop
    assert train["restart"] == "on-failure"
    assert "VERLBOX_ON_HALT" not in train["environment"]
    assert str(supervisor.HALT_FILE) in " ".join(train["healthcheck"]["test"])
    mounts = {volume["target"]: volume for volume in train["volumes"]}
    assert set(mounts) == {"/models", "/data", "/checkpoints", "/cache/huggingface"}
    assert "read_only" not in mounts["/models"]  # train fetches a missing model into it
    assert mounts["/checkpoints"]["source"] == str(tmp_path / "checkpoints")
    assert train["environment"]["VERLBOX_CHECKPOINT_DIR"] == "/checkpoints"
    assert train["environment"]["HOME"] == "/tmp"


@pytest.mark.parametrize("profiles", [[], ["cluster"]], ids=["default", "cluster"])
def test_compose_quiet_validation_of_the_shipped_file(tmp_path: Path, compose_cli, profiles: list[str]) -> None:
    result = subprocess.run(
        [
            "docker",
            "compose",
            "-f",
            str(REPO / "compose.yaml"),
            "--project-directory",
            str(tmp_path),
            *(word for profile in profiles for word in ("--profile", profile)),
            "config",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stdout == "", result.stderr


def test_every_profile_in_the_file_is_validated(compose_cli) -> None:
    """The parametrised validation above must cover each profile compose.yaml names."""
    import yaml

    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    named = {profile for service in services.values() for profile in service.get("profiles", [])}
    assert named == {"cluster"}


@pytest.mark.parametrize(("value", "count"), [("", 1), ("2", 2), ("all", -1)])
def test_gpu_count_comes_from_env(tmp_path: Path, compose_cli, value: str, count: int) -> None:
    (tmp_path / ".env").write_text(f"VERLBOX_GPUS={value}\n" if value else "")
    result = compose_config(tmp_path, {}, "cluster")
    assert result.returncode == 0, result.stderr
    for name in ("train", "ray-head", "ray-worker"):
        devices = json.loads(result.stdout)["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": count}], name


def test_cluster_profile_runs_ray_on_the_host_network_with_the_shared_checkpoints(tmp_path: Path, compose_cli) -> None:
    shared = tmp_path / "nfs" / "checkpoints"
    (tmp_path / ".env").write_text(
        f"VERLBOX_HEAD_ADDRESS=10.0.0.1\nVERLBOX_RAY_PORT=6390\nVERLBOX_NODES=3\nVERLBOX_CHECKPOINTS={shared}\n"
    )
    default = json.loads(compose_config(tmp_path, {}).stdout)["services"]
    assert set(default) == {"train", "tensorboard"}, "the cluster services must stay out of a plain `docker compose up`"
    result = compose_config(tmp_path, {}, "cluster")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    head, worker = services["ray-head"], services["ray-worker"]
    for service in (head, worker):
        assert service["network_mode"] == "host" and service["profiles"] == ["cluster"]
        assert service["environment"]["VERLBOX_HEAD_ADDRESS"] == "10.0.0.1"
        assert service["environment"]["VERLBOX_RAY_PORT"] == "6390"
        mounts = {volume["target"]: volume["source"] for volume in service["volumes"]}
        assert mounts["/checkpoints"] == str(shared)
        assert "--node-manager-port=6380" in service["environment"]["RAY_PORTS"]
        assert int(service["shm_size"]) >= 8 * 2**30
    assert (
        "ray start --head" in head["command"][0]
        and 'train --on-halt wait --nodes "$$VERLBOX_NODES"' in head["command"][0]
    )
    # Ray's client server runs code for anyone reaching it and cannot be switched off: a fixed, documented port
    assert "--ray-client-server-port=10001" in head["command"][0]
    assert "keep 10001 closed" in (REPO / "compose.yaml").read_text()
    assert head["environment"]["VERLBOX_NODES"] == "3"
    assert "ray start --address" in worker["command"][0] and "--block" in worker["command"][0]


def test_tensorboard_serves_on_the_host_s_loopback_only_from_a_read_only_checkpoints_mount(
    tmp_path: Path, compose_cli
) -> None:
    (tmp_path / ".env").write_text("VERLBOX_TENSORBOARD_PORT=16006\nVERLBOX_UID=1234\n")
    result = compose_config(tmp_path, {})
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    board = services["tensorboard"]
    assert "profiles" not in board and "deploy" not in board  # no GPU for curves; `down` stops it
    assert [(p["host_ip"], p["published"], p["target"]) for p in board["ports"]] == [("127.0.0.1", "16006", 6006)]
    [mount] = board["volumes"]
    assert (mount["target"], mount["read_only"], mount["source"]) == (
        "/checkpoints",
        True,
        str(tmp_path / "checkpoints"),
    )
    assert board["user"].startswith("1234:")
    # a stop during a save waits for it (train's own grace, 240 s) within Docker's
    assert services["train"]["stop_grace_period"] == "5m0s" and services["train"]["init"] is True


def test_the_pkg_resources_warning_is_kept_out_of_the_services_consoles(tmp_path: Path, compose_cli) -> None:
    """setuptools 80 (the lock's) warns as verl's dependencies import pkg_resources: every shell printed it."""
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=verlbox/p40-cu124:0.1.0\n")
    result = compose_config(tmp_path, {})
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)["services"]["train"]["environment"]["PYTHONWARNINGS"]
    (tmp_path / "pkg_resources.py").write_text(  # setuptools 80.9's own words
        "import warnings\n\nwarnings.warn('pkg_resources is deprecated as an API. See "
        "https://setuptools.pypa.io/en/latest/pkg_resources.html.', UserWarning, stacklevel=2)\n"
    )
    probe = "import pkg_resources, warnings; warnings.warn('another warning', UserWarning)"
    shown = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONWARNINGS": settings},
        check=True,
    )
    assert "pkg_resources" not in shown.stderr and "another warning" in shown.stderr


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("VERLBOX_GPUS=0", "VERLBOX_GPUS"),  # compose drops a 0 and Docker then gives every GPU
        ("HF_ENDPOINT=hf-mirror.com", "HF_ENDPOINT"),  # requests: "No scheme supplied", at the first download
        ("VERLBOX_PROFILE=grpoo", "VERLBOX_PROFILE"),
        ("VERLBOX_RESTART_FAILURES=three", "VERLBOX_RESTART_FAILURES"),
        ("VERLBOX_GPU_MEMORY_GIB=24G", "VERLBOX_GPU_MEMORY_GIB"),
        ("VERLBOX_PROGRESS=quiet", "VERLBOX_PROGRESS"),
    ],
)
def test_train_refuses_a_bad_env_setting_first_naming_env_and_the_key(
    tmp_path: Path, compose_cli, line: str, key: str
) -> None:
    """compose takes these values as they are (its `${VAR:?}` refuses only an empty one): train, given the
    environment compose gives the service, refuses each as its first step, naming the key and .env, exit 2."""
    (tmp_path / ".env").write_text(line + "\n")
    result = compose_config(tmp_path, {})
    assert result.returncode == 0, result.stderr
    passed = json.loads(result.stdout)["services"]["train"]["environment"]
    with pytest.MonkeyPatch.context() as patch:  # this process's own settings stay out: the service's only
        for name in os.environ:
            if name.startswith(("VERLBOX_", "HF_")):
                patch.delenv(name)
        refused = run_verlbox("train", "--recipe", "p40-cu124", "--on-halt", "exit", env=passed)
    assert refused.returncode == 2, refused.stderr
    [said] = refused.stderr.replace("'", "").splitlines()  # the memory cap's value is quoted
    assert said.startswith(f"verlbox: error: {line} from .env (or the shell docker compose ran in): "), said
