"""A week unattended (issue 42): the room a restart needs is asked at the start, a disk full mid-save is said as
such, one `train` per experiment folder, and only folders this run wrote are its saves.

Driven as train.py drives them: `prepare` at the start and before each restart, `check_resume` first at a start,
the run record's `RunLog`. The disk under the checkpoints is the one thing faked (Volume): its capacity, and the
files of others on it. The saves are verl 0.4.1's files (tests/test_checkpoints.py), at the size the estimate
gives them through one sparse shard, so a save of 11.7 GiB takes a few KiB of the real disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_checkpoints import overrides_for, qwen25_05b, run, save_step, tracker
from test_run_record import a_run
from verlbox.errors import BAD_INPUT, PREFLIGHT_FAILED, PreflightFailed
from verlbox.runtime.training import checkpoints, run_record
from verlbox.runtime.training.checkpoints import ModelSize, Settings, check_resume, estimate_step_bytes, model_size
from verlbox.runtime.training.run_record import RunLog, read_runs

MIB = 2**20
SAVE_FREQ = 25  # the profile's trainer.save_freq
KEEP = 2  # the profile's trainer.max_*_ckpt_to_keep
CUT = {"skip": ("critic/model_world_size_1_rank_0.pt", "critic/optim_world_size_1_rank_0.pt"), "data": False}


class Volume:
    """The disk under the checkpoints: CAPACITY bytes, used by what the experiment folder holds (a sparse file at
    its full size, as a real save's would be) and by OTHER bytes of files that are not the run's."""

    def __init__(self, root: Path, capacity: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.capacity, self.other = root, capacity, 0
        monkeypatch.setattr(checkpoints.shutil, "disk_usage", self.usage)

    def used(self) -> int:
        return checkpoints.folder_size(self.root) + self.other

    def usage(self, path: str | Path) -> SimpleNamespace:
        return SimpleNamespace(total=self.capacity, used=self.used(), free=max(0, self.capacity - self.used()))


def verl_save(root: Path, step: int, size: int, **cut: object) -> Path:
    """global_step_STEP as verl 0.4.1 writes it (CUT as save_step takes it), SIZE bytes in all: the actor's model
    shard grows to make up the rest, a torch.save archive's first bytes and its end record around a hole."""
    folder = save_step(root, step, **cut)  # type: ignore[arg-type]
    shard = folder / "actor" / "model_world_size_1_rank_0.pt"
    archive = shard.read_bytes()
    grown = size - checkpoints.folder_size(folder) + len(archive)
    with shard.open("r+b") as handle:
        handle.truncate(grown)
        handle.seek(grown - len(archive))
        handle.write(archive)
    return folder


def verl_attempt(root: Path, volume: Volume, after: int, saves: int, size: int) -> int:
    """One run of verl resumed from step AFTER, to its crash: SAVES saves rotated as verl 0.4.1 rotates them (its
    list of its own saves starts empty; before a save beyond KEEP it deletes the oldest's actor/ and critic/), the
    tracker after each. The disk never runs over. Returns the last step saved."""
    own: list[Path] = []
    for step in range(after + SAVE_FREQ, after + SAVE_FREQ * (saves + 1), SAVE_FREQ):
        if len(own) >= KEEP:
            for role in ("actor", "critic"):
                shutil.rmtree(own[0] / role)
            own.pop(0)
        own.append(verl_save(root, step, size))
        assert volume.used() <= volume.capacity, f"the disk ran over at global_step_{step}"
        tracker(root).write_text(str(step))
    return after + SAVE_FREQ * saves


@pytest.fixture
def qwen(root: Path, tmp_path: Path) -> list[str]:
    """The profile's overrides with Qwen2.5-0.5B's tensors, whose save the estimate puts at 11.7 GiB."""
    model = qwen25_05b(tmp_path / "models" / "qwen")
    return overrides_for(root, f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}")


def save_bytes(overrides: list[str]) -> int:
    settings = Settings.from_overrides(overrides)
    size = model_size(settings.actor_model)
    assert size is not None
    return estimate_step_bytes(size, size, settings.save_contents)


def test_the_start_asks_for_the_room_its_restarts_need(
    root: Path, qwen: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(a) Before: a start asked room for 2 saves, a restart kept 2 and asked room for 2 more, so a 40 GB volume
    passed the start ("will write up to 23.3 GiB") and held the run at its first crash, days in."""
    save = save_bytes(qwen)
    volume = Volume(root, 40 * 10**9, monkeypatch)
    with pytest.raises(PreflightFailed) as refused:
        run(qwen)
    assert str(refused.value) == (
        f"checkpoints: {root} has 37.3 GiB free and 0.0 KiB in this run's saves, room for 37.3 GiB; a restart "
        "keeps 2 save(s) and verl writes up to 2 more until the next one (trainer.max_*_ckpt_to_keep=2): 4 saves "
        "of about 11.7 GiB need 46.7 GiB: free some space, keep fewer saves, or set VERLBOX_SKIP_DISK_CHECK=1 to "
        "start anyway"
    )
    # room for what a restart needs (and a MiB for the tracker): the start passes, every restart passes, and the
    # disk holds the run's every save in between
    volume.capacity = 4 * save + MIB
    assert run(qwen)[-1].startswith(f"checkpoints: {root} has 46.7 GiB free and 0.0 KiB in this run's saves")
    step = 0
    for _ in range(3):
        step = verl_attempt(root, volume, step, saves=3, size=save)
        lines = run(qwen)  # the restart: the earlier saves and verl's emptied one removed, the room checked again
        assert "free and 23.3 GiB in this run's saves, room for 46.7 GiB; a restart keeps 2" in lines[-1], lines
        kept = sorted(path.name for path in root.glob("global_step_*"))
        assert kept == [f"global_step_{step - SAVE_FREQ}", f"global_step_{step}"]


def test_a_disk_full_mid_save_is_the_disk_s_reason_and_its_cut_save_is_room(
    root: Path, qwen: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(b) Before: the restart after a disk full mid-save stopped on run.json as bad input (exit 2), or on the
    free-space refusal with the cut save's bytes counted as used."""
    save = save_bytes(qwen)
    volume = Volume(root, 4 * save + MIB, monkeypatch)
    run(qwen)
    said: list[str] = []
    log = RunLog(root, a_run(), said.append)
    verl_attempt(root, volume, 0, saves=2, size=save)
    # killed halfway through global_step_75 (not for want of room): verl writes it again, into the same files
    verl_save(root, 75, save // 2, **CUT)
    log.restarted("exit 1", 50)
    assert run(qwen)[-1].startswith(f"checkpoints: {root} has 17.5 GiB free and 29.2 GiB in this run's saves, room")

    # someone's files fill the disk while verl writes global_step_75 again
    volume.other = volume.capacity - volume.used()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as full:
        full.setattr("verlbox.files.os.fsync", no_space)
        log.restarted("exit 1", 50)
    assert said == [
        f"run record: {root / 'run.json'}: cannot write here (No space left on device): the disk is full; this "
        "start's entry is written at its next change"
    ]
    with pytest.raises(checkpoints.DiskFull) as halted:
        run(qwen)
    assert halted.value.exit_code == PREFLIGHT_FAILED != BAD_INPUT
    assert str(halted.value) == (
        f"checkpoints: the disk filled while verl wrote global_step_75: {root} has 0.0 KiB free and global_step_75 "
        "holds 5.8 GiB, less than the 11.7 GiB of a save; free some space on that disk (verl writes global_step_75 "
        "again), or set VERLBOX_SKIP_DISK_CHECK=1 to start anyway"
    )
    volume.other = 0  # freed: the next start goes on, and the record has every restart
    assert "refuse" not in run(qwen)[-1]
    log.ended("finished", 75)
    assert [(r.after, r.from_step) for r in read_runs(root)[0].restarts] == [("exit 1", 50), ("exit 1", 50)]


HOLD = """
import sys, time
from pathlib import Path
from verlbox.runtime.training.run_record import one_train
with one_train(Path(sys.argv[1]), print):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_one_train_per_experiment_folder_and_a_killed_one_blocks_nothing(root: Path) -> None:
    """(c) Before: a second `train` on one folder (`docker compose run --rm train train ...` beside `up`) ran, lost
    the first's run.json entries and saved into the same step folders."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        with pytest.raises(PreflightFailed) as refused, run_record.one_train(root, print):
            pytest.fail("a second train got the experiment")
        sentence = str(refused.value)
        assert sentence.startswith(f"{root}: another `train` runs this experiment (pid {holder.pid} on ")
        assert f" on {socket.gethostname()}, since " in sentence and "\n" not in sentence
        assert refused.value.exit_code == PREFLIGHT_FAILED
    finally:
        holder.kill()  # as a container is killed: no exit handler runs, its lock file stays
        holder.wait()
    assert (root / run_record.LOCK_FILE).is_file()
    said: list[str] = []
    mine = rf"\(pid {os.getpid()} on "
    with (
        run_record.one_train(root, said.append),
        pytest.raises(PreflightFailed, match=mine),
        run_record.one_train(root, said.append),
    ):
        pytest.fail("a second train got the experiment")
    assert said == []
    with run_record.one_train(root, said.append):  # released at the end of the block
        pass


@pytest.fixture
def small_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny model's saves fit on any disk: the room check passes with one line."""
    monkeypatch.setattr(checkpoints, "model_size", lambda folder: ModelSize(1000, 0, 0))


def start(overrides: list[str]) -> list[str]:
    """What train.py does before verl starts: check_resume, then prepare."""
    lines: list[str] = []
    check_resume(overrides, "p40", {}, lines.append, dry_run=False)
    checkpoints.prepare(overrides, {}, lines.append, dry_run=False)
    return lines


def test_only_folders_this_run_wrote_are_its_saves(root: Path, tmp_path: Path, small_model: None) -> None:
    """(d) Before: a link to another run's save was counted among the 2 newest (keep=2 removed a real save), the
    tracker was pointed at it (verl would resume another run's weights), and a hand-made folder with notes was
    deleted as an incomplete save."""
    other = save_step(tmp_path / "other-run", 100)
    for step in (25, 50):
        save_step(root, step)
    (root / "global_step_100").symlink_to(other)
    notes = root / "global_step_20"
    notes.mkdir()
    (notes / "notes.txt").write_text("the reward plateaued here")
    copied = save_step(root, 75)  # a save brought over by hand, with its story beside it
    (copied / "README").write_text("from the 1e-5 run")
    tracker(root).write_text("")  # verl truncated it, then the process died
    before = {path: path.read_bytes() for folder in (root, other) for path in folder.rglob("*") if path.is_file()}
    del before[tracker(root)]

    lines = start(overrides_for(root))
    assert lines[0] == (
        "checkpoints: not this run's saves, so never resumed from, removed or counted as room: global_step_20 "
        f"(holds notes.txt, which verl never writes), global_step_75 (holds README, which verl never writes), "
        f"global_step_100 (a link to {other})"
    )
    assert lines[1] == (
        "checkpoints: verl resumes from global_step_50; it has no readable verlbox-run.json: only its world size "
        "(trainer.n_gpus_per_node x trainer.nnodes=1)"
    )
    assert lines[2] == (
        "checkpoints: latest_checkpointed_iteration.txt was empty; pointed it at global_step_50, the newest "
        "complete save"
    )
    assert len(lines) == 4 and " free " in lines[3]  # nothing removed
    assert tracker(root).read_text() == "50"
    assert {path: path.read_bytes() for path in before} == before and (root / "global_step_100").is_symlink()

    tracker(root).write_text("100")  # a tracker naming the link: verl would load the other run's weights
    assert start(overrides_for(root))[2] == (
        f"checkpoints: latest_checkpointed_iteration.txt named global_step_100, which is not this run's save (a link "
        f"to {other}); pointed it at global_step_50, the newest complete save"
    )


def test_a_lora_run_s_adapter_is_part_of_its_save(root: Path, small_model: None) -> None:
    """verl 0.4.1 writes actor/lora_adapter/ into every save when actor_rollout_ref.model.lora_rank > 0: such
    a save is this run's, resumed from and kept (a review found every LoRA save refused as foreign, so each
    restart started over from step 0)."""
    for step in (25, 50):
        adapter = save_step(root, step) / "actor" / "lora_adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    tracker(root).write_text("50")
    lines = start(overrides_for(root, "actor_rollout_ref.model.lora_rank=32"))
    assert not any("not this run's" in line for line in lines), lines
    assert lines[0].startswith("checkpoints: verl resumes from global_step_50") and tracker(root).read_text() == "50"
    assert (root / "global_step_25" / "actor" / "lora_adapter").is_dir()
