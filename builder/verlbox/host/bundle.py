"""Bundles: everything a locked recipe's build needs, in one folder, so that it builds without a network.

`verlbox bundle RECIPE --out DIR` writes:
  base.tar         the base image (`docker save`): the one the lock was made on, kept after its tag is gone
  wheels/          every Python file the lock names, fetched by its sha256
  debs/STEP/       the Debian packages of each of the image's apt steps, at the locked versions
  apex/            compiled parts (Apex's wheel and its source record), built once, taken by hash
  sources/         the source archives the recipe pins (Apex's)
  manifest.json    the recipe and lock it was made for, the base's image ID, and every file's sha256
`verlbox build RECIPE --offline DIR` checks all of it against the manifest before the build starts.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console

from verlbox.errors import UsageError
from verlbox.files import write_atomically
from verlbox.host.build import run_buildx
from verlbox.host.engine import docker_output, require_cli
from verlbox.host.plan import BuildPlan
from verlbox.host.sources import BuildSources
from verlbox.runtime.apex_build import file_sha256

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
BASE_ARCHIVE = "base.tar"


class BundleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reference: str
    image_id: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = BUNDLE_FORMAT
    recipe: str
    recipe_hash: str
    lock_hash: str
    base: BundleBase
    files: dict[str, str]  # path inside the bundle -> sha256


def _hashes(root: Path, paths: list[Path]) -> dict[str, str]:
    # hashlib releases the GIL on large reads: threads use every core
    with ThreadPoolExecutor() as pool:
        digests = pool.map(file_sha256, paths)
    return {path.relative_to(root).as_posix(): digest for path, digest in zip(paths, digests, strict=True)}


def _image_id(reference: str) -> str | None:
    run = subprocess.run(
        [require_cli(), "image", "inspect", "--format", "{{.Id}}", reference], capture_output=True, text=True
    )
    return run.stdout.strip() if run.returncode == 0 else None


def make_bundle(
    plan: BuildPlan, out: Path, *, sources: BuildSources, progress: str = "auto", console: Console
) -> Manifest:
    """Fetch, export and hash into a sibling folder, then rename it to OUT: a failure leaves no OUT behind."""
    lock = plan.lock
    if lock is None:
        raise UsageError(f"recipe {plan.recipe.name} has no lock: build it, run `verlbox lock`, then bundle")
    if lock.source_date_epoch is None:
        raise UsageError(f"{plan.recipe.lock_path}: no source_date_epoch (an older lock): run `verlbox lock` again")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder; give a new one")
    base_id = _image_id(plan.base_image)
    if base_id is None:
        raise UsageError(f"base image {plan.base_image} is not on this engine: build the recipe first")
    sources = sources.with_torch_index(plan.recipe.name, plan.torch_index)
    partial = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"
    partial.mkdir(parents=True)
    try:
        run_buildx(
            plan,
            ["--target", "bundle", "--output", f"type=local,dest={partial}"],
            sources=sources,
            progress=progress,
            console=console,
            what="bundling",
        )
        with console.status(f"saving base image {plan.base_image}"):
            docker_output("image", "save", "--output", str(partial / BASE_ARCHIVE), plan.base_image)
        if plan.apex:
            (partial / "sources").mkdir()
            archive = sources.archive(plan.apex.archive_pin(), console)
            shutil.copyfile(archive.path, partial / "sources" / archive.path.name)
        with console.status("hashing the bundle"):
            files = _hashes(partial, sorted(p for p in partial.rglob("*") if p.is_file()))
        manifest = Manifest(
            recipe=plan.recipe.name,
            recipe_hash=plan.recipe.content_hash,
            lock_hash=lock.content_hash,
            base=BundleBase(reference=plan.base_image, image_id=base_id),
            files=files,
        )
        write_atomically(partial / MANIFEST, manifest.model_dump_json(indent=1) + "\n")
        if out.exists():
            out.rmdir()
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return manifest


def read_manifest(bundle: Path) -> Manifest:
    path = bundle / MANIFEST
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(f"--offline {bundle}: no {MANIFEST}; make a bundle with `verlbox bundle`") from None
    except (OSError, ValueError, ValidationError) as exc:
        raise UsageError(f"{path}: not a verlbox bundle manifest ({' '.join(str(exc).split())[:300]})") from None


def bundle_bytes(bundle: Path, manifest: Manifest) -> int:
    """The size of the files the manifest lists (one that is missing counts nothing: `check_files` names it)."""
    return sum((bundle / name).stat().st_size for name in manifest.files if (bundle / name).is_file())


def check_bundle(plan: BuildPlan, bundle: Path) -> Manifest:
    """The bundle's manifest against the plan's recipe and lock, then every file against its hash."""
    manifest = read_manifest(bundle)
    check_manifest(plan, bundle, manifest)
    check_files(bundle, manifest)
    return manifest


def check_manifest(plan: BuildPlan, bundle: Path, manifest: Manifest) -> None:
    """The manifest was made for the plan's recipe and lock: a bundle for another one is bad input."""
    path = bundle / MANIFEST
    lock = plan.lock
    assert lock is not None  # an offline plan has a lock
    for key, found, expected in (
        ("recipe", manifest.recipe, plan.recipe.name),
        ("recipe_hash", manifest.recipe_hash, plan.recipe.content_hash),
        ("lock_hash", manifest.lock_hash, lock.content_hash),
    ):
        if found != expected:
            raise UsageError(
                f"{path}: {key} is {found}, but recipe {plan.recipe.name} and its lock need {expected}: "
                "this bundle was made for another recipe or lock"
            )


def check_files(bundle: Path, manifest: Manifest) -> None:
    """Every file the manifest lists, present with its hash, and no other.

    A file the manifest does not list is refused too: an offline apt step installs every .deb of its folder.
    """
    path = bundle / MANIFEST
    present = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {MANIFEST}
    listed = set(manifest.files)
    for names, problem in ((listed - present, "listed in it are missing"), (present - listed, "are not listed in it")):
        if names:
            raise UsageError(f"{path}: {len(names)} file(s) {problem}, e.g. {sorted(names)[0]}")
    for name, digest in _hashes(bundle, [bundle / name for name in sorted(manifest.files)]).items():
        if digest != manifest.files[name]:
            raise UsageError(f"{bundle / name}: sha256 {digest}, but {MANIFEST} says {manifest.files[name]}")


def load_base(bundle: Path, manifest: Manifest, console: Console) -> str:
    """The bundle's base on this engine under its reference: loaded from base.tar when it is not there yet."""
    reference, wanted = manifest.base.reference, manifest.base.image_id
    current = _image_id(reference)
    if current == wanted:
        return reference
    if current is not None:
        raise UsageError(
            f"{reference} on this engine is {current[:19]}, not the bundle's base {wanted[:19]}: "
            f"remove or retag it, and the build loads the bundle's {BASE_ARCHIVE}"
        )
    with console.status(f"loading base image {reference} from {bundle / BASE_ARCHIVE}"):
        docker_output("image", "load", "--quiet", "--input", str(bundle / BASE_ARCHIVE))
    if _image_id(reference) != wanted:
        raise UsageError(f"{bundle / BASE_ARCHIVE}: did not load as {reference} ({wanted[:19]})")
    return reference
