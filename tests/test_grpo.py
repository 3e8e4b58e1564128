"""The GRPO profile beside PPO: its overrides against verl 0.4.1's real Hydra config, the batch arithmetic
for 1, 2 and 4 GPUs, and how a run chooses it (--profile, VERLBOX_PROFILE, else the recipe's PPO)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import docker, run_verlbox
from verlbox.errors import UsageError
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training.overrides import OverrideError, check_overrides, override_value
from verlbox.runtime.training.patches import patch_set_for
from verlbox.runtime.training.profile import PROFILE_VARIABLE, Topology, TrainingPlan, profile_names
from verlbox.runtime.training.train import merge_overrides, verified_overrides

SPEC = load_recipe("p40-cu124").image_spec()


def plan(profile: str | None, gpus: int = 1, nodes: int = 1, environ: dict[str, str] | None = None) -> TrainingPlan:
    return TrainingPlan(SPEC, environ or {}, Topology(gpus, nodes, "given"), profile)


def test_grpo_composes_with_verls_config(verl_config_dir: Path) -> None:
    config = check_overrides(
        plan("grpo").overrides, verl_config_dir, patch_set_for("0.4.1"), "6.1", flash_attn_installed=False
    )
    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    assert config.algorithm.adv_estimator == "grpo" and rollout.n == 4
    assert (rollout.name, rollout.dtype, rollout.micro_batch_size) == ("hf", "float32", 32)
    assert config.data.train_batch_size == 32 and actor.ppo_mini_batch_size == 8
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert actor.fsdp_config.mixed_precision.param_dtype == "fp32" and actor.use_torch_compile is False
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    # no KL term, so verl builds no reference model; if a user turns it on, the reference is fp32 and offloaded
    assert not actor.use_kl_loss and not config.algorithm.use_kl_in_reward
    assert ref.fsdp_config.model_dtype == "fp32" and ref.fsdp_config.param_offload
    assert config.trainer.default_local_dir == "/checkpoints/qwen2.5-0.5b-gsm8k-grpo"
    # the profile sets nothing for a critic it does not have
    assert not [line for line in plan("grpo").overrides if line.lstrip("+").startswith("critic.")]


@pytest.mark.parametrize("profile", ["p40", "grpo"])
@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_each_profile_divides_among_1_2_and_4_gpus(profile: str, gpus: int, nodes: int) -> None:
    scaled = plan(profile, gpus, nodes)
    overrides = verified_overrides(scaled, [])
    per_gpu = scaled.profile.per_gpu
    world = gpus * nodes
    assert override_value(overrides, "data.train_batch_size") == str(per_gpu["train_batch_size"] * world)
    mini = override_value(overrides, "actor_rollout_ref.actor.ppo_mini_batch_size")
    assert mini == str(per_gpu["ppo_mini_batch_size"] * world)
    # the rollout's micro batch is one GPU's prompts: one generate call per GPU and step, whatever the count
    assert override_value(overrides, "actor_rollout_ref.rollout.micro_batch_size") == str(per_gpu["train_batch_size"])


def test_grpo_with_one_answer_per_prompt_is_refused_with_the_reason() -> None:
    with pytest.raises(OverrideError, match="alone in its group every answer's advantage is 0") as refused:
        verified_overrides(plan("grpo"), ["actor_rollout_ref.rollout.n=1"])
    assert str(refused.value).startswith("algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n=1:")


def test_mini_batches_count_prompts_times_n() -> None:
    # 16 prompts x 4 answers = 64 responses per mini batch on 2 GPUs: micro batches of 3 do not divide them
    with pytest.raises(OverrideError, match=r"ppo_mini_batch_size=16 does not give each of 2 GPU\(s\) whole micro"):
        verified_overrides(plan("grpo", 2), ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    # with n=3, 16 prompts are 48 responses: micro batches of 3 on 2 GPUs fit
    fits = verified_overrides(
        plan("grpo", 2), ["actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]
    )
    assert override_value(fits, "actor_rollout_ref.rollout.n") == "3"


def test_critic_sizes_matter_to_ppo_only() -> None:
    odd = ["critic.ppo_micro_batch_size_per_gpu=3"]
    assert verified_overrides(plan("grpo"), odd)[-1] == odd[0]  # no critic is built: nothing to divide
    with pytest.raises(OverrideError, match=r"critic\.ppo_mini_batch_size"):
        verified_overrides(plan("p40"), odd)


def test_the_flag_wins_over_the_environment_which_wins_over_the_recipe() -> None:
    assert SPEC.profile == "p40" and profile_names() == ["grpo", "p40"]
    assert plan(None).profile.name == "p40"
    assert plan(None, environ={PROFILE_VARIABLE: "grpo"}).profile.name == "grpo"
    assert plan("p40", environ={PROFILE_VARIABLE: "grpo"}).profile.name == "p40"
    with pytest.raises(UsageError, match=r"no training profile named '\.\./p40': verlbox has grpo, p40 \(ppo = p40\)"):
        plan("../p40")
    assert plan("ppo").profile.name == "p40"  # the README calls the default PPO: the name works too


def test_overrides_cli_shows_the_chosen_profile() -> None:
    shown = run_verlbox("overrides", "--profile", "grpo", "--gpus-per-node", "2", "p40-cu124")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == plan("grpo", 2).overrides
    from_env = run_verlbox("overrides", "p40-cu124", env={PROFILE_VARIABLE: "grpo"})
    assert from_env.stdout.splitlines() == plan("grpo").overrides
    refused = run_verlbox("overrides", "--profile", "grpo", "p40-cu124", "actor_rollout_ref.rollout.n=1")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "rollout.n=1" in refused.stderr
    unknown = run_verlbox("train", "--profile", "ppo2", "--recipe", "p40-cu124")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "verlbox: error: no training profile named 'ppo2': verlbox has grpo, p40 (ppo = p40)"
    )


def test_a_user_override_wins_over_the_grpo_profile() -> None:
    merged = merge_overrides(plan("grpo").overrides, ["actor_rollout_ref.rollout.n=8"])
    assert override_value(merged, "actor_rollout_ref.rollout.n") == "8"


@pytest.mark.docker
def test_overrides_in_a_run_folder_checks_its_env_s_image_recipe_and_profile(
    docker_engine: object, tmp_path: Path
) -> None:
    """Before: `verlbox overrides` in a run folder asked for a recipe, ignoring the image its .env names."""
    from test_init import build_labelled

    tag = f"verlbox-test/overrides-run-folder:{os.getpid()}"
    try:
        build_labelled(tmp_path / "image", tag, 4_000_000_000, label=True, recipe="p40-cu124")
        run = tmp_path / "run"
        run.mkdir()
        (run / ".env").write_text(f"VERLBOX_IMAGE={tag}\nVERLBOX_PROFILE=grpo\n")
        shown = run_verlbox("overrides", "--gpus-per-node", "2", cwd=run)
        assert shown.returncode == 0, shown.stderr
        assert f"recipe p40-cu124 of {tag}" in shown.stderr
        assert "algorithm.adv_estimator=grpo" in shown.stdout.splitlines()  # the .env's profile
    finally:
        docker("image", "rm", tag, check=False)
