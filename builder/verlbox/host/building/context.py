"""The build context: Dockerfile, image spec, build tools and lock slices, Apex's inputs, and verlbox itself.

verlbox's package is copied from wherever it is installed (a checkout, an editable install or a
wheel), with a minimal pyproject of its own, so building works the same from all three. The same
plan and package give the same bytes, so the layer cache holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from verlbox import paths
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.building.sources import BuildSources


@dataclass(frozen=True)
class OfflineRepository:
    """What an offline build's apt sees of a bundle: a `file:` repository made of its signed indexes (one
    sources line per suite) and each step's .debs placed where their Packages entry puts them (bundle.py
    makes it; the context writes it)."""

    sources: str
    pools: dict[str, list[tuple[str, str]]]  # step -> (.deb file name, path in the repository)


_IMAGE_PYPROJECT = """\
# verlbox inside an image: the runtime only needs what the image's runtime step installed.
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "verlbox"
version = "{version}"
requires-python = ">=3.10"

[project.scripts]
verlbox = "verlbox.cli:main"

[tool.setuptools.packages.find]
include = ["verlbox*"]

[tool.setuptools.package-data]
"*" = ["*.yaml", "*.j2", "*.sh", "memcap/*.py", "profiles/*.yaml", "templates/*"]
"""


# what of verlbox's own package an image carries (the shipped recipes stay on the host)
_NOT_CARRIED = ("__pycache__", "*.pyc", "shipped")


def image_source(version: str) -> dict[str, bytes]:
    """The files of verlbox's source an image is built with (its `verlbox-src` context), by relative path."""
    files = {"pyproject.toml": _IMAGE_PYPROJECT.format(version=version).encode()}
    ignore = shutil.ignore_patterns(*_NOT_CARRIED)
    for folder, names, file_names in os.walk(paths.PACKAGE_DIR):
        skipped = ignore(folder, [*names, *file_names])
        names[:] = sorted(name for name in names if name not in skipped)
        for name in sorted(set(file_names) - skipped):
            path = Path(folder, name)
            files[str(Path("verlbox", path.relative_to(paths.PACKAGE_DIR)))] = path.read_bytes()
    return files


def image_source_digest(version: str) -> str:
    """A sha256 over the verlbox source an image of this verlbox carries (paths and bytes): the layer that installs
    verlbox is built from exactly this, so layers recorded with another digest cannot be this verlbox's."""
    digest = hashlib.sha256()
    for path, data in sorted(image_source(version).items()):
        digest.update(f"{path}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def _template_text(name: str) -> str:
    return resources.files("verlbox.host.building").joinpath("templates", name).read_text()


def _write_bundle_slices(plan: BuildPlan, directory: Path) -> None:
    """What the bundle stages fetch: every step's Python files; the Debian packages of the image's own steps.

    A builder stage's .debs (a compiler) are left out: an offline build takes that stage's output
    prebuilt from the bundle.
    """
    assert plan.lock is not None
    for kind in ("pip", "apt"):
        (directory / kind).mkdir(parents=True)
    for step in plan.lock.steps:
        if step.pip:  # fetched by name and sha256, so the entries themselves
            record = [entry.model_dump(exclude_none=True) for entry in step.pip]
            (directory / "pip" / f"{step.name}.json").write_text(json.dumps(record, indent=1) + "\n")
        if step.stage == "final" and (text := plan.lock.slice(step.name, "apt")):
            (directory / "apt" / f"{step.name}.txt").write_text(text)


def _write_offline_repository(repository: OfflineRepository, directory: Path) -> None:
    """apt's sources for the bundle's repository, and per apt step where its .debs go in it (pool.txt)."""
    directory.mkdir()
    (directory / "sources.list").write_text(repository.sources)
    for step, placed in repository.pools.items():
        (directory / f"{step}.pool.txt").write_text("".join(f"{deb} {path}\n" for deb, path in placed))


def write_context(
    plan: BuildPlan,
    directory: Path,
    sources: BuildSources | None = None,
    offline_repository: OfflineRepository | None = None,
) -> Path:
    (directory / "Dockerfile").write_text(render_dockerfile(plan))
    tools = directory / "verlbox-build"
    (tools / "lock").mkdir(parents=True)
    # the build steps, mounted into every installing RUN (a change to them rebuilds every layer)
    steps = tools / "steps"
    steps.mkdir()
    (steps / "steps.sh").write_text(_template_text("steps.sh"))
    for module in ("build_steps.py", "build_record.py", "urls.py"):
        shutil.copy2(paths.PACKAGE_DIR / "runtime" / "steps" / module, steps / module)
    shutil.copy2(paths.PACKAGE_DIR / "runtime" / "steps" / "compiled_record.py", tools / "compiled.py")
    if plan.offline:
        assert offline_repository is not None, "an offline build's context holds its bundle's repository"
        _write_offline_repository(offline_repository, tools / "offline")
    if plan.bundle_stages and plan.lock:
        _write_bundle_slices(plan, tools / "bundle")
    for step in plan.lock.steps if plan.lock else []:
        for kind in ("pip", "apt"):
            if text := plan.lock_slice(step.name, kind):
                (tools / "lock" / f"{step.name}.{kind}.txt").write_text(text)
        if step.pip:  # the step's record, when the build installs exactly these
            record = [entry.model_dump(exclude_none=True) for entry in step.pip]
            (tools / "lock" / f"{step.name}.pip.json").write_text(json.dumps(record, indent=1) + "\n")
    spec = plan.recipe.image_spec().model_copy(update={"lock_hash": plan.lock.content_hash if plan.lock else None})
    (directory / "image-spec.json").write_text(spec.model_dump_json(indent=2, exclude_none=True) + "\n")
    if plan.apex and not plan.offline:  # offline, Apex's wheel comes prebuilt from the bundle
        # Apex's own folder: its cache key is the plan, the build script and the archive, nothing else
        apex = directory / "apex"
        apex.mkdir()
        archive = (sources or BuildSources()).archive(plan.apex.archive_pin())
        (apex / "plan.json").write_text(plan.apex.build_plan_json(plan.recipe.target_gpus, archive.sha256))
        shutil.copy2(paths.PACKAGE_DIR / "runtime" / "steps" / "apex_build.py", apex / "apex_build.py")
        shutil.copyfile(archive.path, apex / plan.apex.archive_name)
    source = directory / "verlbox-src"
    source.mkdir()
    (source / "pyproject.toml").write_text(_IMAGE_PYPROJECT.format(version=plan.verlbox_version))
    shutil.copytree(paths.PACKAGE_DIR, source / "verlbox", ignore=shutil.ignore_patterns(*_NOT_CARRIED))
    return directory
