"""Integration: bundle p40-cu124, build it twice from the bundle with no network and no cache, compare.

The bundle's Apex wheel is the one the `image` fixture's build compiled: it is compiled once per run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

import phases
import tiny_images
from conftest import REPO, build_cache_ids, ca_arguments, docker, prune_build_cache_since, run_verlbox
from verlbox import __version__
from verlbox.host.building.context import image_source_digest
from verlbox.host.recipes.lock import read_lock
from verlbox.runtime.steps.apex_build import file_sha256

pytestmark = [pytest.mark.docker, pytest.mark.slow]

OFFLINE_TAG = "verlbox-test/p40-cu124:offline"
FIRST_TAG = "verlbox-test/p40-cu124:offline-first"
# every regular file of an image with its sha256, to name what differs when two builds do
# (without the files `docker run` itself mounts over the image's)
FILE_HASHES = (
    "find / -xdev -type f ! -path /etc/hosts ! -path /etc/hostname ! -path /etc/resolv.conf -print0"
    " | sort -z | xargs -0 sha256sum"
)


@dataclass
class OfflineBuild:
    image_id: str
    layers: list[str]


def _inspect(tag: str) -> OfflineBuild:
    (inspected,) = json.loads(docker("image", "inspect", tag).stdout)
    return OfflineBuild(inspected["Id"], inspected["RootFS"]["Layers"])


def _image_id(tag: str) -> str:
    """TAG's image ID, or "" where no image has that tag."""
    return docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).stdout.strip()


def _file_hashes(tag: str) -> set[str]:
    return set(docker("run", "--rm", "--entrypoint", "bash", tag, "-c", FILE_HASHES).stdout.splitlines())


@pytest.fixture(scope="module")
def bundle(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("bundle") / "p40-cu124"
    result = run_verlbox("bundle", "p40-cu124", "--out", str(out), *ca_arguments(), timeout=2400)
    assert result.returncode == 0, result.stderr[-5000:]
    yield out
    shutil.rmtree(out)  # 3.3 GiB, and pytest keeps its last three runs' temporary folders


@pytest.fixture(scope="module")
def offline_builds(bundle: Path, docker_engine: Any) -> Iterator[tuple[OfflineBuild, OfflineBuild]]:
    """Two `--no-cache` builds from the bundle; the second is tagged OFFLINE_TAG, the first FIRST_TAG.

    The first image stays while the second is built: when the two agree, the second's clamp finds every layer
    in the engine already (`docker load` registers none again: about 40 s less) and the pair ends holding one
    image's layers; when they differ, both are there to name the files. The second build's up-front space
    check counts with the first image on the disk (about 7 GB more than one build needs). Each build's cache
    records go once it is done (the bundle sent into BuildKit's cache is 3.4 GiB).

    The second image stays under OFFLINE_TAG after the module, as the image fixture's does: the next run's
    first clamp then registers no layer this code built before either. Layers are found by the sha256 of
    their bytes, which the clamp computes from this run's build, so an image ID still says only what this
    run built. The last run's image goes once the first build has taken its tag (unless the build is that image).
    """
    kept = build_cache_ids(docker_engine)
    previous = _image_id(OFFLINE_TAG)

    def drop_previous() -> None:
        if previous and previous not in (_image_id(OFFLINE_TAG), _image_id(FIRST_TAG)):
            docker("image", "rm", previous, check=False)

    def build(which: int) -> OfflineBuild:
        result = run_verlbox(
            "build", "p40-cu124", "--offline", str(bundle), "--no-cache", "--tag", OFFLINE_TAG, timeout=3000
        )
        assert result.returncode == 0, result.stderr[-5000:]
        phases.note_build(result.stderr, f"offline build {which}")
        prune_build_cache_since(docker_engine, kept)
        return _inspect(OFFLINE_TAG)

    try:
        first = build(1)
        docker("image", "tag", OFFLINE_TAG, FIRST_TAG)
        docker("image", "rm", OFFLINE_TAG)  # only the tag: FIRST_TAG holds the image
        drop_previous()
        yield first, build(2)
    finally:
        docker("image", "rm", FIRST_TAG, check=False)
        drop_previous()
        prune_build_cache_since(docker_engine, kept)


def test_the_bundle_holds_every_locked_file_with_the_locks_hash(bundle: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    lock = json.loads((REPO / "recipes" / "p40-cu124.lock.json").read_text())
    for step in lock["steps"]:
        for entry in step["pip"]:
            assert manifest["files"][f"wheels/{entry['file']}"] == entry["sha256"], entry["file"]
        if step["stage"] == "final":
            debs = (
                {path.name.split("_")[0] for path in (bundle / "debs" / step["name"]).glob("*.deb")}
                if step["apt"]
                else set()
            )
            assert debs == {entry["name"].split(":")[0] for entry in step["apt"]}, step["name"]
    wheels = {
        name: sha for name, sha in manifest["files"].items() if name.startswith("apex/") and name.endswith(".whl")
    }
    assert wheels == {f"apex/{entry['file']}": entry["sha256"] for entry in lock["compiled"]["apex"]}
    # Debian's signed indexes the .debs were fetched against, for the offline build's apt to check them again
    indexes = [name for name in manifest["files"] if name.startswith("debian/dists/")]
    assert any(name.endswith("/InRelease") for name in indexes), indexes
    assert any(name.endswith("/binary-amd64/Packages") for name in indexes), indexes
    assert "base.tar" in manifest["files"] and manifest["base"]["reference"] == lock["base"]["reference"]
    assert not [path for path in bundle.rglob("*") if path.is_file() and path.stat().st_uid != os.getuid()]


def _tags() -> set[str]:
    return set(docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").stdout.splitlines())


def test_a_bundle_s_base_is_loaded_from_its_archive_when_the_engine_lacks_that_reference(bundle: Path) -> None:
    """The archive is read and checked first (one image, the lock's config digest, no other tags), then
    `docker load`ed: the reference comes back at the lock's image ID, and no other tag on the engine moves.
    A second tag keeps the base's layers meanwhile, so a failure here cannot cost later tests their base."""
    from rich.console import Console

    from verlbox.host.building.plan import BuildPlan
    from verlbox.host.recipes.recipe import load_recipe
    from verlbox.host.trust.bundle import load_base, read_manifest

    manifest = read_manifest(bundle)
    reference, image_id = manifest.base.reference, manifest.base.image_id
    lock = BuildPlan(load_recipe("p40-cu124"), base_override=reference, offline=True).lock
    assert lock is not None
    kept = "verlbox-test/base-kept:offline"
    docker("image", "tag", reference, kept)
    try:
        docker("image", "rm", reference)
        before = _tags()
        assert load_base(bundle, manifest, lock, Console(quiet=True)) == reference
        assert docker("image", "inspect", "--format", "{{.Id}}", reference).stdout.strip() == image_id
        assert _tags() - before == {f"{reference} {image_id.removeprefix('sha256:')[:12]}"}
        assert before - _tags() == set()
    finally:
        if docker("image", "inspect", reference, check=False).returncode != 0:
            docker("image", "tag", kept, reference)
        docker("image", "rm", kept)


def test_an_offline_build_matches_the_lock(offline_builds: tuple[OfflineBuild, OfflineBuild]) -> None:
    result = run_verlbox("verify", OFFLINE_TAG)
    assert result.returncode == 0, result.stdout + result.stderr
    created = docker("image", "inspect", "--format", "{{.Created}}", OFFLINE_TAG).stdout
    lock = json.loads((REPO / "recipes" / "p40-cu124.lock.json").read_text())
    epoch = datetime.fromtimestamp(lock["source_date_epoch"], tz=timezone.utc)
    assert created.startswith(epoch.strftime("%Y-%m-%dT%H:%M:%S")), created  # history and config dated by the lock


def test_two_clean_offline_builds_give_one_image_id(
    offline_builds: tuple[OfflineBuild, OfflineBuild],
) -> None:
    first, second = offline_builds
    if first.image_id == second.image_id:
        return
    # not the same: name the steps whose layers differ and the files that do, then fail
    differ = [index for index, (a, b) in enumerate(zip(first.layers, second.layers, strict=True)) if a != b]
    differing = sorted({line.split(maxsplit=1)[1] for line in _file_hashes(FIRST_TAG) ^ _file_hashes(OFFLINE_TAG)})
    pytest.fail(
        f"image IDs {first.image_id[:19]} and {second.image_id[:19]} differ; layers {differ} of "
        f"{len(first.layers)} (0: the base); files {differing[:40]}"
    )


# the step that installs verlbox's own source: its layer follows that source, every other the lock and the bundle
VERLBOX_SOURCE_STEP = "/tmp/verlbox-src"


def test_an_offline_build_makes_the_layers_the_shipped_lock_names(
    offline_builds: tuple[OfflineBuild, OfflineBuild],
) -> None:
    """The lock's layers were recorded from another bundle, another checkout and another day: an offline build
    repeats them. With another verlbox source than the one they were recorded with, all but its own layer."""
    lock = read_lock(REPO / "recipes" / "p40-cu124.lock.json")
    assert lock.layers is not None, "the shipped lock names no layers: verlbox lock p40-cu124 --layers-of IMAGE"
    _, second = offline_builds
    base = _inspect(lock.base.reference).layers
    assert second.layers[: len(base)] == base
    this_source = lock.layers.verlbox == image_source_digest(__version__)
    differing = []
    for number, (want, have) in enumerate(zip_longest(lock.layers.layers, second.layers[len(base) :]), 1):
        if want is None:
            differing.append(f"layer {number}: {have}, not in the lock")
        elif have != want.diff_id and (this_source or VERLBOX_SOURCE_STEP not in want.step):
            differing.append(f"layer {number} ({want.step}): {have}, lock {want.diff_id}")
    assert not differing, f"record them again (verlbox lock p40-cu124 --layers-of IMAGE): {differing}"


@pytest.fixture(scope="module")
def layered_recipe(offline_builds: tuple[OfflineBuild, OfflineBuild], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shipped recipe whose lock names the layers of OFFLINE_TAG, as `verlbox lock --layers-of`
    records them from the build this session made and recorded."""
    folder = tmp_path_factory.mktemp("recipes")
    for name in ("p40-cu124.yaml", "_verl-0.4.1.yaml", "p40-cu124.lock.json"):
        shutil.copy(REPO / "recipes" / name, folder / name)
    recipe = folder / "p40-cu124.yaml"
    result = run_verlbox("lock", str(recipe), "--layers-of", OFFLINE_TAG, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return recipe


def _refusing_to_save(image: str, folder: Path) -> dict[str, str]:
    """An environment whose `docker` refuses to save IMAGE (and runs every other command): a verify that reads
    the image fails."""
    folder.mkdir()
    real = shutil.which("docker")
    (folder / "docker").write_text(
        f'#!/bin/sh\nif [ "$2" = save ]; then for word in "$@"; do if [ "$word" = "{image}" ]; then\n'
        f'  echo "refused: saving {image}" >&2; exit 1\nfi; done; fi\nexec {real} "$@"\n'
    )
    (folder / "docker").chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_an_image_with_the_lock_s_layers_matches_with_no_record_and_nothing_read(
    offline_builds: tuple[OfflineBuild, OfflineBuild], layered_recipe: Path, tmp_path: Path
) -> None:
    lock_file = layered_recipe.parent / "p40-cu124.lock.json"
    written = read_lock(lock_file)
    assert written.layers is not None
    _, second = offline_builds
    assert [*_inspect(written.base.reference).layers, *written.layers.diff_ids] == second.layers
    assert written.content_hash == read_lock(REPO / "recipes" / "p40-cu124.lock.json").content_hash
    assert "steps.sh --offline pip torch" in written.layers.layers[2].step
    env = _refusing_to_save(OFFLINE_TAG, tmp_path / "bin") | {"XDG_STATE_HOME": str(tmp_path / "no-state")}
    saving = subprocess.run(  # never captured: were the wrapper to let it through, 7 GB would come out
        ["docker", "image", "save", OFFLINE_TAG],
        env=os.environ | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert (saving.returncode, saving.stderr) == (1, f"refused: saving {OFFLINE_TAG}\n".encode())
    result = run_verlbox("verify", OFFLINE_TAG, "--recipe", str(layered_recipe), env=env)
    assert (result.returncode, result.stdout) == (0, f"{OFFLINE_TAG} matches {lock_file}\n"), result.stderr


def test_an_image_with_a_layer_the_lock_does_not_name_is_named_by_that_layer(
    layered_recipe: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "zz-hide.pth").write_text("import os\n")
    derived = tiny_images.build(
        folder, f"FROM {OFFLINE_TAG}\nCOPY zz-hide.pth /opt/venv/lib/python3.11/site-packages/zz-hide.pth\n"
    )
    try:
        image, layers = _inspect(derived).image_id, _inspect(derived).layers
        env = {"XDG_STATE_HOME": str(tmp_path / "no-state")}
        result = run_verlbox("verify", derived, "--recipe", str(layered_recipe), env=env, timeout=900)
    finally:
        docker("image", "rm", derived, check=False)
    records = tmp_path / "no-state" / "verlbox" / "images"
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"layer {len(layers) - 1} above the base: {layers[-1][:19]}, which the lock does not list",
        f"image {image[:19]}: no build of recipe p40-cu124 is recorded on this host ({records}), so nothing "
        "vouches for its files: build it here (verlbox build p40-cu124)",
    ]


def test_an_online_build_s_layers_are_not_recorded(image: str, layered_recipe: Path) -> None:
    result = run_verlbox("lock", str(layered_recipe), "--layers-of", image, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{image} is not an offline build" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _crafted(bundle: Path, into: Path, change: Callable[[Path], object]) -> Path:
    """The genuine bundle hard-linked into INTO, CHANGE applied, and its manifest recomputed over the result:
    the manifest vouches for whatever the folder holds, as an attacker's would."""
    for source in bundle.rglob("*"):
        target = into / source.relative_to(bundle)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
    change(into)
    manifest = json.loads((into / "manifest.json").read_text())
    files = sorted(p for p in into.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest["files"] = {p.relative_to(into).as_posix(): file_sha256(p) for p in files}
    (into / "manifest.json").unlink()  # a hard link: the genuine manifest stays as it was
    (into / "manifest.json").write_text(json.dumps(manifest))
    return into


def _replace(path: Path, data: bytes) -> None:
    path.unlink()  # the genuine bundle's file is the same inode: never written through
    path.write_bytes(data)


def _swap_apex_wheel(folder: Path) -> None:
    [wheel] = (folder / "apex").glob("*.whl")
    _replace(wheel, wheel.read_bytes() + b"\0")


def _tamper_a_deb(folder: Path) -> None:
    deb = sorted((folder / "debs" / "python").glob("*.deb"))[0]
    _replace(deb, deb.read_bytes() + b"\0")


def _add_a_deb(folder: Path) -> None:
    deb = sorted((folder / "debs" / "python").glob("*.deb"))[0]
    (folder / "debs" / "python" / "evil_1.0_amd64.deb").write_bytes(deb.read_bytes())


def _add_a_build_backend(folder: Path) -> None:
    """A setuptools newer than any pin beside the lock's sdists: an offline pip or uv building one would take it
    from wheels/ and run its build hook (a real wheel's bytes under a name no lock has)."""
    wheel = sorted((folder / "wheels").glob("setuptools-*.whl"))[0]
    (folder / "wheels" / "setuptools-99.0.0-py3-none-any.whl").write_bytes(wheel.read_bytes())


def _fake_the_apex_commit(folder: Path) -> None:
    """The source record smoke and verify read the Apex commit from, claiming another commit."""
    record = folder / "apex" / "verlbox-source.json"
    faked = json.loads(record.read_text()) | {"commit": "0" * 40}
    _replace(record, json.dumps(faked).encode())


def _rewrite_an_apex_build_record(folder: Path) -> None:
    """A builder step's record, which a later `verlbox lock` of the image would turn into pins."""
    record = folder / "apex" / "build-record" / "apex-build-tools.pip.json"
    entries = json.loads(record.read_text())
    entries[0]["sha256"] = "0" * 64
    _replace(record, json.dumps(entries).encode())


def _add_a_file_to_apex(folder: Path) -> None:
    (folder / "apex" / "run-me.sh").write_text("#!/bin/sh\n")


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (_swap_apex_wheel, "is not a apex wheel the lock pins"),
        (_tamper_a_deb, "but Debian's signed index lists"),
        (_add_a_deb, "evil=1.0 not in the lock's step python"),
        (_add_a_build_backend, "setuptools-99.0.0-py3-none-any.whl: not a file the lock names"),
        (_fake_the_apex_commit, "verlbox-source.json: commit '0000000000000000000000000000000000000000', the recipe's"),
        (_rewrite_an_apex_build_record, "apex-build-tools.pip.json: differs from the lock's step apex-build-tools"),
        (_add_a_file_to_apex, "apex/run-me.sh: not a file a bundle's apex/ holds"),
    ],
    ids=[
        "swapped-apex-wheel",
        "tampered-deb",
        "extra-deb",
        "extra-build-backend",
        "faked-apex-commit",
        "rewritten-apex-record",
        "extra-apex-file",
    ],
)
def test_a_crafted_bundle_is_refused_in_one_line_before_any_step_and_the_engine_is_unchanged(
    bundle: Path, tmp_path: Path, change: Callable[[Path], object], refusal: str
) -> None:
    crafted = _crafted(bundle, tmp_path / "crafted", change)
    images = _images()
    command = ["build", "p40-cu124", "--offline", str(crafted), "--skip-space-check", "--tag", OFFLINE_TAG]
    try:
        result = run_verlbox(*command)
    finally:
        shutil.rmtree(crafted)  # hard links: they would keep the genuine bundle's 3.4 GiB after it is gone
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1 and refusal in result.stderr, result.stderr[-3000:]
    assert _images() == images


def _images() -> set[str]:
    """Every image on the engine with its names; a set: `image ls` orders images created at the same second
    (an offline build is dated to the lock's build) in no fixed order."""
    return set(
        docker("image", "ls", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}").stdout.split("\n")
    )


def _tamper_a_deb_and_its_index_entry(folder: Path) -> None:
    """What the host cannot catch: the .deb changed and the uncompressed Packages entry rewritten to match.
    Only Debian's signature chain (InRelease -> Packages.xz -> the .deb's sha256) stands in the way."""
    deb = sorted((folder / "debs" / "python").glob("*.deb"))[0]
    old = file_sha256(deb)
    _replace(deb, deb.read_bytes() + b"\0")
    [packages] = (folder / "debian" / "dists").glob("*/main/binary-*/Packages")
    _replace(packages, packages.read_bytes().replace(old.encode(), file_sha256(deb).encode()))


def test_apt_itself_refuses_a_deb_whose_index_entry_was_rewritten(
    bundle: Path, tmp_path: Path, docker_engine: Any
) -> None:
    crafted = _crafted(bundle, tmp_path / "crafted", _tamper_a_deb_and_its_index_entry)
    kept = build_cache_ids(docker_engine)
    tag = "verlbox-test/p40-cu124:crafted"
    try:
        result = run_verlbox("build", "p40-cu124", "--offline", str(crafted), "--skip-space-check", "--tag", tag)
    finally:
        prune_build_cache_since(docker_engine, kept)  # the bundle it sent into BuildKit's cache
        shutil.rmtree(crafted)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Hash Sum mismatch" in result.stderr and "previous images and tags are untouched" in result.stderr
    assert docker("image", "inspect", tag, check=False).returncode != 0
