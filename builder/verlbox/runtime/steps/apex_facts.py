"""What verlbox knows about one Apex commit: the extensions its build makes, which of them fix their
own architectures, and the counted build patches that may be applied (steps/apex-COMMIT.yaml)."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from verlbox.errors import UsageError
from verlbox.runtime.gpu import has_code_for


class BuildPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    file: str
    why: str
    min_cuda: str = "0"  # applied only when nvcc's CUDA version is at least this
    # a patch that keeps setup.py from building this extension: planned only when it would be useless
    skips_extension: str | None = None
    count: int = Field(ge=1)
    find: str
    replace: str


class FixedArchitectures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sass: list[str]
    why: str


class ApexFacts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    commit: str
    tag: str
    extensions: list[str]
    cpu_only: list[str]
    fixed_architectures: dict[str, FixedArchitectures]
    build_patches: list[BuildPatch]

    @model_validator(mode="after")
    def _skipped_extensions_have_fixed_architectures(self) -> ApexFacts:
        # the skip is planned from those architectures: a patch naming another extension would never apply
        for patch in self.build_patches:
            if patch.skips_extension is not None and patch.skips_extension not in self.fixed_architectures:
                raise ValueError(f"build patch {patch.id} skips {patch.skips_extension}, not in fixed_architectures")
        return self

    def unrunnable_on(self, targets: list[str]) -> set[str]:
        """Extensions whose fixed architectures run on none of the target GPUs."""
        return {
            name
            for name, fixed in self.fixed_architectures.items()
            if not any(has_code_for(target, fixed.sass) for target in targets)
        }

    def patches_for(self, targets: list[str]) -> list[BuildPatch]:
        unrunnable = self.unrunnable_on(targets)
        return [patch for patch in self.build_patches if patch.skips_extension in (None, *unrunnable)]

    def skipped_extensions(self, applied_patches: list[str]) -> list[str]:
        """The extension modules a build with these patches applied does not make."""
        skipped = {patch.skips_extension for patch in self.build_patches if patch.id in applied_patches}
        return [name for name in self.extensions if name in skipped]

    def built_extensions(self, applied_patches: list[str]) -> list[str]:
        skipped = self.skipped_extensions(applied_patches)
        return [name for name in self.extensions if name not in skipped]

    def built_cuda_extensions(self, applied_patches: list[str]) -> list[str]:
        return [name for name in self.built_extensions(applied_patches) if name not in self.cpu_only]


@cache
def apex_facts(commit: str) -> ApexFacts:
    source = resources.files("verlbox.runtime.steps") / f"apex-{commit}.yaml"
    if not source.is_file():
        raise UsageError(f"verlbox knows no Apex commit {commit} (add runtime/steps/apex-{commit}.yaml)")
    return ApexFacts.model_validate(yaml.safe_load(source.read_text()))
