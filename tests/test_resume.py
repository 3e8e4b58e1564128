"""A resume is checked before verl starts: a save made with other settings is refused, naming what changed.

verl 0.4.1 saves no config, and takes every setting from the new start: with two GPUs over a one-GPU save it
fails looking for `actor/model_world_size_2_rank_0.pt`; a new lr is overwritten by the saved optimizer's
param_groups; the step comes from the folder while the total is counted from the new batch. The fake step
folders are those of tests/test_checkpoints.py (verl's file names).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from conftest import pass_the_gpu_preflight
from test_checkpoints import save_step, tracker
from verlbox.errors import PreflightFailed, UsageError
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import checkpoints, hub
from verlbox.runtime.training import train as train_module
from verlbox.runtime.training.checkpoints import RUN_RECORD, ModelSize, check_resume
from verlbox.runtime.training.profile import Topology, TrainingPlan
from verlbox.runtime.training.train import merge_overrides

WORLD_SIZE = "trainer.n_gpus_per_node x trainer.nnodes"


def overrides_for(root: Path, *extra: str, gpus: int = 1) -> list[str]:
    """The p40 profile's overrides for GPUS GPUs (its batch sizes scale with them), checkpoints in ROOT."""
    plan = TrainingPlan(
        load_recipe("p40-cu124").image_spec(),
        environ={"VERLBOX_CHECKPOINT_DIR": str(root.parent), "VERLBOX_EXPERIMENT": root.name},
        topology=Topology(gpus, 1),
    )
    return merge_overrides(plan.overrides, list(extra))


def start(overrides: list[str], *, dry_run: bool = False, environ: dict[str, str] | None = None) -> list[str]:
    lines: list[str] = []
    check_resume(overrides, "p40", environ or {}, lines.append, dry_run=dry_run)
    return lines


def refusal(overrides: list[str], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(PreflightFailed) as refused:
        start(overrides, environ=environ)
    assert refused.value.exit_code == 3 and "\n" not in str(refused.value)
    return str(refused.value)


def record(root: Path) -> dict[str, str | None]:
    return json.loads((root / RUN_RECORD).read_text())["settings"]


@pytest.fixture
def saved(root: Path) -> Path:
    """A one-GPU run of the profile that recorded its settings, then saved step 25."""
    assert start(overrides_for(root)) == []  # nothing to resume: nothing checked, the settings recorded
    save_step(root, 25)
    tracker(root).write_text("25")
    return root


def test_the_record_holds_the_settings_a_resume_must_keep(saved: Path) -> None:
    settings = record(saved)
    assert settings[WORLD_SIZE] == "1" and settings["profile"] == "p40"
    assert settings["data.train_batch_size"] == "64"
    assert settings["actor_rollout_ref.actor.ppo_mini_batch_size"] == "16"
    assert settings["actor_rollout_ref.actor.optim.lr"] == "1e-6" and settings["critic.optim.lr"] == "1e-5"
    assert settings["actor_rollout_ref.model.path"] == "/models/Qwen2.5-0.5B-Instruct"
    assert settings["trainer.total_epochs"] == "1" and settings["trainer.total_training_steps"] is None
    assert "actor model commit" not in settings  # no fetch record in the model folder


def test_the_same_settings_resume(saved: Path) -> None:
    lines = start(overrides_for(saved, "actor_rollout_ref.actor.optim.lr=0.000001"))  # the same number
    assert lines == [f"checkpoints: verl resumes from global_step_25; its settings match this run's ({WORLD_SIZE}=1)"]


def test_two_gpus_over_a_one_gpu_save_are_refused(saved: Path) -> None:
    # the profile scales the batch with the GPUs, so three settings changed, the world size first
    assert refusal(overrides_for(saved, gpus=2)) == (
        f"checkpoints: {saved}/global_step_25 was saved with {WORLD_SIZE}=1 and data.train_batch_size=64 and "
        "actor_rollout_ref.actor.ppo_mini_batch_size=16 and this run asks for 2 and 128 and 32 (verl loads only "
        "the rank files of its own world size; the saved step counts batches of the old size, the run's total "
        "those of the new; the PPO updates per step would change midway through the run): restore the settings, "
        "or start a new experiment in a fresh folder with VERLBOX_EXPERIMENT=exp-2 (nothing is deleted)"
    )


def test_the_world_size_is_read_from_the_rank_files_without_a_record(saved: Path) -> None:
    """Saves made before verlbox kept a record: their rank files still say the world size."""
    (saved / RUN_RECORD).unlink()
    assert refusal(overrides_for(saved, gpus=2)).startswith(
        f"checkpoints: {saved}/global_step_25 was saved with {WORLD_SIZE}=1 and this run asks for 2 ("
    )
    assert start(overrides_for(saved)) == [
        f"checkpoints: verl resumes from global_step_25; it has no readable {RUN_RECORD}: only its world size "
        f"({WORLD_SIZE}=1)"
    ]
    assert record(saved)[WORLD_SIZE] == "1"


def test_a_bigger_batch_is_refused(saved: Path) -> None:
    sentence = refusal(overrides_for(saved, "data.train_batch_size=128"))
    assert sentence.startswith(
        f"checkpoints: {saved}/global_step_25 was saved with data.train_batch_size=64 and this run asks for 128 ("
    )
    assert sentence.endswith(
        ": restore the setting, or start a new experiment in a fresh folder with "
        "VERLBOX_EXPERIMENT=exp-2 (nothing is deleted)"
    )


def test_a_new_learning_rate_is_refused(saved: Path) -> None:
    assert "was saved with actor_rollout_ref.actor.optim.lr=1e-6 and this run asks for 1e-5 (the saved optimizer" in (
        refusal(overrides_for(saved, "actor_rollout_ref.actor.optim.lr=1e-5"))
    )
    assert "critic.optim.warmup_style=unset (verl's default) and this run asks for cosine" in refusal(
        overrides_for(saved, "critic.optim.warmup_style=cosine")
    )


def test_a_setting_an_older_record_lacks_is_not_compared(saved: Path) -> None:
    data = json.loads((saved / RUN_RECORD).read_text())
    del data["settings"]["data.train_batch_size"]
    (saved / RUN_RECORD).write_text(json.dumps(data))
    assert start(overrides_for(saved, "data.train_batch_size=128"))[0].startswith("checkpoints: verl resumes from")


def test_a_fetched_model_is_compared_by_its_commit(saved: Path, tmp_path: Path) -> None:
    def fetched(folder: Path, commit: str) -> Path:
        folder.mkdir(parents=True)
        entry = hub.Record("Qwen/Qwen2.5-0.5B-Instruct", "model", "main", commit, "https://huggingface.co", ())
        (folder / hub.RECORD).write_text(entry.to_json())
        return folder

    first, moved, other = (tmp_path / name for name in ("first", "moved", "other"))
    model = [f"actor_rollout_ref.model.path={fetched(first, 'a' * 40)}", f"critic.model.path={first}"]
    (saved / RUN_RECORD).unlink()
    start(overrides_for(saved, *model))
    assert record(saved)["actor model commit"] == "a" * 40
    moved_model = [f"actor_rollout_ref.model.path={fetched(moved, 'a' * 40)}", f"critic.model.path={moved}"]
    assert start(overrides_for(saved, *moved_model))[0].startswith("checkpoints: verl resumes from")
    sentence = refusal(
        overrides_for(saved, f"actor_rollout_ref.model.path={fetched(other, 'b' * 40)}", f"critic.model.path={other}")
    )
    assert f"actor model commit={'a' * 40} and critic model commit={'a' * 40} and this run asks for" in sentence
    assert "(the saved weights are another model's)" in sentence


def test_a_new_experiment_starts_in_a_fresh_folder_and_deletes_nothing(saved: Path) -> None:
    (saved.parent / "exp-2").mkdir()  # taken: by another experiment, or an empty folder
    before = {path: path.read_bytes() for path in saved.rglob("*") if path.is_file()}
    assert "VERLBOX_EXPERIMENT=exp-3 (nothing is deleted)" in refusal(overrides_for(saved, gpus=2))
    fresh = saved.parent / "exp-3"
    two_gpus = overrides_for(fresh, gpus=2)  # VERLBOX_EXPERIMENT=exp-3, as compose passes it from .env
    assert start(two_gpus, environ={"VERLBOX_EXPERIMENT": "exp-3"}) == []
    assert record(fresh)[WORLD_SIZE] == "2"
    assert {path: path.read_bytes() for path in saved.rglob("*") if path.is_file()} == before
    # a folder the user named: the refusal names the setting that moves it
    mine = saved.parent / "mine"
    save_step(mine, 25)
    ours = overrides_for(saved, f"trainer.default_local_dir={mine}")
    start(ours)
    assert refusal([*ours, "data.train_batch_size=128"]).endswith(
        f"with trainer.default_local_dir={mine}-2 (nothing is deleted)"
    )


def test_without_a_save_to_resume_nothing_is_checked_and_the_record_is_rewritten(saved: Path) -> None:
    assert start(overrides_for(saved, "trainer.resume_mode=disable", "data.train_batch_size=128")) == []
    assert record(saved)["data.train_batch_size"] == "128"
    fresh = saved.parent / "fresh"
    assert start(overrides_for(fresh, gpus=2)) == [] and record(fresh)[WORLD_SIZE] == "2"
    save_step(fresh, 25, world_size=2, skip=("critic/optim_world_size_2_rank_1.pt",))  # cut short: verl starts anew
    assert start(overrides_for(fresh, gpus=1)) == [] and record(fresh)[WORLD_SIZE] == "1"


def test_a_resume_path_is_checked_against_its_own_folder(saved: Path) -> None:
    elsewhere = saved.parent / "next"
    resume = [f"trainer.default_local_dir={elsewhere}", "trainer.resume_mode=resume_path"]
    step = saved / "global_step_25"
    assert "this run asks for 2" in refusal(overrides_for(saved, *resume, f"trainer.resume_from_path={step}", gpus=2))
    assert start(overrides_for(saved, *resume, f"trainer.resume_from_path={step}"))[0].startswith(
        "checkpoints: verl resumes from global_step_25; its settings match"
    )
    assert (elsewhere / RUN_RECORD).is_file()


def test_a_dry_run_says_what_it_would_refuse_and_writes_nothing(saved: Path) -> None:
    written = (saved / RUN_RECORD).read_text()
    lines = start(overrides_for(saved, gpus=2), dry_run=True)
    assert len(lines) == 1 and lines[0].startswith(
        f"checkpoints: would refuse to start: {saved}/global_step_25 was saved with {WORLD_SIZE}=1 and"
    )
    assert (saved / RUN_RECORD).read_text() == written
    fresh = saved.parent / "fresh"
    assert start(overrides_for(fresh), dry_run=True) == [] and not fresh.exists()


def test_the_record_is_replaced_in_one_step(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash mid-write leaves the old record whole, never half a file: a temporary file, then a rename."""
    written = (saved / RUN_RECORD).read_text()

    def crash(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("verlbox.files.os.replace", crash)
    with pytest.raises(UsageError, match="No space left on device"):
        start(overrides_for(saved))
    assert (saved / RUN_RECORD).read_text() == written
    assert sorted(path.name for path in saved.iterdir() if path.name.startswith(".")) == []


def test_train_refuses_before_verl_starts_and_changes_nothing(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring: after the preflight passes, before the tracker repair and verl; a refusal is exit 3."""
    spec = load_recipe("p40-cu124").image_spec()
    for name, value in {"VERLBOX_CHECKPOINT_DIR": str(root.parent), "VERLBOX_EXPERIMENT": root.name}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pass_the_gpu_preflight(monkeypatch, train_module)
    # a tiny model's saves fit on any disk: the free-space check passes
    monkeypatch.setattr(checkpoints, "model_size", lambda folder: ModelSize(1000, 0, 0))
    started: list[list[str]] = []
    monkeypatch.setattr(train_module.supervisor, "supervise", lambda command, *args, **kw: started.append(command) or 0)
    output = io.StringIO()
    console = Console(file=output, soft_wrap=True, width=10_000)

    train_module.train(spec, [], dry_run=False, gpu_memory_gib=None, console=console, gpus_per_node=1)
    assert len(started) == 1 and record(root)[WORLD_SIZE] == "1"
    save_step(root, 25)
    tracker(root).write_text("")  # the repair comes after the check: a refused start leaves it as it is
    before = sorted(path.name for path in root.iterdir())

    with pytest.raises(PreflightFailed, match=f"was saved with {WORLD_SIZE}=1 and .* this run asks for 2 and") as no:
        train_module.train(spec, [], dry_run=False, gpu_memory_gib=None, console=console, gpus_per_node=2)
    assert no.value.exit_code == 3 and len(started) == 1
    assert sorted(path.name for path in root.iterdir()) == before and tracker(root).read_text() == ""

    train_module.train(spec, [], dry_run=True, gpu_memory_gib=None, console=console, gpus_per_node=2)
    assert "checkpoints: would refuse to start: " in output.getvalue() and len(started) == 1

    train_module.train(spec, [], dry_run=False, gpu_memory_gib=None, console=console, gpus_per_node=1)
    assert len(started) == 2 and tracker(root).read_text() == "25"
    assert "checkpoints: verl resumes from global_step_25; its settings match this run's" in output.getvalue()


def test_the_other_profile_over_the_same_folder_is_refused(saved: Path) -> None:
    # compose passes an empty VERLBOX_EXPERIMENT when .env leaves the run name to the profile
    with pytest.raises(PreflightFailed) as refused:
        check_resume(overrides_for(saved), "grpo", {"VERLBOX_EXPERIMENT": ""}, print, dry_run=False)
    sentence = str(refused.value)
    assert "was saved with profile=p40 and this run asks for grpo" in sentence
    assert sentence.endswith("with VERLBOX_EXPERIMENT=exp-2 (nothing is deleted)")
