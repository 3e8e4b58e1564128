"""Training profiles: data files of Hydra overrides, completed from the GPU table and the environment."""

from __future__ import annotations

import os
from functools import cached_property
from importlib import resources

import yaml
from packaging.version import Version
from pydantic import BaseModel, ConfigDict

from verlbox.errors import VerlboxError
from verlbox.runtime.gpu import GpuCapability, capability_for, rollout_backend
from verlbox.runtime.spec import ImageSpec

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
    environment: dict[str, str]
    overrides: list[str]


def load_profile(name: str) -> Profile:
    source = resources.files("verlbox.runtime") / "profiles" / f"{name}.yaml"
    if not source.is_file():
        raise VerlboxError(f"no training profile named {name!r} in verlbox/profiles")
    return Profile.model_validate(yaml.safe_load(source.read_text()))


class TrainingPlan:
    """A recipe's profile rendered for one environment: the exact overrides and variables of a run."""

    def __init__(self, spec: ImageSpec, environ: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.profile = load_profile(spec.profile)
        self.environ = dict(os.environ if environ is None else environ)

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
        return values

    @cached_property
    def overrides(self) -> list[str]:
        return [line.format_map(self.values) for line in self.profile.overrides]

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.profile.environment)
