"""A stop during a save is held until verl has written it, as the disk says (the tracker names the step and
its files are whole), not until a console step line that a run without the console logger never prints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tests.test_progress import RECORDED, TRAIN

from verlbox.runtime.training import checkpoints
from verlbox.runtime.training.progress import Progress, RunWatch

CONTENTS = {role: checkpoints.DEFAULT_CONTENTS for role in ("actor", "critic")}


def torch_saved(path: Path) -> None:
    """A file as torch.save leaves it (a ZIP archive, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.pkl", b"weights")


def write_save(step_folder: Path, roles: tuple[str, ...] = ("actor", "critic")) -> None:
    for role in roles:
        for prefix in ("model", "optim", "extra_state"):
            torch_saved(step_folder / role / f"{prefix}_world_size_1_rank_0.pt")
    torch_saved(step_folder / checkpoints.DATALOADER_FILE)


def test_a_save_ends_when_the_tracker_names_it_and_its_files_are_whole(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    step_folder = folder / "global_step_4"
    watch = RunWatch(
        None,
        Progress(samples_per_step=16, memory_limit_gib=24),
        lambda line: None,
        save_written=lambda path, since: checkpoints.save_written(path, CONTENTS, since),
    )
    write_save(step_folder)  # an older save of this step, complete, its tracker written before this save began
    (folder / checkpoints.TRACKER).write_text("4")
    old = time.time() - 60
    os.utime(folder / checkpoints.TRACKER, (old, old))
    watch.take(f"(TaskRunner pid=7) local_global_step_folder: {step_folder}", attempt=1)
    assert watch.saving  # the old tracker says nothing of this save
    shutil.rmtree(step_folder)
    write_save(step_folder, roles=("actor",))
    (folder / checkpoints.TRACKER).write_text("2")  # the previous save's
    assert watch.saving
    (folder / checkpoints.TRACKER).write_text("4")
    assert watch.saving  # the tracker names it, but the critic's files are not there
    write_save(step_folder)
    assert not watch.saving
    assert not watch.saving  # and it stays ended


FAKE_VERL_WITHOUT_CONSOLE_LOGGER = """
import sys, time, zipfile
from pathlib import Path
out = Path(sys.argv[1])
step_folder = out / "checkpoints" / "run" / "global_step_2"
def saved(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.pkl", b"weights")
print("(TaskRunner pid=1) Total training steps: 6", flush=True)
print(f"(TaskRunner pid=1) local_global_step_folder: {step_folder}", flush=True)
(out / "saving").touch()
for role in ("actor", "critic"):
    time.sleep(1)
    for prefix in ("model", "optim", "extra_state"):
        saved(step_folder / role / f"{prefix}_world_size_1_rank_0.pt")
saved(step_folder / "data.pt")
(step_folder.parent / "latest_checkpointed_iteration.txt").write_text("2")
(out / "saved").write_text(str(time.monotonic()))
time.sleep(600)  # step 3 runs; with trainer.logger=[tensorboard] verl prints no step line
"""


def test_a_stop_during_a_save_ends_once_it_is_on_disk_without_the_console_logger(tmp_path: Path) -> None:
    """trainer.logger=[tensorboard]: no step line ever comes. docker stop during the save is held until the
    save is written, then passed on at once, not after the whole grace period."""
    (tmp_path / "fake_verl.py").write_text(FAKE_VERL_WITHOUT_CONSOLE_LOGGER)
    model = tmp_path / "model"
    user = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}", "trainer.logger=[tensorboard]"]
    env = dict(
        os.environ,
        VERLBOX_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        VERLBOX_EXPERIMENT="run",
        VERLBOX_SKIP_DISK_CHECK="1",
        VERLBOX_SAVE_GRACE_S="120",
        COLUMNS="200",
    )
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-c", TRAIN, str(tmp_path / "fake_verl.py"), str(tmp_path), str(RECORDED)]
    process = subprocess.Popen(
        [*command, json.dumps(user)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "saving").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    ended = time.monotonic()
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "stopping once verl has written the checkpoint it is saving" in output
    saved = float((tmp_path / "saved").read_text())
    assert ended - saved < 10, f"{ended - saved:.0f} s after the save was written: {output}"
    assert "trainer.logger has no console" in output
    assert checkpoints.read_tracker(tmp_path / "checkpoints" / "run") == 2
