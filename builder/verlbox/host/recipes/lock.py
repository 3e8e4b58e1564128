"""Lock files: what a recipe's last good build installed, step by step, with hashes.

STEM.lock.json beside the recipe file (always named after the file, whatever `name:` says) holds,
for each install step, the Python files pip installed (name, version, sha256) and the Debian
packages apt installed over the base (name, version), plus the base's identity. Builds of a locked
recipe install each step's slice exactly: `pip install --no-deps --require-hashes` and
`apt-get install name=version`. `verlbox lock` writes it from a built image's own build record;
`verlbox verify` compares an image with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, ValidationError, field_validator

from verlbox import paths
from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.host.clients.engine import docker_output
from verlbox.host.recipes.basetree import image_tree_digest
from verlbox.host.recipes.recipe import RecipeHead
from verlbox.host.recipes.schema import (
    DebianPackage,
    DebianPin,
    DebianVersion,
    Digest,
    DistributionFile,
    DistributionName,
    ExactVersion,
    HttpsUrl,
    ImageReference,
    Sha256,
    Slug,
    Strict,
    Text,
    fault_lines,
)
from verlbox.runtime.steps.build_record import requirement_lines

LOCK_FORMAT = 1
# a build record as the image's Python dumps it: step -> "pip"/"apt" -> entries
Records = dict[str, dict[str, list[dict[str, str]]]]
# a lock is reviewed, then trusted by offline builds: every value has one shape, and none can become an
# option, a second line or a path outside the build context on its way into a shell or a file name


class PipEntry(Strict):
    file: DistributionFile
    name: DistributionName
    sha256: Sha256
    url: HttpsUrl | None = None  # only a URL the recipe itself names (build_record keeps no index URL)
    version: ExactVersion


class AptEntry(Strict):
    name: DebianPackage
    version: DebianVersion


class LockedBase(Strict):
    reference: ImageReference
    image_id: Digest
    # a registry base: its repository digest; a bootstrapped one: its packages and the digest of its files
    # (basetree.py: the same from any machine that bootstraps those packages; its image ID is not)
    digest: Annotated[Text, Field(pattern=r"^[^@\s]+@sha256:[0-9a-f]{64}$")] | None = None
    packages: list[DebianPin] | None = None
    tree: Sha256 | None = None


class LockStep(Strict):
    name: Slug
    stage: Literal["final", "builder"]  # a builder stage's packages never reach the image
    pip: list[PipEntry] = Field(default_factory=list)
    apt: list[AptEntry] = Field(default_factory=list)


class LockedLayer(Strict):
    diff_id: Digest  # the sha256 of the layer's bytes, as the engine names it
    step: Text  # what made it, as the image's history says (image_files.layer_steps)


class LockedLayers(Strict):
    """The layers above the base of an offline (bundle) build of the lock, which repeats to the byte: an image whose
    layers are these holds the files that build verified, wherever it was built."""

    # the verlbox source those builds carry (context.image_source_digest): one of their layers installs it
    verlbox: Sha256
    layers: Annotated[list[LockedLayer], Field(min_length=1)]  # none would make the bare base "the build"
    # what a container of that build runs with (built.runtime_config's digest): no layer holds it
    config: Sha256

    @property
    def diff_ids(self) -> list[str]:
        return [layer.diff_id for layer in self.layers]


class Lock(Strict):
    format: Literal[1] = LOCK_FORMAT
    recipe: Slug
    recipe_hash: Sha256
    base: LockedBase
    steps: list[LockStep]  # in build order: a later step may replace what an earlier one installed
    # what a builder stage compiled (Apex's wheel), by block: an offline build takes exactly these files
    compiled: dict[Slug, list[PipEntry]] = Field(default_factory=dict)
    # the date every file and history entry of an offline (bundle) build is clamped to: the locked build's
    source_date_epoch: NonNegativeInt | None = None
    # recorded after the lock, from an offline build of it (`verlbox lock --layers-of`): not part of its hash,
    # which that build's labels, image spec and bundle carry
    layers: LockedLayers | None = None

    @field_validator("steps")
    @classmethod
    def _steps_once(cls, steps: list[LockStep]) -> list[LockStep]:
        names = [step.name for step in steps]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"step {', '.join(twice)} is listed more than once")
        return steps

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json(exclude_none=True, exclude={"layers"}).encode()).hexdigest()

    def step(self, name: str) -> LockStep | None:
        return next((step for step in self.steps if step.name == name), None)

    def slice(self, name: str, kind: str, by_version: bool = False) -> str | None:
        step = self.step(name)
        entries = getattr(step, kind) if step else None
        if not entries:
            return None
        if kind == "pip":
            # by_version: a file the lock names by URL is found by name and version (offline, in a folder)
            lines = requirement_lines(
                [entry.model_dump(exclude_none=True, exclude={"url"} if by_version else set()) for entry in entries]
            )
        else:
            lines = [f"{entry.name}={entry.version}" for entry in entries]
        return "\n".join(lines) + "\n"

    def packages(self, kind: str) -> dict[str, str]:
        """What the final image holds, by name: the last step that installed a package decides its version."""
        return {e.name: e.version for step in self.steps if step.stage == "final" for e in getattr(step, kind)}

    def check_steps(self, installing: list[str], path: Path, *, offline: bool) -> None:
        """The lock's steps are exactly the steps the recipe's Dockerfile installs in: a step left out would
        install unpinned, a step the recipe lacks would name files nothing checks. Offline, the builder
        stages' steps are not run (their output comes prebuilt from the bundle)."""
        missing = [name for name in installing if not self.step(name)]
        extra = [
            step.name
            for step in self.steps
            if step.name not in installing and not (offline and step.stage == "builder")
        ]
        problems = [f"{path}: steps: no step {name}, which the recipe installs in" for name in missing]
        problems += [f"{path}: steps: step {name} is not one the recipe installs in" for name in extra]
        if problems:
            raise UsageError("\n".join(p + ": run `verlbox lock` again" for p in problems))


def read_lock(path: Path, recipe: RecipeHead | None = None, base_override: str | None = None) -> Lock:
    """The lock at PATH; with RECIPE, one that names RECIPE's base (or BASE_OVERRIDE, the copy a build was
    told to use): a lock loads and tags its base under base.reference (from a bundle), where a name like
    debian:bookworm would feed other projects' FROM lines."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: not a verlbox lock ({' '.join(str(exc).split())[:300]}); run `verlbox lock`"
        ) from None
    try:
        lock = Lock.model_validate(data)
    except ValidationError as exc:
        raise UsageError("\n".join(f"{path}: {line}" for line in fault_lines(exc))) from None
    allowed = [] if recipe is None else [*recipe.base.references, *([base_override] if base_override else [])]
    if recipe is not None and lock.base.reference not in allowed:
        raise UsageError(
            f"{path}: base.reference: expected {' or '.join(allowed)} (recipe {recipe.name}'s base), "
            f"got {lock.base.reference}"
        )
    if recipe is not None and lock.base.reference == recipe.base.pinned_reference:
        _registry_digest(path, lock.base, recipe.base.digest)
    return lock


def _registry_digest(path: Path, base: LockedBase, pinned: str | None) -> None:
    """A lock of a registry base carries its repository digest (the recipe's own, where the recipe pins one): the
    image ID alone is only what the lock's author says, and a bundle's base.tar would be held to nothing else."""
    if base.digest is None:
        raise UsageError(
            f"{path}: base.digest: a registry base ({base.reference}) needs its repository digest: "
            "run `verlbox lock` on an image built from the registry's base"
        )
    if pinned is not None and base.digest.partition("@")[2] != pinned:
        raise UsageError(f"{path}: base.digest: {base.digest}, but the recipe pins {pinned}")


def image_records(image: str, module: str = "verlbox.runtime.steps.build_record") -> Any:
    """A record the image carries (/opt/verlbox/build-record), read by the image's own Python: by default
    each step's packages; with verlbox.runtime.steps.compiled_record, each builder stage's compiled wheels."""
    return json.loads(docker_output("run", "--rm", "--entrypoint", "python", image, "-m", module, "dump"))


def steps_in_build_order(dockerfile: str, records: Records) -> list[LockStep]:
    """The recorded steps, in the order the Dockerfile runs them (each step names itself when it records).

    A step in a `*-build` stage is a builder step: its packages build something (Apex) and stay there.
    """
    order = installing_steps(dockerfile)
    steps = []
    for name, kinds in records.items():
        if name not in order:
            raise VerlboxError(f"the image records a step {name!r} this recipe's Dockerfile does not have")
        try:
            steps.append(LockStep(name=name, stage=order[name], **kinds))
        except ValidationError as exc:
            faults = "; ".join(fault_lines(exc)[:3])
            raise VerlboxError(f"the image's record of step {name} cannot be locked: {faults}") from None
    return sorted(steps, key=lambda step: list(order).index(step.name))


def installing_steps(dockerfile: str) -> dict[str, Literal["final", "builder"]]:
    """The steps a Dockerfile installs in, in order, each with its stage: "builder" in a `*-build` stage."""
    order: dict[str, Literal["final", "builder"]] = {}
    for stage in re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]:
        name = stage.split("\n", 1)[0].rsplit(" AS ", 1)[-1]
        for step in re.findall(r"steps\.sh(?: --offline)? (?:pip|apt)(?: '?--[^ ]+)* ([a-z0-9-]+)", stage):
            order[step] = "builder" if name.endswith("-build") else "final"
    return order


def image_created(image: str) -> int:
    """The image's creation time in whole seconds (Docker prints it as RFC 3339 with nanoseconds)."""
    created = docker_output("image", "inspect", "--format", "{{.Created}}", image).strip()
    return int(datetime.strptime(created[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp())


def image_labels(image: str) -> dict[str, str]:
    return json.loads(docker_output("image", "inspect", "--format", "{{json .Config.Labels}}", image)) or {}


def base_identity(reference: str) -> dict[str, Any]:
    """A base by registry digest where it has one; a local base (debootstrap) by image ID and packages."""
    inspected = json.loads(docker_output("image", "inspect", reference))[0]
    identity: dict[str, Any] = {"reference": reference, "image_id": inspected["Id"]}
    if inspected.get("RepoDigests"):
        identity["digest"] = inspected["RepoDigests"][0]
    else:
        packages = docker_output(
            "run", "--rm", "--entrypoint", "dpkg-query", reference, "-W", "-f", "${Package}=${Version}\\n"
        )
        identity["packages"] = sorted(packages.split())
        identity["tree"] = image_tree_digest(reference)
    return identity


def lock_from_image(recipe_name: str, recipe_hash: str, dockerfile: str, image: str) -> Lock:
    labels = image_labels(image)
    if labels.get("io.verlbox.recipe") != recipe_name:
        built_from = labels.get("io.verlbox.recipe") or "no verlbox recipe"
        raise UsageError(f"{image} was built from {built_from}, not recipe {recipe_name}: lock it as that recipe")
    base = labels.get("io.verlbox.base")
    if not base:
        raise VerlboxError(f"{image} carries no io.verlbox.base label: build it with this verlbox first")
    return Lock(
        recipe=recipe_name,
        recipe_hash=recipe_hash,
        base=base_identity(base),
        steps=steps_in_build_order(dockerfile, image_records(image)),
        compiled=image_records(image, "verlbox.runtime.steps.compiled_record"),
        source_date_epoch=image_created(image),
    )


def lock_target(recipe: Any, out: Path | None) -> Path:
    """Where `verlbox lock` writes: OUT, else beside the recipe file, but never into verlbox's own installed
    files (a shipped recipe of a wheel install lives in site-packages, which pip owns and `verify` reads)."""
    target = out or recipe.lock_path
    if target is None:
        raise UsageError(f"recipe {recipe.name} was not read from a file, so it has no place for a lock: pass --out")
    if target.resolve().is_relative_to(paths.PACKAGE_DIR):
        raise UsageError(
            f"{target} is inside the installed verlbox: copy the recipe into a folder of yours "
            f"(a file with `extends: {recipe.name}`) and lock that, or pass --out FILE"
        )
    return target


def write_lock(path: Path, lock: Lock) -> None:
    write_atomically(path, json.dumps(lock.model_dump(exclude_none=True), indent=1) + "\n")
