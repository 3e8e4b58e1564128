"""Training profiles: data files of Hydra overrides, completed from the GPU table and the environment."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

import yaml
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, PositiveInt

from verlbox.errors import UsageError
from verlbox.runtime.gpu import GpuCapability, capability_for, rollout_backend
from verlbox.runtime.training.environment import setting
from verlbox.runtime.training.spec import ImageSpec

# the profile a run uses instead of its recipe's (compose's .env sets it)
PROFILE_VARIABLE = "VERLBOX_PROFILE"
PROFILES = resources.files("verlbox.runtime.training") / "profiles"
# environment variable -> placeholder it fills
PATH_VARIABLES = {
    "VERLBOX_MODEL_DIR": "model",
    "VERLBOX_DATA_DIR": "data",
    "VERLBOX_CHECKPOINT_DIR": "checkpoints",
    "VERLBOX_EXPERIMENT": "experiment",
}


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    min_gpu_memory_gib: float
    defaults: dict[str, str]
    # sizes verl takes as global (for all GPUs together), given here for one GPU
    per_gpu: dict[str, PositiveInt]
    environment: dict[str, str]
    overrides: list[str]


@dataclass(frozen=True)
class Topology:
    """How many GPUs a run uses: verl's trainer.n_gpus_per_node and trainer.nnodes."""

    gpus_per_node: int = 1
    nodes: int = 1
    source: str = "default"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) ({self.source})"


def profile_names() -> list[str]:
    return sorted(entry.name.removesuffix(".yaml") for entry in PROFILES.iterdir() if entry.name.endswith(".yaml"))


# the names the README uses for the algorithms: PPO is the P40 profile (the image's default)
PROFILE_ALIASES = {"ppo": "p40"}


def known_profile(name: str, named_by: str | None = None) -> str:
    """NAME, an alias resolved; unknown: a UsageError that starts with NAMED_BY (the setting that gave it)."""
    names = profile_names()
    name = PROFILE_ALIASES.get(name, name)
    if name not in names:  # looked up among the files, never joined into a path
        aliases = ", ".join(f"{alias} = {target}" for alias, target in PROFILE_ALIASES.items())
        where = f"{named_by}: " if named_by else ""
        raise UsageError(f"{where}no training profile named {name!r}: verlbox has {', '.join(names)} ({aliases})")
    return name


def load_profile(name: str) -> Profile:
    return Profile.model_validate(yaml.safe_load((PROFILES / f"{known_profile(name)}.yaml").read_text()))


def chosen_profile(flag: str | None, environ: Mapping[str, str], spec: ImageSpec) -> str:
    """The flag's profile, else VERLBOX_PROFILE's, else the recipe's own (PPO for the shipped recipes)."""
    # an unknown name is refused before anything else is checked, naming the setting (and .env) it came from
    if flag:
        return known_profile(flag)
    if environ.get(PROFILE_VARIABLE):
        return known_profile(environ[PROFILE_VARIABLE], setting(environ, PROFILE_VARIABLE))
    return known_profile(spec.profile)


class TrainingPlan:
    """A recipe's profile rendered for one environment: the exact overrides and variables of a run."""

    def __init__(
        self,
        spec: ImageSpec,
        environ: dict[str, str] | None = None,
        topology: Topology | None = None,
        profile: str | None = None,
    ) -> None:
        self.spec = spec
        self.environ = dict(os.environ if environ is None else environ)
        self.profile = load_profile(chosen_profile(profile, self.environ, spec))
        self.topology = topology or Topology()

    @cached_property
    def oldest_target(self) -> str:
        return min(self.spec.target_gpus, key=Version)

    @cached_property
    def capability(self) -> GpuCapability:
        return capability_for(self.oldest_target)

    @cached_property
    def rollout(self) -> str:
        return rollout_backend(self.oldest_target, self.spec.vllm_kernels_for)

    @cached_property
    def values(self) -> dict[str, str]:
        values = dict(self.profile.defaults)
        for variable, placeholder in PATH_VARIABLES.items():
            if self.environ.get(variable):
                values[placeholder] = self.environ[variable]
        capability = self.capability
        values |= {
            "dtype": capability.dtype,
            "fsdp_dtype": "fp32" if capability.dtype == "float32" else "bf16",
            "attention": capability.attention,
            "torch_compile": str(capability.torch_compile),
            "rollout": self.rollout,
        }
        return values | self.scaled_sizes

    @cached_property
    def scaled_sizes(self) -> dict[str, str]:
        topology = self.topology
        sizes = {"n_gpus_per_node": str(topology.gpus_per_node), "nnodes": str(topology.nodes)}
        for name, per_gpu in self.profile.per_gpu.items():
            sizes[name] = str(per_gpu * topology.world_size)
            sizes[f"{name}_per_gpu"] = str(per_gpu)
        return sizes

    @cached_property
    def overrides(self) -> list[str]:
        return [line.format_map(self.values) for line in self.profile.overrides]

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.profile.environment)


def batch_problems(get: Callable[[str], Any], world_size: int) -> list[str]:
    """What verl 0.4.1 would assert about batch sizes minutes into a run (ray_trainer._validate_config and
    the FSDP workers' normalisation), as sentences now. `get` reads a key of the composed config."""
    train, samples = get("data.train_batch_size"), get("actor_rollout_ref.rollout.n") or 1
    estimator = get("algorithm.adv_estimator") or "gae"
    problems = []
    if estimator == "grpo" and samples < 2:
        problems.append(
            f"algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n={samples}: GRPO compares each answer "
            "with the other answers to its prompt, and alone in its group every answer's advantage is 0, so the "
            "model never learns; use n of 2 or more (the grpo profile uses 4)"
        )
    if (train * samples) % world_size:
        problems.append(
            f"data.train_batch_size={train} (x rollout.n={samples}) does not divide among {world_size} GPUs: "
            f"use a multiple of {world_size}"
        )
    # verl 0.4.1 builds a critic for GAE only (ray_trainer.py): another estimator's critic sizes are unused
    roles = [("actor", "actor_rollout_ref.actor")] + ([("critic", "critic")] if estimator == "gae" else [])
    for role, section in roles:
        if get(f"{section}.use_dynamic_bsz"):
            continue
        mini, micro = get(f"{section}.ppo_mini_batch_size"), get(f"{section}.ppo_micro_batch_size_per_gpu")
        step = (micro or 1) * world_size  # every GPU gets whole micro batches of every mini batch
        if mini > train:
            problems.append(f"{section}.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train}")
        elif (mini * samples) % step:
            problems.append(
                f"{section}.ppo_mini_batch_size={mini} does not give each of {world_size} GPU(s) whole micro "
                f"batches of {micro} per {role} update: use a multiple of {step // math.gcd(samples, step)}"
            )
    return problems
