"""Bundles: everything a locked recipe's build needs, in one folder, so that it builds without a network.

`verlbox bundle RECIPE --out DIR` writes:
  base.tar         the base image (`docker save`): the one the lock was made on, kept after its tag is gone
  wheels/          every Python file the lock names, fetched by its sha256
  debs/STEP/       the Debian packages of each of the image's apt steps, at the locked versions
  debian/dists/    Debian's signed indexes they were fetched against (InRelease, Packages), as apt kept them;
                   an offline build makes a `file:` repository of them that apt checks each .deb against
  apex/            compiled parts (Apex's wheel and its source record), built once, taken by hash
  sources/         the source archives the recipe pins (Apex's)
  base-manifests/  a registry base's index and manifest, the registry's bytes: what holds base.tar to the
                   lock's repository digest (base_manifests.py)
  manifest.json    the recipe and lock it was made for, the base's image ID, and every file's sha256
`verlbox build RECIPE --offline DIR` checks all of it against the manifest before the build starts.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import IO, Annotated, Literal
from urllib.parse import unquote

from pydantic import AfterValidator, ValidationError
from rich.console import Console

from verlbox.errors import UsageError
from verlbox.files import write_atomically
from verlbox.host.building.archives import check_archive
from verlbox.host.building.build import run_buildx
from verlbox.host.building.context import OfflineRepository
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.sources import BuildSources
from verlbox.host.clients.engine import docker_output, require_cli
from verlbox.host.clients.reference import full_name
from verlbox.host.recipes.basetree import (
    canonical_engine_base,
    load_canonical_base,
    member,
    refuse_other_tree,
    saved_layer,
    tree_digest,
)
from verlbox.host.recipes.lock import Lock, LockStep
from verlbox.host.recipes.schema import Digest, ImageReference, Sha256, Slug, Strict, fault_lines
from verlbox.host.trust.base_manifests import REMAKE as _REMAKE  # a bundle's base.tar not the lock's base
from verlbox.host.trust.base_manifests import Platform, check_base_manifests, engine_platform, fetch_base_manifests
from verlbox.runtime.steps.apex_build import SOURCE_RECORD, _version_tuple, file_sha256  # its own version rule
from verlbox.runtime.steps.build_steps import DEBIAN_KEYRING

BUNDLE_FORMAT = 1
# apex/ beside its wheel: the build stage's records (build-record/STEP.KIND.json) and Apex's source record
RECORD_FOLDER = "build-record"
SOURCE_RECORD_KEYS = {"commit", "archive_sha256", "nvcc", "arch_list", "build_patches"}
NVCC_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
MANIFEST = "manifest.json"
BASE_ARCHIVE = "base.tar"


_PATH_PART = re.compile(r"[A-Za-z0-9_+%~-][A-Za-z0-9._+%~-]*")


def _bundle_path(value: str) -> str:
    if not all(_PATH_PART.fullmatch(part) for part in value.split("/")):
        raise ValueError(f"expected a relative path such as wheels/x.whl (no '..', no leading '/'), got {value!r}")
    return value


# a path inside the bundle: names of letters, digits and ._+%~- not starting with a dot, never absolute
BundlePath = Annotated[str, AfterValidator(_bundle_path)]


class BundleBase(Strict):
    reference: ImageReference
    image_id: Digest
    platform: Platform | None = None  # a registry base's: which manifest of its index is the base's


class Manifest(Strict):
    """An index of the bundle, never a source of trust: every value is checked against the lock."""

    format: Literal[1] = BUNDLE_FORMAT
    recipe: Slug
    recipe_hash: Sha256
    lock_hash: Sha256
    base: BundleBase
    files: dict[BundlePath, Sha256]  # path inside the bundle -> sha256


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
    if out.is_symlink():  # the bundle is renamed into place: a link would be replaced, or followed elsewhere
        raise UsageError(f"--out {out}: is a symbolic link; give a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder; give a new one")
    base_id = _image_id(plan.base_image)
    if base_id is None:
        raise UsageError(f"base image {plan.base_image} is not on this engine: build the recipe first")
    # an offline build would refuse another base; canonical, its config is verlbox's own
    canonical_engine_base(plan.base_image, lock.base.tree, plan.recipe.lock_path)
    sources = sources.with_torch_index(plan.recipe.name, plan.torch_index)
    platform: Platform | None = None
    base_manifests: dict[str, bytes] = {}
    if lock.base.digest is not None:  # the registry's chain from the lock's digest to its image ID, held first
        if base_id != lock.base.image_id:  # a moved tag: the offline build would refuse this base.tar
            raise UsageError(
                f"base image {plan.base_image} on this engine is {base_id}, not the lock's {lock.base.image_id} "
                f"({plan.recipe.lock_path}): pull {lock.base.digest} and tag it {plan.base_image}"
            )
        platform = engine_platform(plan.base_image)
        with console.status(f"fetching {lock.base.digest}'s manifests from its registry"):
            base_manifests = fetch_base_manifests(lock.base, platform)
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
        if lock.base.tree is not None:  # the bytes shipped, not the engine's image a moment before
            with tarfile.open(partial / BASE_ARCHIVE) as saved:
                _check_tree(saved, out / BASE_ARCHIVE, lock.base.tree)
        for name, data in base_manifests.items():
            (partial / name).parent.mkdir(exist_ok=True)
            (partial / name).write_bytes(data)
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
            base=BundleBase(reference=plan.base_image, image_id=base_id, platform=platform),
            files=files,
        )
        # a registry base: the registry's chain from the lock's digest ends at the lock's image ID
        check_base_manifests(partial, manifest.files, lock.base, platform, shown=out)
        # a wheel that is not the lock's compile: no bundle, and why
        check_compiled(plan, partial, manifest, lock, shown_as=out)
        # and what the offline build will hold its .debs to is here, whole: said now, not years later
        check_debs_indexed(partial, manifest, index_entries(partial, manifest))
        write_atomically(partial / MANIFEST, manifest.model_dump_json(indent=1) + "\n")
        if out.exists():
            out.rmdir()
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return manifest


def bundle_folder(given: str) -> Path:
    """The bundle's folder, resolved once: what is checked is what BuildKit reads. A symlink is refused: it
    could be pointed elsewhere between the check and the build."""
    path = Path(given)
    if path.is_symlink():
        raise UsageError(f"--offline {given}: is a symbolic link; give the bundle's own folder")
    return path.resolve()  # one that is not there has no manifest, which `read_manifest` says


def read_manifest(bundle: Path) -> Manifest:
    path = bundle / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--offline {bundle}: no {MANIFEST}; make a bundle with `verlbox bundle`") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a verlbox bundle manifest ({' '.join(str(exc).split())[:300]})") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise UsageError("\n".join(f"{path}: {line}" for line in fault_lines(exc))) from None


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
    """The manifest was made for the plan's recipe and lock: a bundle for another one is bad input. A registry
    base's manifests in the bundle lead from the lock's digest to its image ID, before anything is loaded."""
    path = bundle / MANIFEST
    lock = plan.lock
    assert lock is not None  # an offline plan has a lock
    expected_base = [("base.reference", manifest.base.reference, lock.base.reference)]
    if lock.base.digest:  # a registry base is one image; a bootstrapped one is checked by its packages on load
        expected_base.append(("base.image_id", manifest.base.image_id, lock.base.image_id))
    for key, found, expected in (
        ("recipe", manifest.recipe, plan.recipe.name),
        ("recipe_hash", manifest.recipe_hash, plan.recipe.content_hash),
        ("lock_hash", manifest.lock_hash, lock.content_hash),
        *expected_base,
    ):
        if found != expected:
            raise UsageError(
                f"{path}: {key} is {found}, but recipe {plan.recipe.name} and its lock need {expected}: "
                "this bundle was made for another recipe or lock"
            )
    check_base_manifests(bundle, manifest.files, lock.base, manifest.base.platform)


def check_files(bundle: Path, manifest: Manifest) -> None:
    """Every file the manifest lists, present with its hash, and no other.

    A file the manifest does not list is refused too: an offline apt step installs every .deb of its folder.
    """
    path = bundle / MANIFEST
    present = set(regular_files(bundle)) - {MANIFEST}
    listed = set(manifest.files)
    for names, problem in ((listed - present, "listed in it are missing"), (present - listed, "are not listed in it")):
        if names:
            raise UsageError(f"{path}: {len(names)} file(s) {problem}, e.g. {sorted(names)[0]}")
    for name, digest in _hashes(bundle, [bundle / name for name in sorted(manifest.files)]).items():
        if digest != manifest.files[name]:
            raise UsageError(f"{bundle / name}: sha256 {digest}, but {MANIFEST} says {manifest.files[name]}")


def regular_files(bundle: Path) -> list[str]:
    """Every file under BUNDLE as a relative path; a symlink or anything but a regular file or folder is
    refused (a link would have the check hash one file and the build read another)."""
    found = []
    for folder, folders, files in os.walk(bundle):  # never follows links
        for name in folders + files:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise UsageError(f"{path}: {kind}; a bundle holds only regular files and folders")
            if stat.S_ISREG(mode):
                found.append(path.relative_to(bundle).as_posix())
    return found


def check_debs(bundle: Path, manifest: Manifest, lock: Lock) -> None:
    """Each step's .debs are exactly the lock's `name=version` for that step (an offline apt step installs
    its whole folder): an extra, swapped or missing package is refused by name."""
    found: dict[str, set[str]] = {}
    for name in manifest.files:
        parts = PurePosixPath(name).parts
        if parts[0] != "debs":
            continue
        package, version, _ = deb_identity(parts[-1])  # apt-get download writes an epoch's ':' as %3a
        if len(parts) != 3 or not parts[-1].endswith(".deb") or not version:
            raise UsageError(f"{bundle / name}: not a STEP/NAME_VERSION_ARCH.deb the bundle makes")
        found.setdefault(parts[1], set()).add(f"{package}={version}")
    for step in lock.steps:
        locked = {f"{entry.name}={entry.version}" for entry in step.apt} if step.stage == "final" else set()
        have = found.pop(step.name, set())
        if extra := sorted(have - locked):
            raise UsageError(f"{bundle}/debs/{step.name}: {_some(extra)} not in the lock's step {step.name}")
        if missing := sorted(locked - have):
            raise UsageError(f"{bundle}/debs/{step.name}: no .deb for {_some(missing)} (the lock's)")
    if found:
        raise UsageError(f"{bundle}/debs/{sorted(found)[0]}: a folder for a step the lock has no packages for")


def deb_identity(file_name: str) -> tuple[str, str, str]:
    """(name, version, architecture) of a .deb as `apt-get download` names it: NAME_VERSION_ARCH.deb."""
    name, _, rest = file_name.removesuffix(".deb").partition("_")
    version, _, arch = rest.rpartition("_")
    return name, unquote(version), arch


IndexEntries = dict[tuple[str, str, str], dict[str, str]]


def index_entries(bundle: Path, manifest: Manifest) -> IndexEntries:
    """Every package the bundle's copy of Debian's Packages indexes lists (by name, version, architecture),
    with its fields there. Read once per check: the indexes are several MB."""
    listed: IndexEntries = {}
    for name in manifest.files:
        if not (name.startswith("debian/dists/") and name.endswith("/Packages")):
            continue
        for stanza in (bundle / name).read_text(encoding="utf-8", errors="replace").split("\n\n"):
            fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
            key = (fields.get("Package", ""), fields.get("Version", ""), fields.get("Architecture", ""))
            if all(key):
                listed[key] = {field: value.strip() for field, value in fields.items()}
    return listed


# an archive's suite and component names, and a Packages entry's Filename: written into apt's sources and
# used as a path inside the offline repository, so plain names and a path under pool/ only
_ARCHIVE_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]*")
_POOL_PATH = re.compile(r"pool/(?:[A-Za-z0-9+~_-][A-Za-z0-9.+~_-]*/)+[A-Za-z0-9+~_%-][A-Za-z0-9.+~_%-]*\.deb")


def offline_repository(
    bundle: Path, manifest: Manifest, entries: IndexEntries, root: str = "/tmp/verlbox-repo"
) -> OfflineRepository:
    """ENTRIES: the bundle's index_entries."""
    components: dict[str, set[str]] = {}
    for name in manifest.files:
        parts = name.split("/")
        if name.startswith("debian/dists/") and len(parts) == 6 and parts[-1] == "Packages":
            suite, component = parts[2], parts[3]
            for value in (suite, component):
                if not _ARCHIVE_NAME.fullmatch(value):
                    raise UsageError(f"{bundle / name}: {value!r} is not a suite or component name")
            components.setdefault(suite, set()).add(component)
    sources = "".join(
        f"deb [signed-by={DEBIAN_KEYRING}] file:{root} {suite} {' '.join(sorted(names))}\n"
        for suite, names in sorted(components.items())
    )
    pools: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(manifest.files):
        if not name.startswith("debs/"):
            continue
        _, step, file_name = name.split("/")
        pool_path = entries.get(deb_identity(file_name), {}).get("Filename", "")
        if not _POOL_PATH.fullmatch(pool_path):
            raise UsageError(f"{bundle / name}: its signed index gives no usable place in the archive ({pool_path!r})")
        pools.setdefault(step, []).append((file_name, pool_path))
    return OfflineRepository(sources, pools)


def check_debs_indexed(bundle: Path, manifest: Manifest, entries: IndexEntries) -> None:
    """Each .deb's sha256 is the one the bundle's copy of Debian's signed Packages index lists for it
    (ENTRIES: its index_entries). Said here in one line before any step runs; the authority is apt inside
    the offline build, which checks that index against InRelease and InRelease against the base's keyring."""
    debs = [name for name in manifest.files if name.startswith("debs/")]
    if not debs:
        return
    signed = [n for n in manifest.files if n.startswith("debian/dists/") and n.endswith(("/InRelease", "/Release.gpg"))]
    packages = [n for n in manifest.files if n.startswith("debian/dists/") and n.endswith("/Packages")]
    if missing := [n for n in packages if f"{n}.xz" not in manifest.files]:
        raise UsageError(f"{bundle}/{missing[0]}.xz: missing (the offline build's apt asks for it first)")
    listed = {key: fields["SHA256"] for key, fields in entries.items() if "SHA256" in fields} if signed else {}
    if not listed:
        raise UsageError(
            f"{bundle}: no copy of Debian's signed indexes (debian/dists/*/InRelease and Packages) to check "
            "its .debs against: a bundle made before verlbox carried them; run `verlbox bundle` again"
        )
    for name in sorted(debs):
        identity = deb_identity(PurePosixPath(name).name)
        expected = listed.get(identity)
        if expected is None:
            raise UsageError(f"{bundle / name}: {identity[0]}={identity[1]} is in none of the bundle's signed indexes")
        if manifest.files[name] != expected:
            raise UsageError(
                f"{bundle / name}: sha256 {manifest.files[name]}, but Debian's signed index lists {expected}"
            )


def check_wheels(bundle: Path, manifest: Manifest, lock: Lock) -> None:
    """wheels/ holds only files the lock names, each with the lock's sha256 (the manifest is the bundle's
    own word): an offline pip or uv finds links in that folder, so any other file there (a build backend an
    sdist would pick up) is code that no lock pinned."""
    pinned = {entry.file: entry.sha256 for step in lock.steps for entry in step.pip}
    for name, digest in sorted(manifest.files.items()):
        parts = PurePosixPath(name).parts
        if parts[0] != "wheels":
            continue
        if len(parts) != 2 or parts[1] not in pinned:
            raise UsageError(f"{bundle / name}: not a file the lock names; a bundle's wheels/ holds the lock's only")
        if digest != pinned[parts[1]]:
            raise UsageError(f"{bundle / name}: sha256 {digest}, but the lock pins {pinned[parts[1]]}")


def check_compiled(plan: BuildPlan, bundle: Path, manifest: Manifest, lock: Lock, shown_as: Path | None = None) -> None:
    """Each builder stage's wheels in the bundle (Apex's) are exactly the ones the lock pins, by file name
    and sha256: the offline build installs every wheel of that folder, and a wheel is code. SHOWN_AS names
    the bundle in errors (`verlbox bundle` checks its folder before renaming it into place)."""
    shown = shown_as or bundle
    for block in plan.builder_blocks:
        pinned = {entry.file: entry.sha256 for entry in lock.compiled.get(block.name, [])}
        if not pinned:
            raise UsageError(
                f"{plan.recipe.lock_path}: compiled: no {block.name} wheel pinned (a lock made before verlbox "
                f"pinned it): run `verlbox lock` again on the image the bundle was made from"
            )
        carried = {
            path.removeprefix(f"{block.name}/"): digest
            for path, digest in manifest.files.items()
            if path.startswith(f"{block.name}/") and path.endswith(".whl")
        }
        for name, digest in sorted(carried.items()):
            if pinned.get(name) != digest:
                raise UsageError(
                    f"{shown}/{block.name}/{name}: sha256 {digest} is not a {block.name} wheel the lock pins "
                    f"({_some([f'{file} {sha[:12]}' for file, sha in sorted(pinned.items())])}): "
                    "another source, plan or toolchain, a compile that did not repeat, or a swapped file"
                )
        if missing := sorted(set(pinned) - set(carried)):
            raise UsageError(f"{shown}/{block.name}: no {_some(missing)} (the lock's)")
    if plan.apex:
        check_apex_records(plan, bundle, manifest, lock, shown)


def check_apex_records(plan: BuildPlan, bundle: Path, manifest: Manifest, lock: Lock, shown: Path) -> None:
    """What the offline build copies from apex/ into the image beside the wheel, held to the recipe and lock:
    the source record (the commit smoke and verify report) to the recipe's Apex pin and build plan, and each
    build-stage record (which a later `verlbox lock` of the image turns into pins) to the lock's step. Any
    other file there is refused: nothing of a bundle reaches an image unchecked."""
    folder = "apex"
    for name in sorted(path for path in manifest.files if path.startswith(f"{folder}/")):
        inside = name.removeprefix(f"{folder}/")
        if inside.endswith(".whl") and "/" not in inside:
            continue  # check_compiled held it to the lock
        if inside == SOURCE_RECORD:
            _check_source_record(plan, bundle, manifest, shown)
        elif inside.startswith(f"{RECORD_FOLDER}/") and inside.count("/") == 1:
            _check_step_record(bundle / name, lock, shown / name)
        else:
            raise UsageError(f"{shown}/{name}: not a file a bundle's {folder}/ holds (its wheel and records only)")
    if f"{folder}/{SOURCE_RECORD}" not in manifest.files:
        raise UsageError(f"{shown}/{folder}: no {SOURCE_RECORD} (Apex's source record)")
    # the offline build copies the Apex stage's step records into the image: each the lock has is there
    needed = [
        f"{folder}/{RECORD_FOLDER}/{step.name}.{kind}.json"
        for step in lock.steps
        if step.stage == "builder"
        for kind in ("pip", "apt")
        if getattr(step, kind)
    ]
    if missing := [name for name in needed if name not in manifest.files]:
        raise UsageError(f"{shown}/{missing[0]}: missing (the lock's record of that Apex build step)")


def _read_json(path: Path, shown: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{shown}: not readable JSON ({exc})") from None


def _check_source_record(plan: BuildPlan, bundle: Path, manifest: Manifest, shown: Path) -> None:
    apex = plan.apex
    assert apex is not None
    path = f"apex/{SOURCE_RECORD}"
    record = _read_json(bundle / path, shown / path)
    expected = apex.build_plan(plan.recipe.target_gpus)
    archives = {apex.archive_sha256}
    carried = f"sources/{apex.archive_name}"
    if carried in manifest.files:  # the archive the bundle carries, where the recipe's tar stream accepts it
        archives.add(check_archive(bundle / carried, apex.archive_pin()).sha256)  # refused: one line
    faults = []
    if not isinstance(record, dict) or set(record) != SOURCE_RECORD_KEYS:
        faults.append(f"keys {sorted(record) if isinstance(record, dict) else type(record).__name__}, not "
                      f"{sorted(SOURCE_RECORD_KEYS)}")  # fmt: skip
    elif not isinstance(record["nvcc"], str) or not NVCC_VERSION.fullmatch(record["nvcc"]):
        faults.append(f"nvcc {record['nvcc']!r} is not a CUDA version")
    else:
        for key in ("commit", "arch_list"):
            if record[key] != expected[key]:
                faults.append(f"{key} {record[key]!r}, the recipe's is {expected[key]!r}")
        if not isinstance(record["archive_sha256"], str) or record["archive_sha256"] not in archives:
            faults.append(f"archive_sha256 {record['archive_sha256']!r} is not the recipe's Apex archive")
        # exactly the patches the compile applies for that nvcc (apex_build.apply_build_patches' rule)
        applies = [
            patch["id"]
            for patch in expected["build_patches"]
            if _version_tuple(record["nvcc"]) >= _version_tuple(patch.get("min_cuda", "0"))
        ]
        if record["build_patches"] != applies:
            faults.append(
                f"build_patches {record['build_patches']!r}, the recipe's for nvcc {record['nvcc']} are {applies}"
            )
    if faults:
        raise UsageError(f"{shown / path}: {faults[0]}: not the record of the recipe's Apex compile")


def _check_step_record(path: Path, lock: Lock, shown: Path) -> None:
    """apex/build-record/STEP.KIND.json: exactly the lock's entries of that step and kind."""
    step_name, _, kind = path.name.removesuffix(".json").rpartition(".")
    step = lock.step(step_name)
    if not path.name.endswith(".json") or kind not in ("pip", "apt") or step is None:
        raise UsageError(f"{shown}: not a record of a step the lock has (STEP.pip.json or STEP.apt.json)")
    entries = _read_json(path, shown)
    try:
        recorded = getattr(LockStep(name=step.name, stage=step.stage, **{kind: entries}), kind)
    except (ValidationError, TypeError):
        raise UsageError(f"{shown}: not a build record's entries") from None
    if recorded != getattr(step, kind):
        raise UsageError(f"{shown}: differs from the lock's step {step.name} ({kind}); a record is not a pin")


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_base_archive(archive: Path, manifest: Manifest, lock: Lock) -> None:
    """base.tar read before `docker load`: one image, the manifest's image ID, no name but the base's own
    (a crafted archive could retag images already on the engine), and for a bootstrapped base the lock's
    exact package list and, where the lock pins it, its files (basetree.py)."""
    reference, wanted = manifest.base.reference, manifest.base.image_id
    try:
        with tarfile.open(archive) as tar:
            images = json.load(member(tar, "manifest.json"))
            names = [tag for image in images for tag in image.get("RepoTags") or []]
            if (index := _optional_member(tar, "index.json")) is not None:
                for entry in json.load(index).get("manifests", []):
                    annotations = entry.get("annotations") or {}
                    names += [v for k, v in annotations.items() if k == "io.containerd.image.name"]
            if len(images) != 1:
                raise UsageError(f"{archive}: holds {len(images)} images; a bundle's base is one")
            config = images[0]["Config"]
            if f"sha256:{PurePosixPath(config).name.removesuffix('.json')}" != wanted:
                raise UsageError(f"{archive}: its image is {config}, not the bundle's base {wanted}")
            if foreign := sorted({n for n in names if full_name(n) != full_name(reference)}):
                raise UsageError(f"{archive}: would tag {', '.join(foreign)}; only {reference} is the base's name")
            if lock.base.packages is not None:
                have = _dpkg_packages(tar, images[0]["Layers"])
                if diff := sorted(set(lock.base.packages) ^ have):
                    raise UsageError(f"{archive}: its packages differ from the lock's base, e.g. {diff[0]}")
            if lock.base.tree is not None:
                _check_tree(tar, archive, lock.base.tree)
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{archive}: not a `docker save` archive ({exc})") from None


def _check_tree(saved: tarfile.TarFile, archive: Path, locked: str) -> None:
    try:
        with saved_layer(saved, str(archive)) as layer:
            tree = tree_digest(layer, str(archive))
    except ValueError as exc:  # what the canonical form cannot say, named
        raise UsageError(f"{exc}; {_REMAKE}") from None
    refuse_other_tree(str(archive), tree, locked, _REMAKE)


def _optional_member(tar: tarfile.TarFile, name: str) -> IO[bytes] | None:
    try:
        return member(tar, name)
    except KeyError:
        return None


def _dpkg_packages(tar: tarfile.TarFile, layers: list[str]) -> set[str]:
    """NAME=VERSION of the installed packages in the last layer that holds dpkg's status file."""
    status = None
    for layer in layers:
        with tarfile.open(fileobj=member(tar, layer)) as inner:
            # `docker import` keeps the archive's own names: `tar -C root -cf - .` writes ./var/lib/...
            for entry in inner.getmembers():
                if entry.isfile() and entry.name.removeprefix("./") == "var/lib/dpkg/status":
                    status = member(inner, entry.name).read().decode()
    if status is None:
        raise ValueError("no var/lib/dpkg/status in its layers")
    packages = set()
    for record in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in record.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed"):
            packages.add(f"{fields['Package']}={fields['Version']}")
    return packages


def load_base(bundle: Path, manifest: Manifest, lock: Lock, console: Console, lock_path: Path | None = None) -> str:
    """The bundle's base on this engine under its reference: loaded from base.tar when it is not there yet.
    A bootstrapped base is held to the lock's files (base.tree), on the engine or in base.tar, and only
    verlbox's own canonical rewrite of base.tar's layer is loaded: Docker never reads the bundle's bytes."""
    reference, wanted = manifest.base.reference, manifest.base.image_id
    archive = bundle / BASE_ARCHIVE
    current = _image_id(reference)
    if lock.base.tree is not None:
        if current is not None:
            with console.status(f"checking base image {reference} against the lock"):
                canonical_engine_base(reference, lock.base.tree, lock_path)
            return reference
        check_base_archive(archive, manifest, lock)
        try:
            with (
                console.status(f"loading base image {reference} from {archive}"),
                tarfile.open(archive) as saved,
                saved_layer(saved, str(archive)) as layer,
            ):
                load_canonical_base(layer, str(archive), reference, lock.base.tree, _REMAKE)
        except (ValueError, KeyError, tarfile.TarError) as exc:  # it changed since check_base_archive read it
            raise UsageError(f"{archive}: {exc}; {_REMAKE}") from None
        return reference
    if current == wanted:
        return reference
    if current is not None:
        raise UsageError(
            f"{reference} on this engine is {current[:19]}, not the bundle's base {wanted[:19]}: "
            f"remove or retag it, and the build loads the bundle's {BASE_ARCHIVE}"
        )
    check_base_archive(archive, manifest, lock)
    with console.status(f"loading base image {reference} from {archive}"):
        docker_output("image", "load", "--quiet", "--input", str(archive))
    if _image_id(reference) != wanted:
        raise UsageError(f"{archive}: did not load as {reference} ({wanted[:19]})")
    return reference
