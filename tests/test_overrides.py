"""The P40 profile's overrides, checked against verl 0.4.1's real Hydra config."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.host.recipe import load_recipe
from verlbox.runtime.overrides import OverrideError, check_overrides, override_value
from verlbox.runtime.patches import patch_set_for
from verlbox.runtime.profile import TrainingPlan
from verlbox.runtime.train import merge_overrides

PATCH_SET = patch_set_for("0.4.1")


def check(overrides: list[str], config_dir: Path, gpu: str = "6.1", vllm: list[str] | None = None) -> object:
    return check_overrides(overrides, config_dir, PATCH_SET, gpu, flash_attn_installed=False, vllm_kernels_for=vllm)


@pytest.fixture
def p40_plan() -> TrainingPlan:
    return TrainingPlan(load_recipe("p40").image_spec(), environ={})


def test_the_p40_profile_composes_with_verls_config(p40_plan: TrainingPlan, verl_config_dir: Path) -> None:
    config = check(p40_plan.overrides, verl_config_dir, vllm=load_recipe("p40").vllm.kernels_for)
    rollout, actor, critic = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor, config.critic
    assert (rollout.name, rollout.dtype, rollout.micro_batch_size, rollout.tensor_model_parallel_size) == (
        "hf",
        "float32",
        64,
        1,
    )
    assert actor.fsdp_config.mixed_precision.param_dtype == "fp32" and actor.use_torch_compile is False
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert critic.model.fsdp_config.param_offload and critic.model.fsdp_config.optimizer_offload
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert critic.model.override_config.attn_implementation == "sdpa"
    assert config.data.train_batch_size == 64 and config.data.val_files.endswith("validation.parquet")
    assert actor.ppo_mini_batch_size == 16 and actor.ppo_micro_batch_size_per_gpu == 4
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (1, 1)
    assert config.trainer.resume_mode == "auto" and config.trainer.default_local_dir.startswith("/checkpoints/")
    assert config.trainer.save_freq > 0 and config.trainer.test_freq > 0
    assert not config.algorithm.use_kl_in_reward and not actor.use_kl_loss


def test_profile_values_come_from_the_capability_table_and_environment() -> None:
    plan = TrainingPlan(
        load_recipe("p40-cu124").image_spec(), environ={"VERLBOX_MODEL_DIR": "/m/qwen", "VERLBOX_DATA_DIR": "/d"}
    )
    assert override_value(plan.overrides, "actor_rollout_ref.model.path") == "/m/qwen"
    assert override_value(plan.overrides, "data.train_files") == "/d/train.parquet"
    assert override_value(plan.overrides, "actor_rollout_ref.rollout.name") == "hf"
    assert override_value(plan.overrides, "actor_rollout_ref.actor.use_torch_compile") == "False"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("++actor_rollout_ref.fsdp_config.cpu_offload=true", "the real key: actor_rollout_ref.actor.fsdp_config"),
        ("++actor_rollout_ref.fsdp_config.offload_params=true", "never reads it"),
        ("+trainer.not_a_key=1", "trainer.not_a_key: verl 0.4.1 does not declare it"),
        ("algorithm.kl_ctrl.kl_coef=0.001", "no KL is in use"),
        ("actor_rollout_ref.rollout.name=vllm", "no kernels for compute capability 6.1"),
        ("actor_rollout_ref.actor.use_torch_compile=True", "Triton refuses compute capability 6.1"),
        ("actor_rollout_ref.model.use_remove_padding=True", "needs flash-attn"),
        ("actor_rollout_ref.rollout.dtype=bfloat16", "have no bf16"),
        ("data.not_declared=1", "data.not_declared: verl 0.4.1 does not declare it"),
        ("trainer.logger=[console", "verl's Hydra config rejects the overrides"),
    ],
)
def test_the_blogs_no_ops_and_wrong_settings_are_refused(
    p40_plan: TrainingPlan, verl_config_dir: Path, extra: str, message: str
) -> None:
    with pytest.raises(OverrideError, match=message.replace("(", r"\(").replace("'", ".")):
        check(merge_overrides(p40_plan.overrides, [extra]), verl_config_dir)


def test_kl_coef_is_fine_once_kl_is_in_use(p40_plan: TrainingPlan, verl_config_dir: Path) -> None:
    merged = merge_overrides(p40_plan.overrides, ["algorithm.kl_ctrl.kl_coef=0.001", "algorithm.use_kl_in_reward=True"])
    assert check(merged, verl_config_dir).algorithm.kl_ctrl.kl_coef == 0.001


def test_user_overrides_replace_the_profiles_value_and_keep_its_plus() -> None:
    merged = merge_overrides(["a.b=1", "+c.d=2"], ["a.b=3", "c.d=4", "e=5"])
    assert merged == ["a.b=3", "+c.d=4", "e=5"]


def test_overrides_cli_prints_exactly_the_profile_lines(verl_config_dir: Path, p40_plan: TrainingPlan) -> None:
    site = verl_config_dir.parents[2]
    result = run_verlbox("overrides", "p40", env={"PYTHONPATH": f"{site}:{Path(__file__).parents[1] / 'builder'}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == p40_plan.overrides
    refused = run_verlbox(
        "overrides",
        "p40",
        "++actor_rollout_ref.fsdp_config.cpu_offload=true",
        env={"PYTHONPATH": f"{site}:{Path(__file__).parents[1] / 'builder'}"},
    )
    assert refused.returncode == 2 and "actor_rollout_ref.fsdp_config.cpu_offload" in refused.stderr
