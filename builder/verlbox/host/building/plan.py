"""The build plan: a validated recipe completed with everything derived from it and the command line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from packaging.utils import canonicalize_name

from verlbox import __version__
from verlbox.errors import UsageError
from verlbox.host.building.templating import TEMPLATES
from verlbox.host.recipes.components import Apex, Component
from verlbox.host.recipes.lock import Lock, read_lock
from verlbox.host.recipes.recipe import RecipeHead
from verlbox.runtime.training.patches import patch_set_for

RECIPE_ORIGIN_LABEL = "io.verlbox.recipe.origin"


def from_users_recipe(labels: Mapping[str, str]) -> bool:
    """Whether an image's LABELS say it was built from a user's recipe, not verlbox's shipped one of its name."""
    return labels.get(RECIPE_ORIGIN_LABEL) == "user"


def users_recipe_note(image: str, name: str) -> str:
    """What to tell someone who named IMAGE's recipe NAME when the image came from their own file of that name."""
    return f"{image} was built from your own recipe file named {name} (label {RECIPE_ORIGIN_LABEL}=user)"


Part = Literal["system", "builder", "final"]


@dataclass(frozen=True)
class Block:
    """A component placed in a plan: renders its template's macros with the plan around it."""

    component: Component
    plan: BuildPlan

    @property
    def name(self) -> str:
        return self.component.key

    def _module(self) -> object:
        return TEMPLATES.get_template(f"{self.name}.j2").module

    def has(self, part: Part) -> bool:
        return callable(getattr(self._module(), part, None))

    def render(self, part: Part) -> str:
        macro = getattr(self._module(), part)
        return str(macro(self.component, self.plan)).strip("\n")


@dataclass(frozen=True)
class BuildPlan:
    recipe: RecipeHead
    base_override: str | None = None
    verlbox_version: str = __version__
    # built from a bundle: no step has a network, compiled parts come prebuilt from the bundle
    offline: bool = False
    # False for `verlbox lock`: it replaces the lock, so a stale or faulty one must not stand in its way
    use_lock: bool = True

    def __post_init__(self) -> None:
        if self.offline and not self.lock:
            raise UsageError(f"recipe {self.recipe.name} has no lock: an offline build installs exactly a lock")

    @property
    def base_image(self) -> str:
        return self.base_override or self.recipe.base.pinned_reference

    @cached_property
    def blocks(self) -> list[Block]:
        return [Block(component, self) for component in self.recipe.components()]

    @property
    def builder_blocks(self) -> list[Block]:
        return [block for block in self.blocks if block.has("builder")]

    @property
    def torch_index(self) -> str | None:
        return self.recipe.torch.index  # type: ignore[attr-defined]

    @property
    def build_secrets(self) -> list[str]:
        """BuildKit secrets every installing RUN may read (each optional; none is ever written to a layer)."""
        if self.offline:
            return []
        return ["ca_bundle", "pip_index_url", "apt_mirror"] + (["torch_index_url"] if self.torch_index else [])

    @property
    def torch_extra_index(self) -> str:
        """Later pip installs see torch's own index too, so that the pinned torch stays resolvable."""
        return "--extra-index=torch" if self.torch_index else ""

    @property
    def apex(self) -> Apex | None:
        return self.recipe.apex  # type: ignore[attr-defined]

    @cached_property
    def lock(self) -> Lock | None:
        """The recipe's lock; one made for another version of the recipe is refused, never half-applied."""
        path = self.recipe.lock_path
        if not self.use_lock or not path or not path.is_file():
            return None
        lock = read_lock(path, self.recipe, self.base_override)
        if lock.recipe_hash != self.recipe.content_hash:
            raise UsageError(
                f"{path}: made for another version of recipe {self.recipe.name} (hash {lock.recipe_hash[:12]}, now "
                f"{self.recipe.content_hash[:12]}): move it aside, build, and run `verlbox lock` again"
            )
        return lock

    def lock_slice(self, step: str, kind: str) -> str | None:
        """What a step installs under the lock: pip requirements with hashes, or apt `name=version` lines.

        Offline, a file the lock names by URL is found by name and version in the bundle instead.
        """
        return self.lock.slice(step, kind, by_version=self.offline) if self.lock else None

    def locked_steps(self, step: str | list[str] | None, kind: str | None) -> list[str]:
        """Of the step (or the steps one RUN installs), those the lock has a KIND slice for."""
        names = [] if step is None or kind is None else [step] if isinstance(step, str) else step
        return [name for name in names if kind and self.lock_slice(name, kind)]

    @property
    def source_date_epoch(self) -> int | None:
        return self.lock.source_date_epoch if self.offline and self.lock else None

    @property
    def bundle_stages(self) -> bool:
        """Stages `verlbox bundle` exports (after `final`, so they never touch the image's cache)."""
        return self.lock is not None and not self.offline

    @cached_property
    def patch_set_hash(self) -> str:
        return patch_set_for(self.recipe.verl.version).content_hash  # type: ignore[attr-defined]

    @property
    def labels(self) -> dict[str, str]:
        labels = {
            "org.opencontainers.image.title": f"verlbox {self.recipe.name}",
            "org.opencontainers.image.description": self.recipe.description,
            "io.verlbox.version": self.verlbox_version,
            "io.verlbox.recipe": self.recipe.name,
            "io.verlbox.recipe.hash": self.recipe.content_hash,
            # init, verify and smoke hold only a shipped recipe's images to this verlbox's version of it; a
            # user's file named like one (an edited copy) has nothing here to be held to
            RECIPE_ORIGIN_LABEL: "shipped" if self.recipe.shipped else "user",
            "io.verlbox.base": self.base_image,
            "io.verlbox.target-gpus": ",".join(self.recipe.target_gpus),
            "io.verlbox.verl-patch-set.hash": self.patch_set_hash,
        }
        if self.lock:
            labels["io.verlbox.lock.hash"] = self.lock.content_hash
        for component, version in self.recipe.pins().items():
            labels[f"io.verlbox.pin.{canonicalize_name(component)}"] = version  # label keys are lowercase
        return labels
