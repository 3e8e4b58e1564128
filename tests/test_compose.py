"""compose.yaml, validated by the real `docker compose config`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import REPO


def compose_config(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "docker",
            "compose",
            "-f",
            str(REPO / "compose.yaml"),
            "--project-directory",
            str(project),
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
    assert train["image"] == "verlbox/p40-cu124:0.1.0" and train["command"] == ["train"]
    assert train["user"] == "1234:5678"
    assert train["deploy"]["resources"]["reservations"]["devices"] == [
        {"capabilities": ["gpu"], "driver": "nvidia", "count": 1}
    ]
    assert int(train["shm_size"]) >= 8 * 2**30
    assert train["restart"] == "on-failure:3"
    mounts = {volume["target"]: volume for volume in train["volumes"]}
    assert set(mounts) == {"/models", "/data", "/checkpoints", "/cache/huggingface"}
    assert mounts["/models"]["read_only"] is True
    assert mounts["/checkpoints"]["source"] == str(tmp_path / "checkpoints")
    assert train["environment"]["VERLBOX_CHECKPOINT_DIR"] == "/checkpoints"
    assert train["environment"]["HOME"] == "/tmp"


def test_compose_quiet_validation_of_the_shipped_file(tmp_path: Path, compose_cli) -> None:
    result = subprocess.run(
        [
            "docker",
            "compose",
            "-f",
            str(REPO / "compose.yaml"),
            "--project-directory",
            str(tmp_path),
            "config",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stdout == ""
