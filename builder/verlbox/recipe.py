"""Recipe files: YAML, merged along `extends:`, validated by a schema, completed with derived values."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError

from verlbox.errors import RecipeError

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def _must_be_text(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"expected a quoted string, got the number {value!r} (YAML reads 3.10 as 3.1)")
    return value


def _exact_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(
            f"expected an exact version such as '2.6.0', got {value!r} (ranges, wildcards and 'latest' are not pins)"
        ) from None
    return value


_DEBIAN_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")


def _debian_version(value: str) -> str:
    if not _DEBIAN_VERSION.match(value):
        raise ValueError(f"expected an exact Debian package version such as '8.9.7.29-1+cuda11.8', got {value!r}")
    return value


def _image_reference(value: str) -> str:
    name, _, tag = value.rpartition(":")
    if not name or "/" in tag or not tag:
        raise ValueError(f"expected an image reference with an explicit tag (NAME:TAG), got {value!r}")
    if tag == "latest":
        raise ValueError(f"{value!r} uses the floating tag 'latest'; pin a real tag (and its digest)")
    return value


Text = Annotated[str, BeforeValidator(_must_be_text)]
ExactVersion = Annotated[str, BeforeValidator(_must_be_text), AfterValidator(_exact_version)]
DebianVersion = Annotated[str, BeforeValidator(_must_be_text), AfterValidator(_debian_version)]
ImageReference = Annotated[str, AfterValidator(_image_reference)]
ComputeCapability = Annotated[str, BeforeValidator(_must_be_text), Field(pattern=r"^[1-9][0-9]?\.[0-9]$")]
GitCommit = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bootstrap(_Strict):
    """How to make an equivalent base locally when no registry is reachable."""

    suite: Annotated[str, Field(pattern=r"^[a-z]+$")]
    variant: Literal["minbase"] = "minbase"
    mirror: str = "http://deb.debian.org/debian"


class Base(_Strict):
    image: ImageReference
    digest: Digest | None = None
    bootstrap: Bootstrap | None = None

    @property
    def pinned_reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


class Cuda(_Strict):
    version: Annotated[Text, Field(pattern=r"^[0-9]+\.[0-9]+$")]
    provided_by: Literal["base-image", "torch-wheels"]


class Cudnn(_Strict):
    """System cuDNN from NVIDIA's CUDA apt repository, pinned and held."""

    apt_version: DebianVersion

    @property
    def version(self) -> str:
        return self.apt_version.split("-", 1)[0]


class Python(_Strict):
    """The distribution's own Python, in a venv at /opt/venv, with pip pinned."""

    version: Annotated[Text, Field(pattern=r"^3\.[0-9]+$")]
    pip: ExactVersion = "25.1.1"


class Torch(_Strict):
    version: ExactVersion
    torchvision: ExactVersion | None = None
    torchaudio: ExactVersion | None = None
    index_url: str | None = None


class Apex(_Strict):
    repo: str = "https://github.com/NVIDIA/apex"
    commit: GitCommit
    # Apex changed how CUDA extensions are requested at tag 25.09; a commit hash does not say which.
    build_style: Literal["config-settings", "env"] = "config-settings"
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 4


class Vllm(_Strict):
    version: ExactVersion
    wheel_url: str | None = None
    kernels_for: list[ComputeCapability] = Field(min_length=1)


class Verl(_Strict):
    version: ExactVersion
    # installed with --no-deps; every dependency is pinned here instead of trusting verl's metadata
    dependencies: dict[str, ExactVersion]


class Recipe(_Strict):
    name: str
    description: Text
    target_gpus: list[ComputeCapability] = Field(min_length=1)
    base: Base
    cuda: Cuda
    cudnn: Cudnn | None = None
    python: Python
    torch: Torch
    apex: Apex | None = None
    vllm: Vllm | None = None
    verl: Verl
    profile: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    _source: Path | None = PrivateAttr(default=None)

    @property
    def lock_file(self) -> Path | None:
        """NAME.lock.txt beside the recipe file: `pip freeze` of its last good image (`verlbox lock`)."""
        if self._source is None:
            return None
        lock = self._source.with_name(f"{self._source.stem}.lock.txt")
        return lock if lock.is_file() else None

    @cached_property
    def content_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def pins(self) -> dict[str, str]:
        """Every pinned component, flat: what the image labels and the smoke checks compare against."""
        pins = {"python": self.python.version, "cuda": self.cuda.version, "torch": self.torch.version}
        if self.torch.torchvision:
            pins["torchvision"] = self.torch.torchvision
        if self.torch.torchaudio:
            pins["torchaudio"] = self.torch.torchaudio
        if self.cudnn:
            pins["cudnn"] = self.cudnn.version
        if self.apex:
            pins["apex"] = self.apex.commit
        if self.vllm:
            pins["vllm"] = self.vllm.version
        pins["verl"] = self.verl.version
        for requirement, version in self.verl.dependencies.items():
            pins[requirement.split("[", 1)[0]] = version
        return pins


def recipe_names(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """Buildable recipes; files starting with '_' are shared parts, used only through `extends:`."""
    return sorted(p.stem for p in recipes_dir.glob("*.yaml") if not p.name.startswith("_"))


def resolve_recipe_path(reference: str, relative_to: Path = RECIPES_DIR) -> Path:
    """A recipe argument is a name under recipes/ or a path to a YAML file."""
    as_path = Path(reference)
    if as_path.suffix in (".yaml", ".yml") or "/" in reference:
        candidates = [as_path if as_path.is_absolute() else relative_to / as_path, as_path]
    else:
        candidates = [relative_to / f"{reference}.yaml", RECIPES_DIR / f"{reference}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    known = ", ".join(recipe_names()) or "none"
    raise RecipeError(reference, "", f"no such recipe file (recipes known under {RECIPES_DIR}: {known})")


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(path, "", f"not valid YAML: {exc}") from None
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
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        return _merge({}, data, path, origins)
    if not isinstance(parent_ref, str):
        raise RecipeError(path, "extends", f"expected the name or path of another recipe, got {parent_ref!r}")
    try:
        parent_path = resolve_recipe_path(parent_ref, relative_to=path.parent)
    except RecipeError:
        raise RecipeError(
            path, "extends", f"{parent_ref!r} does not exist (looked beside {path.name} and under {RECIPES_DIR})"
        ) from None
    parent = _load_merged(parent_path, (*chain, path), origins)
    return _merge(parent, data, path, origins)


def _origin(loc: tuple[str, ...], origins: dict[tuple[str, ...], Path], fallback: Path) -> Path:
    for end in range(len(loc), 0, -1):
        if loc[:end] in origins:
            return origins[loc[:end]]
    return fallback


def _describe(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    return str(error["msg"]).removeprefix("Value error, ")


def load_recipe(reference: str | Path) -> Recipe:
    path = resolve_recipe_path(str(reference))
    origins: dict[tuple[str, ...], Path] = {}
    data = _load_merged(path, (), origins)
    data.setdefault("name", path.stem)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(part) for part in error["loc"])
            problems.append(RecipeError(_origin(loc, origins, path), ".".join(loc), _describe(error)))
        first = problems[0]
        if len(problems) > 1:
            first.args = ("\n".join(str(p) for p in problems),)
        raise first from None
    recipe._source = path
    return recipe
