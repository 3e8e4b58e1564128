"""The checkpoint folder before verl starts: tracker repaired, stale saves removed, free space checked.

The fake step folders hold the files verl 0.4.1 writes (the wheel's code):
- ray_trainer.py 810-839 (`_save_checkpoint`): `global_step_{N}/actor`, `global_step_{N}/critic` (with a
  critic), then `global_step_{N}/data.pt`, then `latest_checkpointed_iteration.txt` opened with "w";
- fsdp_checkpoint_manager.py 204-206: per rank `model_world_size_{W}_rank_{R}.pt`, `optim_...`,
  `extra_state_...`; 236-258: rank 0's `huggingface/` (config, tokenizer) and `fsdp_config.json`;
- checkpoint_manager.py 132-140 and 184-187: verl's own rotation deletes `.../actor` and `.../critic`,
  leaving `global_step_{N}/data.pt`; 165-194: `find_latest_ckpt_path`, which resume_mode=auto uses.
"""

from __future__ import annotations

import ast
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from conftest import pass_the_gpu_preflight
from verlbox.errors import PreflightFailed
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import checkpoints
from verlbox.runtime.training import train as train_module
from verlbox.runtime.training.checkpoints import (
    ModelSize,
    Settings,
    estimate_step_bytes,
    model_size,
    prepare,
    scan,
    stale_folders,
)
from verlbox.runtime.training.patches import patch_set_for
from verlbox.runtime.training.profile import Topology, TrainingPlan
from verlbox.runtime.training.run_record import read_runs
from verlbox.runtime.training.train import merge_overrides

GIB = 2**30
QWEN_VOCAB, QWEN_HIDDEN, QWEN_LAYERS, QWEN_INTERMEDIATE, QWEN_KV = 151936, 896, 24, 4864, 128


def save_step(
    root: Path,
    step: int,
    *,
    world_size: int = 1,
    roles: tuple[str, ...] = ("actor", "critic"),
    skip: tuple[str, ...] = (),
    data: bool = True,
    shard_bytes: int = 1024,
) -> Path:
    """A step folder as verl 0.4.1 saves it; SKIP names files (relative to it) a cut-short save lacks."""
    folder = root / f"global_step_{step}"
    files = [
        f"{role}/{kind}_world_size_{world_size}_rank_{rank}.pt"
        for role in roles
        for rank in range(world_size)
        for kind in ("model", "optim", "extra_state")
    ]
    files += [f"{role}/{name}" for role in roles for name in ("huggingface/config.json", "fsdp_config.json")]
    files += ["data.pt"] if data else []
    for name in files:
        if name not in skip:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".pt"):
                torch_saved(folder / name, b"\1" * shard_bytes)
            else:
                (folder / name).write_bytes(b"\0" * shard_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rotated_by_verl(root: Path, step: int) -> Path:
    """What verl's own rotation leaves of a save: actor/ and critic/ deleted, data.pt kept."""
    folder = root / f"global_step_{step}"
    folder.mkdir(parents=True)
    torch_saved(folder / "data.pt", b"\1" * 10)
    return folder


def verl_find_latest(verl_tree: Path) -> Callable[[str], str | None]:
    """verl 0.4.1's own find_latest_ckpt_path, compiled from the wheel without importing verl (torch)."""
    source = verl_tree / "verl/utils/checkpoint/checkpoint_manager.py"
    module = ast.parse(source.read_text())
    wanted = {"find_latest_ckpt_path", "get_checkpoint_tracker_filename"}
    module.body = [node for node in module.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    namespace: dict[str, Any] = {"os": os}
    exec(compile(module, str(source), "exec"), namespace)
    return namespace["find_latest_ckpt_path"]


def overrides_for(root: Path, *extra: str) -> list[str]:
    """The p40 profile's overrides with the checkpoints in ROOT (as VERLBOX_CHECKPOINT_DIR gives them)."""
    plan = TrainingPlan(
        load_recipe("p40-cu124").image_spec(),
        environ={"VERLBOX_CHECKPOINT_DIR": str(root.parent), "VERLBOX_EXPERIMENT": root.name},
        topology=Topology(1, 1),
    )
    return merge_overrides(plan.overrides, list(extra))


def run(overrides: list[str], *, dry_run: bool = False, environ: dict[str, str] | None = None) -> list[str]:
    lines: list[str] = []
    prepare(overrides, environ or {}, lines.append, dry_run=dry_run)
    return lines


@pytest.fixture
def small_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of the tracker and the folders: the profile's model folder is not here, and a tiny model's
    saves fit on any disk, so the free-space check passes with one line."""
    monkeypatch.setattr(checkpoints, "model_size", lambda folder: ModelSize(1000, 0, 0))


def tracker(root: Path) -> Path:
    return root / "latest_checkpointed_iteration.txt"


def test_the_profile_is_read_from_the_merged_overrides(root: Path) -> None:
    settings = Settings.from_overrides(overrides_for(root))
    assert (settings.folder, settings.keep, settings.save_freq, settings.resume_mode) == (root, 2, 25, "auto")
    assert set(settings.load_contents) == {"actor", "critic"}
    assert settings.load_contents["critic"] == ("model", "optimizer", "extra")
    assert Settings.from_overrides(overrides_for(root, "trainer.max_critic_ckpt_to_keep=3")).keep == 3
    assert Settings.from_overrides(overrides_for(root, "trainer.max_actor_ckpt_to_keep=null")).keep is None
    grpo = Settings.from_overrides(overrides_for(root, "algorithm.adv_estimator=grpo"))
    assert set(grpo.load_contents) == {"actor"} and grpo.critic_model is None
    only_model = Settings.from_overrides(
        overrides_for(root, "actor_rollout_ref.actor.checkpoint.save_contents=[model]")
    )
    assert only_model.load_contents["actor"] == ("model",) and only_model.save_contents["actor"] == ("model",)


def test_an_empty_tracker_is_rewritten_to_the_newest_complete_save(
    root: Path, verl_tree: Path, small_model: None
) -> None:
    find_latest = verl_find_latest(verl_tree)
    save_step(root, 25)
    save_step(root, 50)
    tracker(root).write_text("")  # verl truncated it, then the process died
    with pytest.raises(ValueError):  # what every start of verl hits without the repair
        find_latest(str(root))
    lines = run(overrides_for(root))
    assert lines[0] == (
        "checkpoints: latest_checkpointed_iteration.txt was empty; pointed it at global_step_50, "
        "the newest complete save"
    )
    assert tracker(root).read_text() == "50"
    assert find_latest(str(root)) == str(root / "global_step_50")
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("global_step_")) == [
        "global_step_25",
        "global_step_50",
    ]


def test_a_dangling_tracker_is_fixed(root: Path, verl_tree: Path, small_model: None) -> None:
    find_latest = verl_find_latest(verl_tree)
    save_step(root, 25)
    save_step(root, 50)
    tracker(root).write_text("75")  # global_step_75 deleted by hand
    assert find_latest(str(root)) is None  # verl would train from scratch, silently
    lines = run(overrides_for(root))
    assert lines[0].startswith("checkpoints: latest_checkpointed_iteration.txt named global_step_75, which is missing;")
    assert find_latest(str(root)) == str(root / "global_step_50")


@pytest.mark.parametrize(
    "cut_short",
    [
        {"skip": ("critic/optim_world_size_2_rank_1.pt",)},  # one rank of the critic never finished
        {"skip": ("actor/model_world_size_2_rank_0.pt",)},
        {"roles": ("actor",)},  # died before the critic's save
        {"data": False},  # the ranks' files may be cut short: the driver never got back to write data.pt
    ],
)
def test_an_incomplete_newest_save_falls_back_to_the_one_before(
    root: Path, verl_tree: Path, small_model: None, cut_short: dict[str, Any]
) -> None:
    save_step(root, 25, world_size=2)
    save_step(root, 50, world_size=2, **cut_short)
    tracker(root).write_text("50")
    lines = run(overrides_for(root))
    assert lines[0] == (
        "checkpoints: latest_checkpointed_iteration.txt named global_step_50, which is incomplete (a save cut "
        "short); pointed it at global_step_25, the newest complete save"
    )
    assert len(lines) == 2 and lines[1].startswith("checkpoints: ") and " free " in lines[1]
    assert verl_find_latest(verl_tree)(str(root)) == str(root / "global_step_25")
    # the incomplete one is newer than the save resumed from: verl writes its step again later
    assert (root / "global_step_50").is_dir()


def test_files_of_two_world_sizes_are_complete_only_for_one_of_them(root: Path) -> None:
    folder = save_step(root, 25, world_size=1)
    save_step(root, 25, world_size=2, skip=("critic/extra_state_world_size_2_rank_1.pt",))
    roles = Settings.from_overrides(overrides_for(root)).load_contents
    assert scan(root, roles)[0].complete
    (folder / "actor/model_world_size_1_rank_0.pt").unlink()
    assert not scan(root, roles)[0].complete


def test_no_complete_save_removes_the_tracker(root: Path, small_model: None) -> None:
    save_step(root, 25, skip=("critic/optim_world_size_1_rank_0.pt",))
    tracker(root).write_text("25")
    lines = run(overrides_for(root))
    assert lines[0] == (
        "checkpoints: latest_checkpointed_iteration.txt named global_step_25, which is incomplete (a save cut "
        "short); removed it: no complete save here, so verl starts from step 0"
    )
    assert not tracker(root).exists() and (root / "global_step_25").is_dir()


def test_a_first_save_cut_short_before_the_tracker_gets_one(root: Path, small_model: None) -> None:
    save_step(root, 25)
    assert run(overrides_for(root))[0].startswith("checkpoints: latest_checkpointed_iteration.txt was missing;")
    assert tracker(root).read_text() == "25"
    empty = root.parent / "fresh"
    lines = run(overrides_for(empty))
    assert len(lines) == 1 and " free " in lines[0] and not empty.exists()  # nothing to repair, nothing made


def test_a_sound_tracker_is_left_alone_and_its_save_kept(root: Path, small_model: None) -> None:
    for step in (25, 50, 75, 100):
        save_step(root, step)
    tracker(root).write_text("25\n")
    lines = run(overrides_for(root))
    assert tracker(root).read_text() == "25\n"
    assert [line.split(" (")[0] for line in lines[:-1]] == ["checkpoints: removed global_step_50"]
    assert sorted(p.name for p in root.glob("global_step_*")) == ["global_step_100", "global_step_25", "global_step_75"]


def test_pruning_keeps_the_newest_complete_saves_and_touches_nothing_else(
    root: Path, tmp_path: Path, small_model: None
) -> None:
    outside = tmp_path / "elsewhere"
    save_step(outside, 10)
    (outside / "precious.txt").write_text("mine")
    save_step(root, 25, shard_bytes=3 * 2**20)
    (root / "global_step_25" / "link-out").symlink_to(outside / "precious.txt")
    save_step(root, 50)
    rotated_by_verl(root, 75)
    save_step(root, 100)
    save_step(root, 125)
    save_step(root, 150, skip=("critic/model_world_size_1_rank_0.pt",), data=False)  # the crash, mid-save
    (root / "global_step_10").symlink_to(outside / "global_step_10")
    others = ["global_step_007", "global_step_x", "global_step_-1", "notes"]
    for name in others:
        save_step(root, 0).rename(root / name)
    (root / "global_step_3").write_text("a file, not a folder")
    tracker(root).write_text("125")

    lines = run(overrides_for(root))
    assert lines[:-1] == [
        "checkpoints: removed global_step_25 (33.0 MiB): beyond the 2 newest complete saves "
        "(trainer.max_*_ckpt_to_keep=2)",
        "checkpoints: removed global_step_50 (11.9 KiB): beyond the 2 newest complete saves "
        "(trainer.max_*_ckpt_to_keep=2)",
        "checkpoints: removed global_step_75 (0.1 KiB): incomplete and older than global_step_125, the newest "
        "complete save",
    ]
    left = sorted(p.name for p in root.iterdir())
    kept = ["global_step_3", "global_step_10", "global_step_100", "global_step_125", "global_step_150"]
    assert left == sorted([*others, *kept, "latest_checkpointed_iteration.txt"])
    assert (outside / "precious.txt").read_text() == "mine" and (outside / "global_step_10" / "data.pt").is_file()
    assert tracker(root).read_text() == "125"


def test_the_newest_complete_save_is_never_removed_and_verl_keeping_all_removes_only_leftovers(root: Path) -> None:
    steps = [save_step(root, 25), rotated_by_verl(root, 50), save_step(root, 75)]
    roles = Settings.from_overrides(overrides_for(root)).load_contents
    found = scan(root, roles)
    assert [(f.path.name, why.split(" ")[0]) for f, why in stale_folders(found, None, set())] == [
        ("global_step_50", "incomplete")
    ]
    assert [f.path for f, _ in stale_folders(found, 1, set())] == steps[:2]
    assert [f.path for f, _ in stale_folders(found, 1, {steps[0]})] == [steps[1]]


def test_save_contents_without_the_optimizer_still_counts_as_complete(root: Path, small_model: None) -> None:
    kinds = ("optim", "extra_state")
    skip = tuple(f"{role}/{kind}_world_size_1_rank_0.pt" for role in ("actor", "critic") for kind in kinds)
    save_step(root, 25, skip=skip)
    tracker(root).write_text("25")
    contents = [f"{section}.checkpoint.save_contents=[model]" for section in ("actor_rollout_ref.actor", "critic")]
    assert len(run(overrides_for(root, *contents))) == 1  # the free-space line: nothing repaired or removed
    assert tracker(root).read_text() == "25"


def test_a_dry_run_changes_nothing_and_says_what_it_would_do(root: Path, small_model: None) -> None:
    save_step(root, 25)
    save_step(root, 50)
    save_step(root, 75)
    tracker(root).write_text("")
    lines = run(overrides_for(root), dry_run=True)
    assert lines[0].endswith("was empty; would point it at global_step_75, the newest complete save")
    assert lines[1].startswith("checkpoints: would remove global_step_25 (")
    assert tracker(root).read_text() == "" and (root / "global_step_25").is_dir()


def write_model(folder: Path, shapes: dict[str, list[int]], config: dict[str, Any]) -> Path:
    """A model folder with only the safetensors header (all model_size reads) and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    header = json.dumps(
        {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()}
    )
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode())
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def qwen25_05b(folder: Path) -> Path:
    """Qwen2.5-0.5B-Instruct's tensors (494,032,768 parameters, the embedding tied to the LM head)."""
    shapes = {"model.embed_tokens.weight": [QWEN_VOCAB, QWEN_HIDDEN], "model.norm.weight": [QWEN_HIDDEN]}
    for layer in range(QWEN_LAYERS):
        prefix = f"model.layers.{layer}"
        shapes |= {
            f"{prefix}.self_attn.q_proj.weight": [QWEN_HIDDEN, QWEN_HIDDEN],
            f"{prefix}.self_attn.q_proj.bias": [QWEN_HIDDEN],
            f"{prefix}.self_attn.k_proj.weight": [QWEN_KV, QWEN_HIDDEN],
            f"{prefix}.self_attn.k_proj.bias": [QWEN_KV],
            f"{prefix}.self_attn.v_proj.weight": [QWEN_KV, QWEN_HIDDEN],
            f"{prefix}.self_attn.v_proj.bias": [QWEN_KV],
            f"{prefix}.self_attn.o_proj.weight": [QWEN_HIDDEN, QWEN_HIDDEN],
            f"{prefix}.mlp.gate_proj.weight": [QWEN_INTERMEDIATE, QWEN_HIDDEN],
            f"{prefix}.mlp.up_proj.weight": [QWEN_INTERMEDIATE, QWEN_HIDDEN],
            f"{prefix}.mlp.down_proj.weight": [QWEN_HIDDEN, QWEN_INTERMEDIATE],
            f"{prefix}.input_layernorm.weight": [QWEN_HIDDEN],
            f"{prefix}.post_attention_layernorm.weight": [QWEN_HIDDEN],
        }
    config = {"vocab_size": QWEN_VOCAB, "hidden_size": QWEN_HIDDEN, "tie_word_embeddings": True}
    return write_model(folder, shapes, config)


def test_the_estimate_matches_the_measured_qwen_save(tmp_path: Path) -> None:
    size = model_size(qwen25_05b(tmp_path / "model"))
    assert size == ModelSize(494_032_768, QWEN_VOCAB * QWEN_HIDDEN, 0)
    contents = {"actor": ("model", "optimizer", "extra"), "critic": ("model", "optimizer", "extra")}
    actor = estimate_step_bytes(size, None, {"actor": contents["actor"]}) - checkpoints.ROLE_ALLOWANCE_BYTES
    assert round(actor / GIB, 2) == 6.03  # measured: weights 2.35 GiB (the tied embedding twice) + optimizer 3.68
    assert 11.5 <= estimate_step_bytes(size, size, contents) / GIB <= 11.8
    untied = model_size(write_model(tmp_path / "untied", {"w": [10, 10], "lm_head.weight": [5, 10]}, {}))
    assert untied == ModelSize(150, 0, 50)
    # the critic has no LM head; an HF copy adds the weights once more
    assert estimate_step_bytes(untied, untied, {"critic": ("model", "hf_model")}) == 100 * 4 * 2 + (64 * 2**20)
    assert model_size(tmp_path / "nothing") is None
    assert model_size(write_model(tmp_path / "odd", {"w": [1]}, {"tie_word_embeddings": True})) is None


def test_a_damaged_safetensors_file_is_named_not_an_internal_error(tmp_path: Path) -> None:
    model = write_model(tmp_path / "model", {"w": [10, 10]}, {})
    (model / "model.safetensors").write_bytes(b"\xff" * 8 + bytes(range(256)) * 16)  # its length: 2**64 - 1 bytes
    assert model_size(model) is None
    assert checkpoints.unsized_reason(model) == (
        f"{model / 'model.safetensors'} is not a readable safetensors file (damaged, cut short, or another format)"
    )


@pytest.fixture
def qwen_overrides(root: Path, tmp_path: Path) -> list[str]:
    model = qwen25_05b(tmp_path / "models" / "qwen")
    return overrides_for(root, f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}")


def fake_free(monkeypatch: pytest.MonkeyPatch, free: int) -> list[str]:
    asked: list[str] = []

    def disk_usage(path: str | Path) -> Any:
        asked.append(str(path))
        return type("Usage", (), {"total": 10 * free, "used": 9 * free, "free": free})()

    monkeypatch.setattr(checkpoints.shutil, "disk_usage", disk_usage)
    return asked


def test_the_free_space_must_hold_the_saves_the_run_keeps(
    root: Path, qwen_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    size = model_size(Path(Settings.from_overrides(qwen_overrides).actor_model))
    assert size is not None
    need = 4 * estimate_step_bytes(size, size, Settings.from_overrides(qwen_overrides).save_contents)
    asked = fake_free(monkeypatch, need)
    figures = (
        f"{root} has 46.7 GiB free and 0.0 KiB in this run's saves, room for 46.7 GiB; a restart keeps 2 save(s) and "
        "verl writes up to 2 more until the next one (trainer.max_*_ckpt_to_keep=2): 4 saves of about 11.7 GiB need "
        "46.7 GiB"
    )
    assert run(qwen_overrides) == [f"checkpoints: {figures}"]
    assert asked == [str(root)]
    fake_free(monkeypatch, need - 1)
    with pytest.raises(PreflightFailed) as refused:
        run(qwen_overrides)
    assert refused.value.exit_code == 3
    assert str(refused.value) == (
        f"checkpoints: {figures}: free some space, keep fewer saves, or set VERLBOX_SKIP_DISK_CHECK=1 to start anyway"
    )
    assert run(qwen_overrides, environ={"VERLBOX_SKIP_DISK_CHECK": "1"})[0].endswith(
        "; starting anyway (VERLBOX_SKIP_DISK_CHECK=1)"
    )
    assert run(qwen_overrides, dry_run=True)[0].startswith("checkpoints: would refuse to start: ")
    assert run([*qwen_overrides, "trainer.save_freq=-1"]) == []  # verl saves nothing


def test_a_folder_not_made_yet_is_checked_on_its_nearest_existing_parent(
    root: Path, qwen_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = fake_free(monkeypatch, 0)
    fresh = [*qwen_overrides, f"trainer.default_local_dir={root}/new/run"]
    with pytest.raises(PreflightFailed, match=r"has 0\.0 KiB free"):
        run(fresh)
    assert asked == [str(root)]


def test_train_repairs_before_verl_starts_and_refuses_without_room(
    root: Path, qwen_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring: after the preflight passes, before verl starts; a short disk is a preflight failure (exit 3)."""
    spec = load_recipe("p40-cu124").image_spec().model_copy(update={"lock_hash": "c" * 64})
    user = [o for o in qwen_overrides if o.startswith(("actor_rollout_ref.model.path=", "critic.model.path="))]
    for name, value in {"VERLBOX_CHECKPOINT_DIR": str(root.parent), "VERLBOX_EXPERIMENT": root.name}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pass_the_gpu_preflight(monkeypatch, train_module)
    started: list[list[str]] = []
    monkeypatch.setattr(train_module.supervisor, "supervise", lambda command, *args, **kw: started.append(command) or 0)
    save_step(root, 25)
    tracker(root).write_text("")
    output = io.StringIO()
    console = Console(file=output, soft_wrap=True)

    fake_free(monkeypatch, 0)
    with pytest.raises(PreflightFailed, match="VERLBOX_SKIP_DISK_CHECK=1"):
        train_module.train(spec, user, dry_run=False, gpu_memory_gib=None, console=console, gpus_per_node=1)
    assert not started and tracker(root).read_text() == "25"  # repaired before the refusal

    tracker(root).write_text("")
    train_module.train(spec, user, dry_run=True, gpu_memory_gib=None, console=console, gpus_per_node=1)
    assert "would point it at global_step_25" in output.getvalue() and tracker(root).read_text() == ""
    assert "checkpoints: would refuse to start" in output.getvalue() and not started

    fake_free(monkeypatch, 100 * GIB)
    train_module.train(spec, user, dry_run=False, gpu_memory_gib=None, console=console, gpus_per_node=1)
    assert started and "-m" in started[0] and tracker(root).read_text() == "25"
    # only the start that reached verl is recorded, with what produced its checkpoints
    [run] = read_runs(root)
    assert (run.outcome, run.last_step, run.profile, run.recipe) == ("finished", 25, "p40", "p40-cu124")
    assert [(gpu.name, gpu.capability) for gpu in run.gpus] == [("Tesla P40", "6.1")] and run.driver == "550.54.14"
    assert run.overrides == started[0][3:] and run.patch_set_hash == patch_set_for("0.4.1").content_hash
    assert run.lock_hash == "c" * 64  # the image spec's, as a locked build writes it


def test_a_dry_run_counts_the_space_its_removals_would_free(
    root: Path, qwen_overrides: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (25, 50, 75):
        save_step(root, step, shard_bytes=2**20)  # 11 files of 1 MiB each
    tracker(root).write_text("75")
    settings = Settings.from_overrides(qwen_overrides)
    size = model_size(settings.actor_model)
    assert size is not None
    fake_free(monkeypatch, 4 * estimate_step_bytes(size, size, settings.save_contents) - 33 * 2**20)
    lines = run(qwen_overrides, dry_run=True)
    assert lines[0] == (
        "checkpoints: would remove global_step_25 (11.0 MiB): beyond the 2 newest complete saves "
        "(trainer.max_*_ckpt_to_keep=2)"
    )
    assert "refuse" not in lines[1]


def test_a_model_without_safetensors_skips_the_space_check_and_says_so(root: Path) -> None:
    assert run(overrides_for(root, "actor_rollout_ref.model.path=/nowhere", "critic.model.path=/nowhere")) == [
        "checkpoints: no safetensors weights in /nowhere to size a save from; free space not checked"
    ]


def test_weights_without_config_json_are_named_as_such(root: Path, tmp_path: Path) -> None:
    """Before: "no safetensors weights in ..." while model.safetensors was there."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    assert run(overrides_for(root, f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}")) == [
        f"checkpoints: {model} has safetensors weights but no config.json (verl cannot load it without one); "
        "free space not checked"
    ]


def torch_saved(path: Path, payload: bytes = b"\1" * 4096) -> bytes:
    """A file as torch.save writes it: a ZIP archive (its data.pkl and data)."""
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_a_save_cut_short_by_a_power_cut_is_incomplete_and_the_last_whole_one_is_kept(
    root: Path, verl_tree: Path, small_model: None
) -> None:
    """verl does not fsync: after a power cut global_step_100 has its files, data.pt and the tracker, but 0-byte
    or cut .pt files. Before, it counted as complete: every restart failed to load it, and keep=1 removed 75."""
    for step in (75, 100):
        folder = save_step(root, step)
        for path in sorted(folder.rglob("*.pt")):
            whole = torch_saved(path)
            if step == 100 and "actor" in path.parts:
                path.write_bytes(b"" if "model" in path.name else whole[: len(whole) // 2])
    tracker(root).write_text("100")
    assert checkpoints.whole_file(root / "global_step_75" / "actor" / "model_world_size_1_rank_0.pt")
    assert not checkpoints.whole_file(root / "global_step_100" / "actor" / "model_world_size_1_rank_0.pt")
    assert not checkpoints.whole_file(root / "global_step_100" / "actor" / "optim_world_size_1_rank_0.pt")
    zeros = root / "zeros.pt"  # the size reached the disk, the data did not (XFS, ext4 after a power cut)
    zeros.write_bytes(b"\0" * 4096)
    assert not checkpoints.whole_file(zeros)
    lines = run(overrides_for(root, "trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=1"))
    assert lines[0] == (
        "checkpoints: latest_checkpointed_iteration.txt named global_step_100, which is incomplete (a save cut "
        "short); pointed it at global_step_75, the newest complete save"
    )
    assert verl_find_latest(verl_tree)(str(root)) == str(root / "global_step_75")
    assert (root / "global_step_75").is_dir()  # keep=1 never removes the newest whole save


def test_one_kept_save_is_raised_to_two_saying_why() -> None:
    """verl 0.4.1 removes the kept save before it writes the next: with one, a cut save leaves nothing."""
    said: list[str] = []
    kept = ["trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=null"]
    raised = checkpoints.keep_two_at_least(kept, said.append)
    assert raised == ["trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=null"]
    assert len(said) == 1 and said[0].startswith("trainer.max_actor_ckpt_to_keep=1 raised to 2: verl removes")
    three = ["trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=3"]
    assert checkpoints.keep_two_at_least(three, said.append) == three and len(said) == 1
