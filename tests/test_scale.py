"""Scaling the profile to N GPUs x M nodes: global batches grow, per-GPU work stays, verl's asserts hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.errors import UsageError
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training.overrides import OverrideError, override_value
from verlbox.runtime.training.patches import patch_set_for
from verlbox.runtime.training.profile import Topology, TrainingPlan
from verlbox.runtime.training.train import (
    merge_overrides,
    ray_job_config,
    resolve_topology,
    train_environment,
    verified_overrides,
)

PATCH_SET = patch_set_for("0.4.1")


def plan(gpus: int, nodes: int) -> TrainingPlan:
    return TrainingPlan(load_recipe("p40-cu124").image_spec(), environ={}, topology=Topology(gpus, nodes))


@pytest.fixture
def verl_on_path(verl_config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verified_overrides finds verl by import spec: put the real 0.4.1 wheel's tree first."""
    monkeypatch.syspath_prepend(str(verl_config_dir.parents[2]))


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 3)])
def test_global_batches_grow_with_the_gpu_count_and_per_gpu_sizes_stay(
    gpus: int, nodes: int, verl_on_path: None
) -> None:
    scaled = plan(gpus, nodes)
    overrides = verified_overrides(scaled, [])  # the real Hydra config and the batch rules accept it
    world = gpus * nodes
    value = lambda key: override_value(overrides, key)  # noqa: E731
    assert (value("trainer.n_gpus_per_node"), value("trainer.nnodes")) == (str(gpus), str(nodes))
    assert int(value("data.train_batch_size")) == 64 * world
    assert int(value("actor_rollout_ref.actor.ppo_mini_batch_size")) == 16 * world
    for per_gpu_key, size in [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "4"),
        ("critic.ppo_micro_batch_size_per_gpu", "4"),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "8"),
        ("critic.forward_micro_batch_size_per_gpu", "8"),
        ("actor_rollout_ref.rollout.micro_batch_size", "64"),
    ]:
        assert value(per_gpu_key) == size, per_gpu_key


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["data.train_batch_size=100"], "data.train_batch_size=100 .* does not divide among 8 GPUs"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=40"], "whole micro batches of 4 .* multiple of 32"),
        (["critic.ppo_mini_batch_size=16"], r"critic.ppo_mini_batch_size=16 .* multiple of 32"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=1024"], "larger than data.train_batch_size=512"),
        (
            ["actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
            "multiple of 32",
        ),
    ],
)
def test_batches_verl_would_assert_on_are_refused_before_ray_starts(
    extra: list[str], message: str, verl_on_path: None
) -> None:
    with pytest.raises(OverrideError, match=message):
        verified_overrides(plan(4, 2), extra)


def test_rollout_n_that_divides_evenly_passes(verl_on_path: None) -> None:
    # 48 x 2 samples over 8 GPUs: 12 per GPU per mini batch, 3 micro batches of 4
    overrides = verified_overrides(
        plan(4, 2), ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=48"]
    )
    assert override_value(overrides, "actor_rollout_ref.rollout.n") == "2"


def test_flags_and_user_overrides_beat_detection() -> None:
    no_cluster: dict[str, str] = {}
    # both given: the cluster is not even asked (nothing answers at this address)
    given = resolve_topology(3, 2, [], {"RAY_ADDRESS": "192.0.2.1:6379"}, console=None)  # type: ignore[arg-type]
    assert (given.gpus_per_node, given.nodes, given.source) == (3, 2, "given")
    from_overrides = resolve_topology(None, None, ["trainer.n_gpus_per_node=2"], no_cluster, console=None)  # type: ignore[arg-type]
    assert (from_overrides.gpus_per_node, from_overrides.nodes) == (2, 1)
    with pytest.raises(OverrideError, match="expected a positive number"):
        resolve_topology(None, None, ["trainer.nnodes=-1"], no_cluster, console=None)  # type: ignore[arg-type]


def test_user_overrides_of_the_topology_scale_the_batch_like_flags(verl_on_path: None) -> None:
    topology = resolve_topology(None, None, ["trainer.n_gpus_per_node=2"], {}, console=None)  # type: ignore[arg-type]
    scaled = TrainingPlan(load_recipe("p40-cu124").image_spec(), environ={}, topology=topology)
    merged = merge_overrides(scaled.overrides, ["trainer.n_gpus_per_node=2"])
    assert override_value(merged, "data.train_batch_size") == "128"


def test_overrides_cli_scales_by_flags(verl_config_dir: Path) -> None:
    site = verl_config_dir.parents[2]
    env = {"PYTHONPATH": f"{site}:{Path(__file__).parents[1] / 'builder'}"}
    result = run_verlbox("overrides", "p40-cu124", "--gpus-per-node", "2", "--nodes", "2", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == plan(2, 2).overrides
    assert "data.train_batch_size=256" in result.stdout.splitlines()
    bad = run_verlbox("overrides", "p40-cu124", "--nodes", "0", env=env)
    assert bad.returncode == 2 and "expected a whole number >= 1" in bad.stderr
    uneven = run_verlbox("overrides", "--gpus-per-node", "3", "p40-cu124", "data.train_batch_size=64", env=env)
    assert uneven.returncode == 2 and "does not divide among 3 GPUs" in uneven.stderr


def test_several_nodes_without_a_ray_cluster_is_refused() -> None:
    with pytest.raises(UsageError, match="2 nodes need a Ray cluster: set RAY_ADDRESS"):
        resolve_topology(1, 2, [], {}, console=None)  # type: ignore[arg-type]


def test_in_a_ray_cluster_the_profiles_variables_and_the_cap_reach_the_workers() -> None:
    scaled = plan(1, 2)
    env = train_environment(scaled, {"RAY_ADDRESS": "10.0.0.1:6379", "PYTHONPATH": "/x"}, 24)
    env_vars = json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]["env_vars"]
    assert env_vars["PYTORCH_CUDA_ALLOC_CONF"] == scaled.environment["PYTORCH_CUDA_ALLOC_CONF"]
    assert env_vars["VERLBOX_GPU_MEMORY_GIB"] == "24" and env_vars["PYTHONPATH"].endswith(":/x")
    # verl's own ray.init sets TOKENIZERS_PARALLELISM as the profile does: Ray refuses a key set by both
    # (seen on the GPU machine) unless told to let the driver's value win
    assert "TOKENIZERS_PARALLELISM" in env_vars and env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    local = train_environment(scaled, {}, None)
    assert "RAY_JOB_CONFIG_JSON_ENV_VAR" not in local and "RAY_OVERRIDE_JOB_RUNTIME_ENV" not in local
    # a job config from `ray job submit` keeps its own variables
    merged = ray_job_config(json.dumps({"runtime_env": {"env_vars": {"A": "1"}}, "x": 2}), {"B": "2"})
    assert json.loads(merged) == {"runtime_env": {"env_vars": {"A": "1", "B": "2"}}, "x": 2}
