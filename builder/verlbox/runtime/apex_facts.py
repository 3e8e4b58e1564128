"""What verlbox knows about one Apex commit: the extensions its build makes, which of them fix their
own architectures, and the counted build patches that may be applied (patches/apex-COMMIT.yaml)."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from verlbox.errors import UsageError


class BuildPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    file: str
    why: str
    min_cuda: str = "0"  # applied only when nvcc's CUDA version is at least this
    count: int = Field(ge=1)
    find: str
    replace: str


class ApexFacts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    commit: str
    tag: str
    extensions: list[str]
    cpu_only: list[str]
    fixed_architectures: dict[str, str]
    build_patches: list[BuildPatch]

    @property
    def cuda_extensions(self) -> list[str]:
        return [name for name in self.extensions if name not in self.cpu_only]


@cache
def apex_facts(commit: str) -> ApexFacts:
    source = resources.files("verlbox.runtime.patches") / f"apex-{commit}.yaml"
    if not source.is_file():
        raise UsageError(f"verlbox knows no Apex commit {commit} (add runtime/patches/apex-{commit}.yaml)")
    return ApexFacts.model_validate(yaml.safe_load(source.read_text()))
