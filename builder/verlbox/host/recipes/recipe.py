"""Recipe files: YAML, merged along `extends:`, validated by a schema, completed with derived values.

A recipe argument is either a shipped recipe's name (`p40`) or a path to a YAML file (anything with
a `/` or a .yaml/.yml suffix), relative to the current folder: a path never falls back to a
shipped recipe of the same name. `extends:` names a file beside the extending one (by name, looked for
there first, or by file name) or a shipped recipe (by name or path); it reads nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, create_model, field_validator

from verlbox import paths
from verlbox.errors import RecipeError
from verlbox.host.clients.reference import parse_reference
from verlbox.host.recipes.components import COMPONENTS, Component
from verlbox.host.recipes.schema import ComputeCapability, Digest, Slug, Strict, Text, describe_error
from verlbox.runtime.gpu import UnsupportedGpu, capability_for
from verlbox.runtime.training.spec import ImageSpec

LOCK_SUFFIX = ".lock.json"


class Bootstrap(Strict):
    """How to make an equivalent base locally with debootstrap when no registry is reachable.

    The Debian mirror is not part of the recipe: it comes from the host's own apt configuration
    or from --apt-mirror (see verlbox.host.building.bootstrap).
    """

    suite: Slug
    variant: Literal["minbase"] = "minbase"

    @property
    def reference(self) -> str:
        """The local image `--bootstrap-base` makes: never a name an image of a registry has."""
        return f"verlbox-base/debian:{self.suite}-{self.variant}"


class Base(Strict):
    image: Text
    digest: Digest | None = None
    bootstrap: Bootstrap | None = None
    # the base's /etc/os-release ID: a Debian mirror (--apt-mirror) and `verlbox bundle` need Debian's archive.
    # A fact of the base image, which the recipe hash already covers; every apt step checks it in the image.
    distribution: Literal["debian", "ubuntu"] = Field(default="debian", exclude=True)

    @property
    def distribution_name(self) -> str:
        return {"debian": "Debian", "ubuntu": "Ubuntu"}[self.distribution]

    @field_validator("image")
    @classmethod
    def _pinned_tag(cls, value: str) -> str:
        reference = parse_reference(value)
        if reference.digest or not reference.tag:
            raise ValueError(f"expected NAME:TAG (the digest goes under base.digest), got {value!r}")
        if reference.tag == "latest":
            raise ValueError(f"{value!r} uses the floating tag 'latest'; pin a real tag (and its digest)")
        return value

    @property
    def pinned_reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image

    @property
    def references(self) -> list[str]:
        """The references a build of this base may use, and so a lock name: the registry's, else the bootstrapped."""
        return [self.pinned_reference] + ([self.bootstrap.reference] if self.bootstrap else [])


class Cuda(Strict):
    version: Text = Field(pattern=r"^[0-9]+\.[0-9]+$")
    provided_by: Literal["base-image", "torch-wheels"]


class RecipeHead(Strict):
    """The parts of a recipe that are not components: identity, targets, base and CUDA."""

    name: Slug
    description: Text
    target_gpus: list[ComputeCapability] = Field(min_length=1)
    base: Base
    cuda: Cuda
    profile: Slug
    _source: Path | None = PrivateAttr(default=None)

    @field_validator("target_gpus")
    @classmethod
    def _known_gpus(cls, value: list[str]) -> list[str]:
        for compute_capability in value:
            try:
                capability_for(compute_capability)
            except UnsupportedGpu as exc:
                raise ValueError(str(exc)) from None
        return value

    def components(self) -> Iterator[Component]:
        """The recipe's components in layer-cache order."""
        for component in COMPONENTS:
            if (value := getattr(self, component.key)) is not None:
                yield value

    @property
    def source(self) -> Path | None:
        return self._source

    @cached_property
    def shipped(self) -> bool:
        """Whether this is verlbox's shipped recipe of its name, by content, wherever the file lies: the same
        recipe and the same lock beside it (a build installs what the lock says). A user's unchanged copy of
        both is; an edited copy, a copy locked anew or unlocked, or a file that takes a shipped name is not."""
        if self.name not in recipe_names():
            return False
        try:
            shipped = load_recipe(self.name)
        except RecipeError:  # a broken shipped recipe is no reason to refuse the user's own
            return False
        if shipped.content_hash != self.content_hash:
            return False
        own_lock = _bytes(self.lock_path)  # read first: when this is the shipped recipe, its lock is its own error
        try:
            return _bytes(shipped.lock_path) == own_lock
        except RecipeError:  # nor is a shipped lock that cannot be read
            return False

    @property
    def lock_path(self) -> Path | None:
        """STEM.lock.json beside the recipe file: where `verlbox lock` writes and builds read."""
        return None if self._source is None else self._source.with_name(self._source.stem + LOCK_SUFFIX)

    @cached_property
    def content_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def pins(self) -> dict[str, str]:
        """Every pinned component, flat: what the image labels and the smoke checks compare against."""
        pins = {"cuda": self.cuda.version}
        for component in self.components():
            pins |= component.pins()
        return pins

    def image_spec(self) -> ImageSpec:
        """What the image side needs to know about its recipe (baked into the image as JSON)."""
        vllm = getattr(self, "vllm", None)
        apex = getattr(self, "apex", None)
        return ImageSpec(
            name=self.name,
            recipe_hash=self.content_hash,
            target_gpus=self.target_gpus,
            cuda=self.cuda.version,
            verl=self.verl.version,
            profile=self.profile,
            vllm_kernels_for=vllm.kernels_for if vllm else None,
            apex_commit=apex.commit if apex else None,
            pins=self.pins(),
        )


def _component_field(component: type[Component]) -> tuple[Any, Any]:
    if not component.required:
        return (component | None, None)
    try:
        return (component, component())
    except ValidationError:
        return (component, ...)


Recipe = create_model(  # type: ignore[call-overload]
    "Recipe", __base__=RecipeHead, **{component.key: _component_field(component) for component in COMPONENTS}
)


def recipe_names(recipes_dir: Path | None = None) -> list[str]:
    """Buildable recipes; files starting with '_' are shared parts, used only through `extends:`."""
    directory = recipes_dir or paths.recipes_dir()
    return sorted(p.stem for p in directory.glob("*.yaml") if not p.name.startswith("_"))


def looks_like_path(reference: str) -> bool:
    """Whether a recipe argument names a file (`mine/p40.yaml`) rather than a shipped recipe (`p40`)."""
    return "/" in reference or reference.endswith((".yaml", ".yml"))


def _bytes(path: Path | None) -> bytes | None:
    if path is None or not path.is_file():
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc}): it must be readable by whoever runs verlbox"
        raise RecipeError(path, "", why) from exc


def resolve_recipe_path(reference: str) -> Path:
    """A shipped recipe's name, or a path to a YAML file relative to the current folder."""
    if looks_like_path(reference):
        path = Path(reference).expanduser()
        if not path.is_file():
            # `verlbox shell verlbox/p40-cu124:TAG`: an image where a recipe goes
            image = "" if reference.endswith((".yaml", ".yml", "/")) else f" (an image? give --image {reference})"
            raise RecipeError(reference, "", "no such recipe file" + image)
        return path.resolve()
    shipped = paths.recipes_dir() / f"{reference}.yaml"
    if reference.startswith("_") or not shipped.is_file():
        known = ", ".join(recipe_names()) or "none"
        raise RecipeError(reference, "", f"no shipped recipe of that name (known: {known}; a file path needs a '/')")
    return shipped.resolve()


def _resolve_parent(reference: str, child: Path) -> Path:
    """The file `extends: REFERENCE` of recipe CHILD (a resolved path) reads: a shipped recipe, by name or path, or
    a file in CHILD's own folder, never any other file (a stranger's recipe must not make verlbox read, and quote
    in its errors, a file of their choosing)."""
    shipped, folder, given = paths.recipes_dir().resolve(), child.parent, Path(reference)
    expected = f"a shipped recipe's name or a file beside {child.name}"
    if not looks_like_path(reference):
        candidates = [folder / f"{reference}.yaml", shipped / f"{reference}.yaml"]
    elif given.is_absolute() or len(given.parts) == 1:
        candidates = [folder / given]  # an absolute GIVEN replaces FOLDER
    else:
        raise RecipeError(child, "extends", f"expected {expected} (no folder, no '..'), got {reference!r}")
    for candidate in candidates:
        try:
            found = candidate.resolve()
        except (OSError, RuntimeError, ValueError):  # a link loop, a NUL: no file verlbox will read
            raise RecipeError(child, "extends", f"expected {expected}, got {reference!r}") from None
        if found.parent not in (folder, shipped):
            raise RecipeError(
                child, "extends", f"{reference!r} leads out of {folder} (a symbolic link?): expected {expected}"
            )
        if found.is_file():
            return found
    raise RecipeError(
        child, "extends", f"{reference!r} does not exist (looked beside {child.name} and among the shipped recipes)"
    )


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What YAML found wrong and where, never the lines around it: PyYAML quotes those, and a file that is no
    recipe at all may hold a secret."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(error, "problem", None) or getattr(error, "reason", None) or type(error).__name__
    return f"{problem}{where}"


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(path, "", f"not valid YAML: {_yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(path, "", f"cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise RecipeError(path, "", "expected a mapping of keys at the top level")
    return data


def _merge(
    parent: Mapping[str, Any],
    child: Mapping[str, Any],
    child_file: Path,
    origins: dict[tuple[str, ...], Path],
    prefix: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Deep-merge mappings; the child wins, `key: null` removes a parent's key, lists are replaced."""
    merged = dict(parent)
    for key, value in child.items():
        path = (*prefix, str(key))
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value, child_file, origins, path)
        else:
            merged[key] = value
        origins[path] = child_file
    return merged


def _load_merged(path: Path, chain: tuple[Path, ...], origins: dict[tuple[str, ...], Path]) -> dict[str, Any]:
    if path in chain:
        loop = " -> ".join(p.name for p in (*chain, path))
        raise RecipeError(chain[-1], "extends", f"`extends:` loops back on itself ({loop})")
    data = _read_mapping(path)
    if chain:  # a name belongs to its own file: a parent's is never inherited
        data.pop("name", None)
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        return _merge({}, data, path, origins)
    if not isinstance(parent_ref, str):
        raise RecipeError(path, "extends", f"expected the name or path of another recipe, got {parent_ref!r}")
    parent = _load_merged(_resolve_parent(parent_ref, path), (*chain, path), origins)
    return _merge(parent, data, path, origins)


def _origin(loc: tuple[str, ...], origins: dict[tuple[str, ...], Path], fallback: Path) -> Path:
    for end in range(len(loc), 0, -1):
        if loc[:end] in origins:
            return origins[loc[:end]]
    return fallback


def load_recipe(reference: str | Path) -> RecipeHead:
    path = resolve_recipe_path(str(reference))
    origins: dict[tuple[str, ...], Path] = {}
    data = _load_merged(path, (), origins)
    data.setdefault("name", path.stem.lstrip("_"))
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error["loc"])
            problems.append(RecipeError(_origin(loc, origins, path), ".".join(loc), describe_error(error)))
        first = problems[0]
        if len(problems) > 1:
            first.args = ("\n".join(str(p) for p in problems),)
        raise first from None
    recipe._source = path
    return recipe
