"""The hold under real Ray on the CPU (the image's pin, 2.47.1): verl's own process layout, not a stand-in's. The
TaskRunner actor prints `local_global_step_folder:` and a worker actor writes the step folder; the line reaches
`train` through Ray's log monitor, after the folder is on disk. A stop sent the moment the folder appears (as the
GPU bench sends it) must leave the save whole, and the next start resume from it."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_save_hold import start_train, whole_saves_only

RAY_VERL = """
import os, sys, time, zipfile
from pathlib import Path

import pytest
import ray

out, folder = Path(sys.argv[1]), Path(sys.argv[2])

@ray.remote(num_cpus=0)
class WorkerDict:
    def save(self, step_folder):
        step_folder = Path(step_folder)
        step_folder.mkdir(parents=True, exist_ok=True)
        for role in ("actor", "critic"):
            time.sleep(0.5)
            for prefix in ("model", "optim", "extra_state"):
                path = step_folder / role / f"{prefix}_world_size_1_rank_0.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                with zipfile.ZipFile(path, "w") as archive:
                    archive.writestr("data.pkl", b"weights")

@ray.remote(num_cpus=0)
class TaskRunner:
    def run(self, folder):
        worker = WorkerDict.remote()
        ray.get(worker.__ray_ready__.remote())
        print("Total training steps: 6", flush=True)
        for step in (1, 2):
            time.sleep(1)
            step_folder = Path(folder) / f"global_step_{step}"
            print(f"local_global_step_folder: {step_folder}", flush=True)
            ray.get(worker.save.remote(str(step_folder)))
            with zipfile.ZipFile(step_folder / "data.pt", "w") as archive:
                archive.writestr("data.pkl", b"loader")
            with open(Path(folder) / "latest_checkpointed_iteration.txt", "w") as tracker:
                tracker.write(str(step))
            print(f"step:{step} - critic/score/mean:0.5", flush=True)
        time.sleep(600)

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=True)
runner = TaskRunner.remote()
ray.get(runner.run.remote(str(folder)))
"""


@pytest.fixture
def ray_temp() -> Iterator[Path]:
    """Ray's session folder, short: its sockets' paths must fit in AF_UNIX's 107 bytes (tmp_path's do not)."""
    folder = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_stop_as_the_folder_appears_under_real_ray_leaves_the_save_whole(tmp_path: Path, ray_temp: Path) -> None:
    (tmp_path / "verl.py").write_text(RAY_VERL)
    folder = tmp_path / "checkpoints" / "run"
    process = start_train(
        tmp_path, [sys.executable, str(tmp_path / "verl.py"), str(tmp_path), str(folder)], RAY_TMPDIR=str(ray_temp)
    )
    deadline = time.monotonic() + 180
    while not (folder / "global_step_2").is_dir():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-4000:]
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert "stopping once verl has written the checkpoint it is saving" in output, output[-4000:]
    whole_saves_only(folder, 2)
