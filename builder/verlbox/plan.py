"""The build plan: a validated recipe completed with everything derived from it and the CLI."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

from verlbox import __version__
from verlbox.blocks import Block
from verlbox.patches import patch_set_for
from verlbox.recipe import Recipe

# Pinned here, not in recipes: the verlbox runtime's own needs inside every image. `packaging` is not
# among them: the verl stack already brings the version its own packages need (virtualenv, via ray,
# wants a newer one than a pin here would keep up with).
RUNTIME_REQUIREMENTS = ("pydantic==2.11.7", "PyYAML==6.0.2", "rich==14.0.0", "Jinja2==3.1.6")


@dataclass(frozen=True)
class BuildPlan:
    recipe: Recipe
    base_override: str | None = None
    runtime_requirements: tuple[str, ...] = field(default=RUNTIME_REQUIREMENTS)
    verlbox_version: str = __version__

    @property
    def base_image(self) -> str:
        return self.base_override or self.recipe.base.pinned_reference

    @property
    def cuda_arch_list(self) -> str:
        return ";".join(self.recipe.target_gpus)

    @property
    def torch_requirements(self) -> list[str]:
        """Repeated in every later pip install so that no dependency can swap torch out."""
        torch = self.recipe.torch
        pins = [f"torch=={torch.version}"]
        if torch.torchvision:
            pins.append(f"torchvision=={torch.torchvision}")
        if torch.torchaudio:
            pins.append(f"torchaudio=={torch.torchaudio}")
        return pins

    @property
    def verl_requirements(self) -> list[str]:
        return [f"{name}=={version}" for name, version in sorted(self.recipe.verl.dependencies.items())]

    @cached_property
    def blocks(self) -> list[Block]:
        """Ordered for the layer cache: what changes rarely comes first."""
        recipe = self.recipe
        names = ["system"]
        names += ["cudnn"] if recipe.cudnn else []
        names += ["torch"]
        names += ["apex"] if recipe.apex else []
        names += ["vllm"] if recipe.vllm else []
        names += ["verl", "runtime"]
        return [Block(name, self) for name in names]

    @property
    def builder_blocks(self) -> list[Block]:
        return [block for block in self.blocks if block.has("builder")]

    @cached_property
    def lock_text(self) -> str | None:
        lock = self.recipe.lock_file
        return lock.read_text() if lock else None

    @cached_property
    def patch_set_hash(self) -> str:
        return patch_set_for(self.recipe.verl.version).content_hash

    @property
    def labels(self) -> dict[str, str]:
        labels = {
            "org.opencontainers.image.title": f"verlbox {self.recipe.name}",
            "org.opencontainers.image.description": self.recipe.description,
            "io.verlbox.version": self.verlbox_version,
            "io.verlbox.recipe": self.recipe.name,
            "io.verlbox.recipe.hash": self.recipe.content_hash,
            "io.verlbox.target-gpus": ",".join(self.recipe.target_gpus),
            "io.verlbox.verl-patch-set.hash": self.patch_set_hash,
        }
        if self.lock_text:
            labels["io.verlbox.lock.hash"] = hashlib.sha256(self.lock_text.encode()).hexdigest()
        for component, version in self.recipe.pins().items():
            labels[f"io.verlbox.pin.{component}"] = version
        return labels

    @property
    def label_pairs(self) -> list[str]:
        return [f"{key}={json.dumps(value)}" for key, value in self.labels.items()]
