"""The declarative verl patch set: load it, apply it to a verl tree, verify it there.

Applying and verifying share one code path, so the smoke check inside an image judges a patch
exactly the way the build that applied it did.
"""

from __future__ import annotations

import hashlib
import os
import py_compile
from dataclasses import dataclass
from enum import Enum
from functools import cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from verlbox.errors import VerlboxError


class Patch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    file: str
    why: str
    count: int = Field(ge=1)
    find: str
    replace: str


class PatchSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    verl_version: str
    patches: list[Patch]
    code_read_keys: dict[str, str]

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


class PatchState(Enum):
    APPLIED = "applied"
    PENDING = "pending"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class PatchStatus:
    patch: Patch
    state: PatchState
    detail: str


class PatchError(VerlboxError):
    pass


def available_versions() -> list[str]:
    folder = resources.files("verlbox.runtime.training.patches")
    return sorted(
        p.name.removeprefix("verl-").removesuffix(".yaml")
        for p in folder.iterdir()
        if p.name.startswith("verl-") and p.name.endswith(".yaml")
    )


@cache
def patch_set_for(verl_version: str) -> PatchSet:
    source = resources.files("verlbox.runtime.training.patches") / f"verl-{verl_version}.yaml"
    if not source.is_file():
        raise PatchError(
            f"verlbox has no patch set for verl {verl_version} "
            f"(it has: {', '.join(available_versions())}); nothing was changed"
        )
    return PatchSet.model_validate(yaml.safe_load(source.read_text()))


def detect_verl_version(site_dir: Path) -> str:
    version_file = site_dir / "verl" / "version" / "version"
    if not version_file.is_file():
        raise PatchError(f"{site_dir} holds no verl package (looked for {version_file})")
    return version_file.read_text().strip()


def _status(patch: Patch, text: str) -> PatchStatus:
    applied, pending = text.count(patch.replace), text.count(patch.find)
    if applied == patch.count:
        return PatchStatus(patch, PatchState.APPLIED, f"applied ({applied} of {patch.count} places)")
    if applied == 0 and pending == patch.count:
        return PatchStatus(patch, PatchState.PENDING, f"not applied ({pending} of {patch.count} places match)")
    return PatchStatus(
        patch,
        PatchState.MISMATCH,
        f"expected {patch.count} places in {patch.file}, found {pending} unpatched "
        f"and {applied} patched: this verl tree is not the one the patch was written for",
    )


def verify(site_dir: Path, patch_set: PatchSet) -> list[PatchStatus]:
    """The state of every patch, reading each file once; patches on one file are judged in order."""
    statuses = []
    for file, patches in _by_file(patch_set).items():
        text = _read(site_dir, file)
        for patch in patches:
            status = _status(patch, text)
            statuses.append(status)
            if status.state is PatchState.PENDING:
                text = text.replace(patch.find, patch.replace)
    return statuses


def apply(site_dir: Path) -> tuple[PatchSet, list[PatchStatus]]:
    """Apply the patch set for the verl found in site_dir: all files or none.

    Returns the statuses from before applying; a second run finds everything APPLIED and writes nothing.
    """
    patch_set = patch_set_for(detect_verl_version(site_dir))
    statuses = verify(site_dir, patch_set)
    broken = [s for s in statuses if s.state is PatchState.MISMATCH]
    if broken:
        raise PatchError("; ".join(f"patch {s.patch.id}: {s.detail}" for s in broken) + "; nothing was changed")
    new_texts: dict[str, str] = {}
    for status in statuses:
        if status.state is PatchState.PENDING:
            file = status.patch.file
            text = new_texts.get(file, _read(site_dir, file))
            new_texts[file] = text.replace(status.patch.find, status.patch.replace)
    _replace_all({site_dir / file: text for file, text in new_texts.items()})
    return patch_set, statuses


def _by_file(patch_set: PatchSet) -> dict[str, list[Patch]]:
    grouped: dict[str, list[Patch]] = {}
    for patch in patch_set.patches:
        grouped.setdefault(patch.file, []).append(patch)
    return grouped


def _read(site_dir: Path, file: str) -> str:
    path = site_dir / file
    if not path.is_file():
        raise PatchError(f"{path} is missing: the patch set expects it in verl's tree")
    return path.read_text()


def _replace_all(new_texts: dict[Path, str]) -> None:
    """Write every file or none: all new texts are staged beside their files first, then swapped in;
    if a swap fails, the files already swapped get their old text back."""
    for path, text in new_texts.items():
        # checked before anything is written: a patch that breaks the syntax changes no file
        try:
            compile(text, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise PatchError(
                f"{path} would not compile after patching (line {exc.lineno}: {exc.msg}); nothing was changed"
            ) from None
    originals = {path: path.read_text() for path in new_texts}
    staged: dict[Path, Path] = {}
    try:
        for path, text in new_texts.items():
            staged[path] = path.with_name(f".{path.name}.verlbox-patch")
            staged[path].write_text(text)
            os.chmod(staged[path], path.stat().st_mode & 0o7777)
        done: list[Path] = []
        try:
            for path, temporary in staged.items():
                os.replace(temporary, path)
                done.append(path)
        except OSError as exc:
            for path in done:
                path.write_text(originals[path])
            raise PatchError(f"could not write {path} ({exc.strerror or exc}); nothing was changed") from None
    finally:
        for temporary in staged.values():
            temporary.unlink(missing_ok=True)
    for path in new_texts:
        # a stale bytecode cache must not keep running the unpatched code, and images run with
        # PYTHONDONTWRITEBYTECODE: without fresh bytecode, every import would compile the file again
        for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            cached.unlink()
        try:
            py_compile.compile(str(path), doraise=True)
        except (py_compile.PyCompileError, OSError) as exc:
            raise PatchError(f"{path} is patched, but its bytecode could not be written: {exc}") from None
