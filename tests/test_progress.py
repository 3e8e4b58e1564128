"""Watching a run: the compact step line, verl's log and metrics file, and a stop that ends every process,
all from verl's own console output recorded on the lent GPU (tests/fixtures/verl-run/console.txt)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import REPO
from verlbox.runtime.training import progress
from verlbox.runtime.training.progress import Progress, RunWatch, parse_step, read_metrics

RECORDED = REPO / "tests" / "fixtures" / "verl-run" / "console.txt"


def recorded_lines() -> list[str]:
    return [line for line in RECORDED.read_text().splitlines() if not line.startswith("# verlbox:")]


def recorded_steps() -> list[tuple[int, dict[str, float]]]:
    return [step for line in recorded_lines() if (step := parse_step(line)) is not None]


def watched(folder: Path, lines: list[str], memory_limit_gib: float | None = 24) -> tuple[RunWatch, list[str]]:
    shown: list[str] = []
    watch = RunWatch(
        folder, Progress(samples_per_step=16, memory_limit_gib=memory_limit_gib), lambda t: shown.append(str(t))
    )
    for line in lines:
        watch.take(line, attempt=1)
    return watch, shown


def test_verl_s_step_lines_parse_into_numbers_with_ray_s_prefix_and_colours_gone() -> None:
    steps = recorded_steps()
    assert steps, f"no step line in {RECORDED}"
    numbers = [number for number, _ in steps]
    assert numbers == sorted(numbers) and numbers[0] >= 0
    for _, metrics in steps:
        if progress.STEP_SECONDS in metrics:  # a training step, not the validation before training
            assert metrics[progress.STEP_SECONDS] > 0
            assert progress.REWARD in metrics and progress.RESPONSE_LENGTH in metrics
            assert 0 < metrics[progress.MEMORY_RESERVED] < 140
    assert parse_step("(TaskRunner pid=1) Training Progress:  10%|#  | 1/10") is None


def test_each_step_is_one_compact_line_and_verl_s_line_goes_to_the_log(tmp_path: Path) -> None:
    lines = recorded_lines()
    watch, shown = watched(tmp_path, lines)
    steps = recorded_steps()
    compact = [line for line in shown if line.startswith("step ")]
    assert len(compact) == len(steps)
    assert not any("global_seqlen" in line or "Training Progress" in line for line in shown)
    total = watch.progress.total_steps
    assert total is not None, "the recording holds verl's 'Total training steps' line"
    last_number, last_metrics = steps[-1]
    seconds = last_metrics[progress.STEP_SECONDS]
    reserved = last_metrics[progress.MEMORY_RESERVED]
    assert compact[-1].startswith(f"step {last_number}/{total}  {seconds:.1f} s/step  {16 / seconds:.2f} samples/s")
    assert f"reward {last_metrics[progress.REWARD]:.3f}" in compact[-1]
    assert f"memory {reserved:.1f}/24 GiB" in compact[-1]
    # lines that are not steps are shown as they are: a warning or traceback is seen where it happens
    others = [line for line in lines if parse_step(line) is None and "Training Progress" not in line]
    assert [line for line in shown if not line.startswith("step ")] == others
    # the metrics file holds every step's numbers, read back as written
    assert [(r.step, r.metrics) for r in read_metrics(tmp_path / progress.METRICS_FILE)] == steps


def test_validation_and_eta_show_on_the_line() -> None:
    line = Progress(samples_per_step=64, memory_limit_gib=None, total_steps=100)
    for step in range(1, 4):
        text = str(line.line(step, {progress.STEP_SECONDS: 60.0, "val-core/openai/gsm8k/reward/mean@253": 0.25}))
    assert text == "step 3/100  60.0 s/step  1.07 samples/s  validation 0.250  ETA 1 h 37 min"
    last = str(line.line(100, {progress.STEP_SECONDS: 60.0, progress.MEMORY_RESERVED: 15.2}))
    assert last.endswith("memory 15.2 GiB  last step")
    assert progress.show_eta(3 * 86400 + 5 * 3600) == "3 d 5 h"


def test_a_save_in_progress_is_seen_until_its_step_line(tmp_path: Path) -> None:
    save_line = "(TaskRunner pid=7) local_global_step_folder: /checkpoints/exp/global_step_2"
    watch, _ = watched(tmp_path, [save_line])
    assert watch.saving
    watch.take(next(line for line in recorded_lines() if parse_step(line)), attempt=1)
    assert not watch.saving


def test_a_metrics_line_cut_short_by_a_crash_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / progress.METRICS_FILE
    path.write_text('{"step": 1, "at": "t", "attempt": 1, "metrics": {"a": 1.0}}\n{"step": 2, "at": "t", "att')
    assert [r.step for r in read_metrics(path)] == [1]


FAKE_VERL = """
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
lines = Path(sys.argv[2]).read_text().splitlines()
steps = [l for l in lines if " step:" in l or l.startswith("step:")]
# what Ray leaves: one in verl's group that ignores SIGTERM, one that left the group
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
(out / "pids").write_text(f"{stubborn.pid} {escaped.pid}")
def stopped(signum, frame):
    with open(out / "events", "a") as f:
        f.write("signal\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
print("(TaskRunner pid=1) Total training steps: 6", flush=True)
print(steps[0], flush=True)
print("(TaskRunner pid=1) local_global_step_folder: /checkpoints/run/global_step_2", flush=True)
(out / "saving").touch()
time.sleep(3)
with open(out / "events", "a") as f:
    f.write("saved\\n")
print(steps[1], flush=True)
time.sleep(600)
"""

TRAIN = """
import json, sys
from rich.console import Console
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import preflight, train
p40 = preflight.GpuFacts([preflight.GpuDevice("Tesla P40", "6.1", 22.4, 22.2)], ["sm_61"], "12.4", "550.54.14")
train.local_gpu_facts = lambda cap: p40
train.run_preflight = lambda *args: [preflight.Check("gpu", True, "a fake P40")]
train.fit_prompt_length = lambda overrides, user, say: overrides
train.train_command = lambda overrides: [sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]]
spec = load_recipe("p40-cu124").image_spec()
user = json.loads(sys.argv[4])
sys.exit(train.train(spec, user, dry_run=False, gpu_memory_gib=None, console=Console(), gpus_per_node=1))
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_to_train_waits_for_a_save_then_ends_every_process_verl_started(tmp_path: Path) -> None:
    """docker stop during a save: the save is let finish, verl gets the signal, and what verl left running
    (in its group or out of it, ignoring SIGTERM or not) is ended, all within compose's grace period."""
    (tmp_path / "fake_verl.py").write_text(FAKE_VERL)
    model = tmp_path / "model"
    user = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
    env = dict(
        os.environ,
        VERLBOX_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        VERLBOX_EXPERIMENT="run",
        VERLBOX_SKIP_DISK_CHECK="1",
        COLUMNS="200",
    )
    env.pop("RAY_ADDRESS", None)
    command = [
        sys.executable,
        "-c",
        TRAIN,
        str(tmp_path / "fake_verl.py"),
        str(tmp_path),
        str(RECORDED),
        json.dumps(user),
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "saving").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    stopped_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - stopped_at
    assert process.returncode == 128 + signal.SIGTERM, output
    assert (tmp_path / "events").read_text().split() == ["saved", "signal"], output
    assert took < 30, f"{took:.0f} s: beyond compose's stop_grace_period"
    stubborn, escaped = map(int, (tmp_path / "pids").read_text().split())
    assert not alive(stubborn) and not alive(escaped), output
    assert "stopping once verl has written the checkpoint it is saving" in output
    assert "ended 2 process(es) verl left running" in output
    compact = [line for line in output.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in compact] == [f"{n}/6" for n, _ in recorded_steps()[:2]], output
    assert "global_seqlen" not in output
    folder = tmp_path / "checkpoints" / "run"
    assert sum(parse_step(line) is not None for line in (folder / progress.LOG_FILE).read_text().splitlines()) == 2
    assert len(read_metrics(folder / progress.METRICS_FILE)) == 2


def test_progress_mode_plain_leaves_verl_s_lines_as_they_are_and_still_holds_a_stop_during_a_save(
    tmp_path: Path,
) -> None:
    """Plain: no compact line and no files, but the save marker is still read (before, plain dropped the hold)."""
    from verlbox.errors import UsageError
    from verlbox.runtime.training import train

    console = Console(file=io.StringIO())
    watch = train.run_watch(tmp_path, [], {"VERLBOX_PROGRESS": "plain"}, None, console)
    assert isinstance(watch, RunWatch) and watch.folder is None
    coloured = "\x1b[36m(TaskRunner pid=1)\x1b[0m local_global_step_folder: /checkpoints/global_step_5"
    reader = watch.follow(io.BytesIO(f"{coloured}\nother line\n".encode()))
    reader.join(timeout=10)
    assert watch.saving and console.file.getvalue() == f"{coloured}\nother line\n"
    assert list(tmp_path.iterdir()) == []
    assert isinstance(train.run_watch(tmp_path, [], {}, None, console), RunWatch)
    with pytest.raises(UsageError, match=r"^VERLBOX_PROGRESS=quiet: expected compact"):
        train.run_watch(tmp_path, [], {"VERLBOX_PROGRESS": "quiet"}, None, console)


def test_the_profile_turns_on_verl_s_tensorboard_logger_writing_into_the_run_folder(tmp_path: Path) -> None:
    from verlbox.host.recipes.recipe import load_recipe
    from verlbox.runtime.training.profile import Topology, TrainingPlan
    from verlbox.runtime.training.train import train_environment

    plan = TrainingPlan(load_recipe("p40-cu124").image_spec(), {}, Topology(1, 1, "given"), None)
    assert "trainer.logger=[console,tensorboard]" in plan.overrides
    env = train_environment(plan, {}, None, tmp_path / "run")
    assert env["TENSORBOARD_DIR"] == str(tmp_path / "run" / "tensorboard")


def test_a_log_that_cannot_be_written_still_leaves_the_pipe_read_to_its_end(tmp_path: Path) -> None:
    """A full or failing checkpoint disk: the reader goes on (verl would block on a full pipe otherwise), says
    once per file that it cannot write, and the console keeps its compact lines."""
    (tmp_path / "not-a-folder").write_text("")
    shown: list[str] = []
    watch = RunWatch(tmp_path / "not-a-folder", Progress(16, 24), lambda t: shown.append(str(t)))
    lines = recorded_lines()
    reader = watch.follow(io.BytesIO("\n".join(lines).encode() + b"\n"))
    reader.join(timeout=10)
    assert not reader.is_alive()
    said = [line for line in shown if line.startswith("verlbox: cannot write")]
    assert len(said) == 2 and {progress.LOG_FILE in said[0], progress.METRICS_FILE in said[1]} == {True}
    steps = [line for line in lines if parse_step(line) is not None]
    assert len([line for line in shown if line.startswith("step ")]) == len(steps)


def test_a_file_that_failed_is_written_again_once_the_disk_recovers_on_a_line_of_its_own(tmp_path: Path) -> None:
    """Before, one failed write stopped verl.log and metrics.jsonl for the container's life, and the next
    attempt's header was glued onto a line cut mid-write."""
    said: list[str] = []
    blocked = tmp_path / "run"
    blocked.write_text("")  # a file where the folder belongs: every write fails, as on a full disk
    sink = progress.FileSink(blocked / "verl.log", said.append)
    sink.write("first\n")
    sink.write("second\n")
    assert said == [f"verlbox: cannot write {blocked / 'verl.log'} (File exists); trying again at each line"]
    blocked.unlink()
    blocked.mkdir()
    (blocked / "verl.log").write_text("step 3 cut mid-li")
    sink.write("third\n")
    assert said[1:] == [f"verlbox: writing {blocked / 'verl.log'} again"]
    sink.close()
    assert (blocked / "verl.log").read_text() == "step 3 cut mid-li\nthird\n"


def test_a_failing_console_never_stops_the_reader_nor_the_files_nor_save_detection(tmp_path: Path) -> None:
    """stderr gone (EIO, a broken pipe): before, the reader thread died and verl blocked on a full pipe."""

    def broken_console(text: object) -> None:
        raise OSError(5, "Input/output error")

    watch = RunWatch(tmp_path, Progress(16, 24), broken_console)
    lines = [f"{'x' * 1000} {n}" for n in range(400)] + ["local_global_step_folder: /checkpoints/global_step_5"]
    reader = watch.follow(io.BytesIO("\n".join(lines).encode() + b"\n"))
    reader.join(timeout=10)
    assert not reader.is_alive() and watch.saving and watch.console_failed == "OSError: [Errno 5] Input/output error"
    logged = (tmp_path / progress.LOG_FILE).read_text().splitlines()
    assert logged[1:] == lines
