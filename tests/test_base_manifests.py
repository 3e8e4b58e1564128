"""A registry base's manifests in a bundle: the chain from the lock's repository digest to base.tar's image ID."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import docker
from standins import REGISTRY_TOKEN, serve_manifests
from verlbox.errors import UsageError
from verlbox.host.building.plan import BuildPlan
from verlbox.host.clients.registry import RegistryError
from verlbox.host.recipes.lock import Lock, LockedBase
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust.base_manifests import (
    REMAKE,
    Platform,
    check_base_manifests,
    engine_platform,
    fetch_base_manifests,
    file_name,
)
from verlbox.host.trust.bundle import MANIFEST, BundleBase, Manifest, check_base_archive, check_bundle

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
AMD64 = Platform(os="linux", architecture="amd64")
ARM64 = {"os": "linux", "architecture": "arm64", "variant": "v8"}
REPOSITORY = "registry.test/base"


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def config(architecture: str) -> bytes:
    return json.dumps(
        {"architecture": architecture, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    ).encode()


def image_manifest(config_digest: str, media_type: str = OCI_MANIFEST) -> bytes:
    config_type = "application/vnd.oci.image.config.v1+json"
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": config_type, "digest": config_digest, "size": 100},
            "layers": [],
            "annotations": {"org.opencontainers.image.created": "2025-01-01T00:00:00Z"},  # a registry's extra
        },
        indent=3,  # a registry's own spacing: the digest is of these bytes, never of a re-serialization
    ).encode()


def index(
    entries: list[tuple[bytes, dict[str, str]]], media_type: str = OCI_INDEX, manifest_type: str = OCI_MANIFEST
) -> bytes:
    manifests = [
        {"mediaType": manifest_type, "digest": sha256(data), "size": len(data), "platform": platform}
        for data, platform in entries
    ]
    return json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}).encode()


AMD64_CONFIG, ARM64_CONFIG = config("amd64"), config("arm64")
AMD64_MANIFEST, ARM64_MANIFEST = image_manifest(sha256(AMD64_CONFIG)), image_manifest(sha256(ARM64_CONFIG))
INDEX = index([(ARM64_MANIFEST, ARM64), (AMD64_MANIFEST, {"os": "linux", "architecture": "amd64"})])


def registry_base(top: bytes, image_id: str = sha256(AMD64_CONFIG)) -> LockedBase:
    """A lock's registry base: TOP is the object its repository digest names."""
    return LockedBase(reference=f"{REPOSITORY}:1", image_id=image_id, digest=f"{REPOSITORY}@{sha256(top)}")


def carry(bundle: Path, objects: list[bytes], base: LockedBase, platform: Platform | None = AMD64) -> Manifest:
    """A bundle holding OBJECTS under base-manifests/, each by its digest, listed in its manifest."""
    files = {file_name(sha256(data)): data for data in objects}
    for name, data in files.items():
        (bundle / name).parent.mkdir(parents=True, exist_ok=True)
        (bundle / name).write_bytes(data)
    manifest = Manifest(
        recipe="x",
        recipe_hash="0" * 64,
        lock_hash="0" * 64,
        base=BundleBase(reference=base.reference, image_id=base.image_id, platform=platform),
        files={name: sha256(data).removeprefix("sha256:") for name, data in files.items()},
    )
    (bundle / MANIFEST).write_text(manifest.model_dump_json())
    return manifest


def held(bundle: Path, manifest: Manifest, base: LockedBase) -> None:
    """The offline build's check of the chain, as check_manifest calls it."""
    check_base_manifests(bundle, manifest.files, base, manifest.base.platform)


def refusal(bundle: Path, manifest: Manifest, base: LockedBase) -> str:
    with pytest.raises(UsageError) as caught:
        held(bundle, manifest, base)
    message = str(caught.value)
    assert "\n" not in message and message.endswith(f"; {REMAKE}"), message
    return message


@pytest.mark.parametrize(("index_type", "manifest_type"), [(OCI_INDEX, OCI_MANIFEST), (DOCKER_LIST, DOCKER_MANIFEST)])
def test_the_chain_from_the_locks_digest_to_its_image_id_passes(
    tmp_path: Path, index_type: str, manifest_type: str
) -> None:
    amd64 = image_manifest(sha256(AMD64_CONFIG), manifest_type)
    top = index([(ARM64_MANIFEST, ARM64), (amd64, {"os": "linux", "architecture": "amd64"})], index_type, manifest_type)
    held(tmp_path, carry(tmp_path, [top, amd64], registry_base(top)), registry_base(top))
    # a digest that names one image's manifest: no index, no platform to choose
    single = tmp_path / "single"
    single.mkdir()
    held(single, carry(single, [amd64], registry_base(amd64), None), registry_base(amd64))
    # and the same chain beside a bootstrapped base is a file nothing holds
    bootstrapped = LockedBase(reference=f"{REPOSITORY}:1", image_id=sha256(AMD64_CONFIG), tree="0" * 64)
    message = refusal(tmp_path, carry(tmp_path, [top, amd64], bootstrapped), bootstrapped)
    assert "not a manifest of the lock's base" in message


def test_another_index_under_the_locks_digest_is_refused_by_its_hash(tmp_path: Path) -> None:
    base = registry_base(INDEX)
    manifest = carry(tmp_path, [INDEX, AMD64_MANIFEST], base)
    # the stranger's own index (their image for amd64) written where the lock's digest points
    theirs = index([(image_manifest(sha256(b"their config")), {"os": "linux", "architecture": "amd64"})])
    (tmp_path / file_name(sha256(INDEX))).write_bytes(theirs)
    message = refusal(tmp_path, manifest, base)
    assert f"{file_name(sha256(INDEX))}: its bytes are {sha256(theirs)}, not the registry's object" in message


def test_a_lock_naming_another_image_than_its_digest_is_refused(tmp_path: Path) -> None:
    """The stranger writes the lock too: the registry's digest, but their image ID (the one their base.tar is)."""
    base = registry_base(INDEX, image_id=sha256(b"their config"))
    message = refusal(tmp_path, carry(tmp_path, [INDEX, AMD64_MANIFEST], base), base)
    assert f"{file_name(sha256(AMD64_MANIFEST))}: names the image {sha256(AMD64_CONFIG)}" in message
    assert f"the lock's base is {sha256(b'their config')}" in message
    # and their own manifest, carried under its own name, is not what the registry's index names for amd64
    theirs = image_manifest(sha256(b"their config"))
    other = tmp_path / "other"
    other.mkdir()
    manifest = carry(other, [INDEX, theirs], base)
    assert f"{file_name(sha256(AMD64_MANIFEST))}: missing (the linux/amd64 manifest" in refusal(other, manifest, base)


def test_an_index_without_the_bases_platform_is_refused(tmp_path: Path) -> None:
    top = index([(ARM64_MANIFEST, ARM64)])
    base = registry_base(top)
    message = refusal(tmp_path, carry(tmp_path, [top, AMD64_MANIFEST], base), base)
    assert f"{file_name(sha256(top))}: lists no image manifest for linux/amd64, the base's platform" in message
    # an arm64 engine's base is that index's arm64 manifest: the platform decides which one is held
    arm = registry_base(top, image_id=sha256(ARM64_CONFIG))
    held(tmp_path, carry(tmp_path, [top, ARM64_MANIFEST], arm, Platform(**ARM64)), arm)


def test_a_missing_manifest_file_is_refused(tmp_path: Path) -> None:
    base = registry_base(INDEX)
    manifest = carry(tmp_path, [INDEX, AMD64_MANIFEST], base)
    (tmp_path / file_name(sha256(AMD64_MANIFEST))).unlink()
    assert f"{file_name(sha256(AMD64_MANIFEST))}: missing (the linux/amd64 manifest" in refusal(
        tmp_path, manifest, base
    )
    (tmp_path / file_name(sha256(INDEX))).unlink()
    message = refusal(tmp_path, manifest, base)
    assert f"{file_name(sha256(INDEX))}: missing (the registry's object for the lock's {base.digest})" in message


def test_a_media_type_that_is_neither_an_index_nor_a_manifest_is_refused(tmp_path: Path) -> None:
    schema1 = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v1+json"})
    for top, expected in (
        (schema1.encode(), "media type application/vnd.docker.distribution.manifest.v1+json, neither"),
        (b'{"schemaVersion": 2, "manifests": []}', "media type None, neither"),
        # two mediaType keys: Go's parser and Python's could read different ones
        (
            b'{"schemaVersion": 2, "mediaType": "%s", "mediaType": "%s", "config": {}}'
            % (OCI_INDEX.encode(), OCI_MANIFEST.encode()),
            "key mediaType twice",
        ),
    ):
        base = registry_base(top)
        assert expected in refusal(tmp_path, carry(tmp_path, [top], base), base)


def test_check_bundle_holds_a_registry_bases_chain_before_its_files(tmp_path: Path) -> None:
    """The offline build's first check (check_manifest) runs the chain: no manifests, no build."""
    plan = BuildPlan(load_recipe("p40-cu124"), base_override="verlbox-base/debian:bookworm-minbase", offline=True)
    assert plan.lock is not None
    base = registry_base(INDEX).model_copy(update={"reference": plan.lock.base.reference})
    plan.__dict__["lock"] = lock = plan.lock.model_copy(update={"base": base})  # its cached_property, replaced
    manifest = carry(tmp_path, [INDEX, AMD64_MANIFEST], base)
    made_for = {"recipe": plan.recipe.name, "recipe_hash": plan.recipe.content_hash, "lock_hash": lock.content_hash}
    manifest = manifest.model_copy(update=made_for)
    (tmp_path / MANIFEST).write_text(manifest.model_dump_json())
    assert check_bundle(plan, tmp_path).base.platform == AMD64
    (tmp_path / file_name(sha256(INDEX))).unlink()
    with pytest.raises(UsageError, match=r"base-manifests/sha256-[0-9a-f]{64}\.json: missing \(the registry's"):
        check_bundle(plan, tmp_path)


@pytest.mark.docker
def test_buildx_fetches_the_chain_from_a_registry_and_base_tar_is_held_to_it(
    docker_engine: object, tmp_path: Path
) -> None:
    """The real client against a registry that demands a Bearer token and the exact Accept type: the bytes it
    writes hash to the digests, and their chain ends at the image ID of a real `docker save` of the base."""
    tag = f"verlbox-test/registry-base:{secrets.token_hex(4)}"
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        entry = tarfile.TarInfo("hello")
        entry.size = 2
        tar.addfile(entry, io.BytesIO(b"hi"))
    subprocess.run(["docker", "image", "import", "-", tag], input=layer.getvalue(), check=True, capture_output=True)
    try:
        image_id = docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        platform = engine_platform(tag)
        amd64 = image_manifest(image_id, DOCKER_MANIFEST)  # the engine's image ID is its config's digest
        entry_platform = {"os": platform.os, "architecture": platform.architecture}
        top = index([(ARM64_MANIFEST, ARM64), (amd64, entry_platform)], DOCKER_LIST, DOCKER_MANIFEST)
        objects = {
            sha256(data): (kind, data)
            for data, kind in ((top, DOCKER_LIST), (amd64, DOCKER_MANIFEST), (ARM64_MANIFEST, OCI_MANIFEST))
        }
        seen: list[str] = []
        with serve_manifests(objects, seen) as registry:
            base = LockedBase(reference=tag, image_id=image_id, digest=f"{registry}/verlbox-test/base@{sha256(top)}")
            fetched = fetch_base_manifests(base, platform)
            assert fetched == {file_name(sha256(top)): top, file_name(sha256(amd64)): amd64}
            assert any(line.startswith("GET ") and line.endswith(f"Bearer {REGISTRY_TOKEN}") for line in seen)
            # a lock whose image ID is not the registry's image for its digest: said before anything is built
            with pytest.raises(UsageError, match=rf"@{sha256(amd64)}: names the image {image_id}, but the lock's"):
                fetch_base_manifests(base.model_copy(update={"image_id": sha256(b"their config")}), platform)
            # a digest the registry does not have, or answers with other bytes: one line, no bytes kept
            objects[sha256(b"asked for")] = (OCI_MANIFEST, image_manifest(image_id))
            # (buildx prints whatever bytes come: verlbox hashes them itself)
            for missing, said in ((sha256(b"not there"), ": not found)"), (sha256(b"asked for"), "answer hashes to")):
                elsewhere = base.model_copy(update={"digest": f"{registry}/verlbox-test/base@{missing}"})
                with pytest.raises(RegistryError) as caught:
                    fetch_base_manifests(elsewhere, platform)
                message = str(caught.value)
                assert message.startswith(f"{registry}/verlbox-test/base@{missing}: ") and said in message
        bundle = tmp_path / "bundle"
        bundle.mkdir()
        docker("image", "save", "--output", str(bundle / "base.tar"), tag)
        manifest = carry(bundle, list(fetched.values()), base, platform)
        lock = Lock(recipe="x", recipe_hash="0" * 64, base=base, steps=[])
        held(bundle, manifest, base)
        check_base_archive(bundle / "base.tar", manifest, lock)  # the same image ID, from the saved archive
    finally:
        docker("image", "rm", tag, check=False)
