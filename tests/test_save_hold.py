"""A stop during a save is held until verl has written it, as the disk says (the tracker names the step and its files
are whole), not until a console step line that a run without the console logger never prints; and it is held from
the moment the disk shows the save, not from verl's line, which under Ray arrives 50-100 ms after the folder (or,
with the driver busy, later still). The stand-in verl here is as unkind as verl under Ray: the folder first, the
files over a second or two, the line late (once never)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from test_progress import RECORDED
from verlbox.runtime.training import checkpoints
from verlbox.runtime.training.progress import Progress, RunWatch
from verlbox.runtime.training.save_watch import SaveWatch

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


def watching(folder: Path) -> RunWatch:
    watch = RunWatch(
        None, Progress(samples_per_step=16, memory_limit_gib=24), lambda line: None, saves=SaveWatch(folder, CONTENTS)
    )
    watch.follow(_Closed())  # an attempt starts: the folder is marked as it is now
    return watch


class _Closed:
    """verl's output, ended at once: the reader thread leaves, the watch stays."""

    def read1(self, size: int) -> bytes:
        return b""

    def close(self) -> None:
        pass


def test_a_save_ends_when_the_tracker_names_it_and_its_files_are_whole(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    step_folder = folder / "global_step_4"
    write_save(step_folder)  # an older save of this step, complete, its tracker written before this attempt
    (folder / checkpoints.TRACKER).write_text("4")
    watch = watching(folder)
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


def test_the_disk_shows_a_save_before_verl_s_line_and_without_it(tmp_path: Path) -> None:
    """Under Ray the folder comes first and the line 50-100 ms later, or never: the folder alone holds a stop."""
    folder = tmp_path / "run"
    write_save(folder / "global_step_2")
    (folder / checkpoints.TRACKER).write_text("2")
    watch = watching(folder)
    assert not watch.saving
    (folder / "global_step_4").mkdir()
    assert watch.saving_into == folder / "global_step_4"  # an empty folder: the save has begun
    write_save(folder / "global_step_4", roles=("actor",))
    assert watch.saving
    write_save(folder / "global_step_4")
    assert watch.saving  # every file whole, the tracker not yet written
    (folder / checkpoints.TRACKER).write_text("4")
    assert not watch.saving


def test_what_an_earlier_attempt_left_is_no_save_until_verl_writes_into_it_again(tmp_path: Path) -> None:
    """A save cut short by a crash stays beside the tracker's; it must not hold every later stop for the grace."""
    folder = tmp_path / "run"
    write_save(folder / "global_step_2")
    write_save(folder / "global_step_4", roles=("actor",))  # cut short: no critic, no data.pt
    (folder / checkpoints.TRACKER).write_text("2")
    watch = watching(folder)
    assert not watch.saving
    shutil.rmtree(folder / "global_step_2" / "critic")  # verl's rotation empties older saves: no save either
    assert not watch.saving
    time.sleep(0.01)  # a file system whose mtime is coarse still sees a new inode or size
    write_save(folder / "global_step_4")  # this attempt saves step 4 again, over what was left
    assert watch.saving_into == folder / "global_step_4"
    (folder / checkpoints.TRACKER).write_text("4")
    assert not watch.saving


def test_a_tracker_from_a_server_whose_clock_runs_behind_still_ends_the_save(tmp_path: Path) -> None:
    """An NFS server 2 s or more behind writes mtimes in the past: no clock is compared, only what changed."""
    folder = tmp_path / "run"
    (folder / checkpoints.TRACKER).parent.mkdir(parents=True)
    (folder / checkpoints.TRACKER).write_text("2")
    behind = time.time() - 3600
    os.utime(folder / checkpoints.TRACKER, (behind, behind))
    watch = watching(folder)
    watch.take(f"local_global_step_folder: {folder / 'global_step_4'}", attempt=1)
    write_save(folder / "global_step_4")
    (folder / checkpoints.TRACKER).write_text("4")
    os.utime(folder / checkpoints.TRACKER, (behind + 5, behind + 5))  # rewritten, by the server's clock an hour ago
    assert not watch.saving


# verl under Ray, saving global_step_1 quickly and global_step_2 slowly: the folder first, the files over about two
# seconds, the tracker last; the line crosses Ray's log monitor 0.1 s after the folder (LATE=never: not at all). On
# SIGTERM it dies at once, as verl's driver does, cutting the save.
RAY_LIKE_VERL = """
import os, signal, sys, threading, time, zipfile
from pathlib import Path
out, folder, late = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def stopped(signum, frame):
    (out / "signalled").write_text(str(time.monotonic()))
    os._exit(128 + signum)
signal.signal(signal.SIGTERM, stopped)
def saved(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.pkl", b"weights")
def announce(step_folder):
    print(f"(TaskRunner pid=1) local_global_step_folder: {step_folder}", flush=True)
    (out / f"line-{step_folder.name}").touch()
def save(step, pause):
    step_folder = folder / f"global_step_{step}"
    step_folder.mkdir(parents=True)
    if late != "never":
        threading.Timer(0.1, announce, [step_folder]).start()
    time.sleep(pause)
    for role in ("actor", "critic"):
        for prefix in ("model", "optim", "extra_state"):
            saved(step_folder / role / f"{prefix}_world_size_1_rank_0.pt")
        time.sleep(pause)
    saved(step_folder / "data.pt")
    with open(folder / "latest_checkpointed_iteration.txt", "w") as tracker:
        tracker.write(str(step))
    (out / f"saved-{step}").write_text(str(time.monotonic()))
    time.sleep(pause)
    print(f"(TaskRunner pid=1) step:{step} - critic/score/mean:0.5", flush=True)
print("(TaskRunner pid=1) Total training steps: 6", flush=True)
save(1, 0)
(out / "training-2").touch()
time.sleep(1.0)
save(2, 0.7)
time.sleep(600)
"""

TRAIN_ANY = """
import json, sys
from rich.console import Console
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import preflight, train
p40 = preflight.GpuFacts([preflight.GpuDevice("Tesla P40", "6.1", 22.4, 22.2)], ["sm_61"], "12.4", "550.54.14")
train.local_gpu_facts = lambda cap: p40
train.run_preflight = lambda *args: [preflight.Check("gpu", True, "a fake P40")]
train.fit_prompt_length = lambda overrides, user, say: overrides
train.train_command = lambda overrides: json.loads(sys.argv[1])
spec = load_recipe("p40-cu124").image_spec()
sys.exit(train.train(spec, json.loads(sys.argv[2]), dry_run=False, gpu_memory_gib=None, console=Console(),
    gpus_per_node=1))
"""


def start_train(tmp_path: Path, verl: list[str], overrides: Sequence[str] = (), **env: str) -> subprocess.Popen[str]:
    """`verlbox train` (its GPU and preflight faked) supervising VERL, on the experiment tmp_path/checkpoints/run."""
    model = tmp_path / "model"
    user = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}", *overrides]
    environ = os.environ | {
        "VERLBOX_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "VERLBOX_EXPERIMENT": "run",
        "VERLBOX_SKIP_DISK_CHECK": "1",
        "VERLBOX_SAVE_GRACE_S": "60",
        "COLUMNS": "200",
        **env,
    }
    environ.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN_ANY, json.dumps(verl), json.dumps(user)],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(process: subprocess.Popen[str], ready: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.005)


def whole_saves_only(folder: Path, newest: int) -> None:
    """The next start resumes from global_step_NEWEST, whole; no whole save was removed, no partial one is named."""
    steps = checkpoints.scan(folder, CONTENTS)
    assert checkpoints.read_tracker(folder) == newest
    assert checkpoints.tracker_fix(newest, steps, checkpoints.foreign_folders(folder)) is None
    assert [s.step for s in steps if s.complete] == list(range(1, newest + 1))


def files_of(step_folder: Path) -> int:
    return sum(1 for path in step_folder.rglob("*") if path.is_file())


def start_ray_like(tmp_path: Path, late: str) -> tuple[subprocess.Popen[str], Path]:
    """train over RAY_LIKE_VERL, its line LATE ("late" or "never"); the experiment's folder."""
    (tmp_path / "verl.py").write_text(RAY_LIKE_VERL)
    folder = tmp_path / "checkpoints" / "run"
    return start_train(tmp_path, [sys.executable, str(tmp_path / "verl.py"), str(tmp_path), str(folder), late]), folder


def assert_stopped_after_the_save(tmp_path: Path, output: str) -> None:
    assert (tmp_path / "saved-2").exists(), f"verl was stopped mid-save: {output}"
    assert float((tmp_path / "signalled").read_text()) >= float((tmp_path / "saved-2").read_text()), output


MOMENTS: dict[str, Callable[[Path, Path], bool]] = {
    "the folder made, empty": lambda out, folder: (
        (folder / "global_step_2").is_dir() and files_of(folder / "global_step_2") == 0
    ),
    "verl's line arrived": lambda out, folder: (out / "line-global_step_2").exists(),
    "half the files": lambda out, folder: (
        files_of(folder / "global_step_2") >= 3 and not (folder / "global_step_2" / "critic").exists()
    ),
    "the tracker written, no step line yet": lambda out, folder: checkpoints.read_tracker(folder) == 2,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_stop_at_any_moment_of_a_save_under_ray_leaves_it_whole(tmp_path: Path, moment: str) -> None:
    process, folder = start_ray_like(tmp_path, "late")
    wait_until(process, lambda: MOMENTS[moment](tmp_path, folder))
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert_stopped_after_the_save(tmp_path, output)
    whole_saves_only(folder, 2)


def test_a_save_whose_line_never_comes_is_held_from_the_disk(tmp_path: Path) -> None:
    process, folder = start_ray_like(tmp_path, "never")
    wait_until(process, lambda: MOMENTS["half the files"](tmp_path, folder))
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "stopping once verl has written the checkpoint it is saving" in output
    assert_stopped_after_the_save(tmp_path, output)
    whole_saves_only(folder, 2)


def test_a_stop_before_the_save_begins_ends_the_run_at_once(tmp_path: Path) -> None:
    process, folder = start_ray_like(tmp_path, "late")
    wait_until(process, lambda: (tmp_path / "training-2").exists())
    asked = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert float((tmp_path / "signalled").read_text()) - asked < 2, output  # not held: no save was under way
    assert "stopping once verl has written" not in output
    assert not (folder / "global_step_2").exists()
    whole_saves_only(folder, 1)


def test_two_stops_in_a_row_during_a_save_are_both_held(tmp_path: Path) -> None:
    """`docker compose stop` then `down` (or a second Ctrl-C): the second stop must not cut the save either."""
    process, folder = start_ray_like(tmp_path, "late")
    wait_until(process, lambda: MOMENTS["the folder made, empty"](tmp_path, folder))
    process.send_signal(signal.SIGTERM)
    time.sleep(0.6)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "another stop: still holding for the save" in output
    assert float((tmp_path / "signalled").read_text()) >= float((tmp_path / "saved-2").read_text()), output
    whole_saves_only(folder, 2)


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
    verl = [sys.executable, str(tmp_path / "fake_verl.py"), str(tmp_path), str(RECORDED)]
    process = start_train(tmp_path, verl, ["trainer.logger=[tensorboard]"], VERLBOX_SAVE_GRACE_S="120")
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
