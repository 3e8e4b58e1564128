"""A registry base's manifests in a bundle: what binds its base.tar to the lock's repository digest.

A lock names a registry base by its repository digest (REPO@sha256:...), which is the sha256 of the registry's
index (or single manifest); a saved image keeps only its config, whose digest is the image ID. The bundle
carries the chain between the two, each file named by the digest of its bytes:
  base-manifests/sha256-HEX.json   the object the lock's digest names: an index (manifest list) or a manifest
  base-manifests/sha256-HEX.json   for an index, the manifest of the base's platform (manifest.json's base.platform)
and an offline build holds it link by link before anything is loaded: the first file hashes to the lock's
digest, the index's entry for the platform names the second by its hash, and that manifest's config digest is
the lock's image ID, the one base.tar is held to (bundle.check_base_archive).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import UsageError
from verlbox.host.clients.engine import docker_output
from verlbox.host.clients.registry import RegistryError, raw_manifest
from verlbox.host.recipes.lock import LockedBase
from verlbox.host.recipes.schema import Digest, Strict, Text, fault_lines

FOLDER = "base-manifests"
MANIFEST = "manifest.json"  # the bundle's (bundle.MANIFEST), where base.platform is recorded
# an OCI index or a Docker manifest list; an OCI manifest or a Docker image manifest v2, schema 2
IndexType = Literal[
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"
]
ManifestType = Literal[
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"
]
INDEX_TYPES: tuple[str, ...] = get_args(IndexType)
MANIFEST_TYPES: tuple[str, ...] = get_args(ManifestType)
# registries refuse a manifest over 4 MiB; a bigger file is not one, and is not read whole
MAX_BYTES = 4 * 2**20
# a bundle whose base manifests do not lead to the lock's base
REMAKE = "ask whoever made the bundle to make it again with this verlbox, from the lock's base"


class Platform(Strict):
    """The base image's platform as the engine reports it (`docker image inspect`: Os, Architecture, Variant)."""

    os: Text
    architecture: Text
    variant: Text | None = None

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)

    def matches(self, other: Platform) -> bool:
        return _normalized(self) == _normalized(other)


def _normalized(platform: Platform) -> tuple[str, str, str | None]:
    # containerd's rule for the two spellings an index and an engine disagree on: arm64 is v8 unless it says
    # otherwise, and amd64's v1 is plain amd64
    variant = platform.variant
    if platform.architecture == "arm64" and variant in (None, "8"):
        variant = "v8"
    if platform.architecture == "amd64" and variant == "v1":
        variant = None
    return platform.os, platform.architecture, variant


class _Registry(BaseModel):
    """What a registry writes: only the fields the chain needs are read; others (annotations, subject) pass."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _IndexPlatform(Platform):
    model_config = ConfigDict(extra="allow", frozen=True)  # os.version, os.features


class _Descriptor(_Registry):
    mediaType: str
    digest: Digest
    platform: _IndexPlatform | None = None


class _Typed(_Registry):
    schemaVersion: Literal[2]
    mediaType: str | None = None


class _Index(_Registry):
    schemaVersion: Literal[2]
    mediaType: IndexType
    manifests: list[_Descriptor]


class _ImageManifest(_Registry):
    schemaVersion: Literal[2]
    mediaType: ManifestType
    config: _Descriptor


def file_name(digest: str) -> str:
    """Where a bundle keeps the object DIGEST (sha256:HEX) names."""
    return f"{FOLDER}/{digest.replace(':', '-')}.json"


def engine_platform(reference: str) -> Platform:
    inspected = json.loads(docker_output("image", "inspect", "--format", "{{json .}}", reference))
    variant = inspected.get("Variant") or None
    return Platform(os=inspected["Os"], architecture=inspected["Architecture"], variant=variant)


def fetch_base_manifests(base: LockedBase, platform: Platform) -> dict[str, bytes]:
    """The chain from the lock's digest (base.digest, REPO@sha256:HEX) to its image ID, from the registry, by
    file name: the object the digest names and, when that is an index, its manifest for PLATFORM, each as
    the registry's own bytes. Held as an offline build holds them, so a lock the registry does not bear out
    is said before the bundle is built, not after."""
    assert base.digest is not None
    repository = base.digest.partition("@")[0]
    fetched: dict[str, bytes] = {}

    def fetch(digest: str, what: str) -> bytes:
        data = raw_manifest(repository, digest)
        if (found := _sha256(data)) != digest:  # `--raw` prints whatever bytes the registry sent
            raise RegistryError(
                f"{repository}@{digest}: the registry's answer hashes to {found}, not its digest ({what})"
            )
        fetched[file_name(digest)] = data
        return data

    def named(name: str) -> str:  # a chain file by the registry's name for it
        return f"{repository}@{name.removeprefix(f'{FOLDER}/').removesuffix('.json').replace('-', ':', 1)}"

    _held_chain(fetch, base, platform, _Where(named, "run `verlbox lock` again on the registry's base"))
    return fetched


def check_base_manifests(
    bundle: Path, files: Mapping[str, str], base: LockedBase, platform: Platform | None, shown: Path | None = None
) -> None:
    """A registry base's chain in the bundle (FILES: its manifest's list; PLATFORM: the base's, which it records)
    leads from the lock's digest to the lock's image ID, and base-manifests/ holds nothing else (a bootstrapped
    base has no chain: its files are held to base.tree). SHOWN names the bundle in errors (`verlbox bundle`
    checks its folder before renaming it into place)."""
    where = _Where(lambda name: f"{shown or bundle}/{name}", REMAKE)

    def carried(digest: str, what: str) -> bytes:
        return _carried(bundle / file_name(digest), digest, files, what, where)

    chain = [] if base.digest is None else _held_chain(carried, base, platform, where)
    if extra := sorted(name for name in files if name.startswith(f"{FOLDER}/") and name not in chain):
        raise where.refuse(extra[0], f"not a manifest of the lock's base ({FOLDER}/ holds only that chain)")


@dataclass(frozen=True)
class _Where:
    """How an error names a chain file (in a bundle, or at the registry), and what the reader should do."""

    name: Callable[[str], str]
    remedy: str

    def refuse(self, file: str, problem: str) -> UsageError:
        return UsageError(f"{self.name(file)}: {problem}; {self.remedy}")


def _held_chain(
    read: Callable[[str, str], bytes], base: LockedBase, platform: Platform | None, where: _Where
) -> list[str]:
    """The chain's file names, each link held: the lock's digest -> (index -> the platform's manifest) ->
    config, which is the lock's image ID. READ(digest, what it is) gives bytes that hash to the digest."""
    assert base.digest is not None
    digest = base.digest.partition("@")[2]
    chain = [file_name(digest)]
    data = read(digest, f"the registry's object for the lock's {base.digest}")
    if _is_index(data, chain[0], where):
        if platform is None:
            raise where.refuse(MANIFEST, f"base.platform: none, so no manifest of {chain[0]} is the base's")
        entry = _platform_entry(_parse(data, _Index, chain[0], where), platform)
        if entry is None:
            raise where.refuse(chain[0], f"lists no image manifest for {platform}, the base's platform")
        chain.append(file_name(entry.digest))
        data = read(entry.digest, f"the {platform} manifest {chain[0]} names")
    config = _parse(data, _ImageManifest, chain[-1], where).config.digest
    if config != base.image_id:
        raise where.refuse(
            chain[-1],
            f"names the image {config}, but the lock's base is {base.image_id}: not the image of {base.digest}",
        )
    return chain


def _platform_entry(index: _Index, platform: Platform) -> _Descriptor | None:
    """The index's first image manifest for PLATFORM, as Docker picks one when it pulls."""
    return next(
        (
            entry
            for entry in index.manifests
            if entry.mediaType in MANIFEST_TYPES and entry.platform is not None and entry.platform.matches(platform)
        ),
        None,
    )


def _carried(path: Path, digest: str, files: Mapping[str, str], what: str, where: _Where) -> bytes:
    """The bundle's file for DIGEST, whose bytes hash to it."""
    name = file_name(digest)
    if name not in files or not path.exists():
        raise where.refuse(name, f"missing ({what})")
    data = _regular_file_bytes(path, name, where)
    if (found := _sha256(data)) != digest:
        raise where.refuse(name, f"its bytes are {found}, not {what}")
    return data


def _regular_file_bytes(path: Path, name: str, where: _Where) -> bytes:
    # read before check_files looks at the bundle: a link or a pipe here is refused, never followed or waited on
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise where.refuse(name, f"not readable ({exc.strerror}); a bundle holds only regular files") from None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise where.refuse(name, "not a regular file; a bundle holds only regular files")
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise where.refuse(name, f"over {MAX_BYTES // 2**20} MiB, not a registry manifest")
    return data


def _is_index(data: bytes, name: str, where: _Where) -> bool:
    media_type = _parse(data, _Typed, name, where).mediaType
    if media_type not in INDEX_TYPES + MANIFEST_TYPES:
        raise where.refuse(
            name,
            f"media type {media_type}, neither an image index (OCI, Docker manifest list) nor an image manifest "
            "(OCI, Docker v2 schema 2)",
        )
    return media_type in INDEX_TYPES


_Model = TypeVar("_Model", bound=BaseModel)


def _parse(data: bytes, model: type[_Model], name: str, where: _Where) -> _Model:
    try:
        document = json.loads(data, object_pairs_hook=_unique_keys)
        return model.model_validate(document, strict=True)
    except ValidationError as exc:  # before ValueError, which it is
        raise where.refuse(name, fault_lines(exc)[0]) from None
    except ValueError as exc:  # not JSON, or a key twice (parsers disagree on which one counts)
        raise where.refuse(name, f"not a registry's JSON ({exc})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        raise ValueError(f"key {twice[0]} twice")
    return dict(pairs)


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"
