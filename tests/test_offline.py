"""Integration: bundle p40-cu124, build it twice from the bundle with no network and no cache, compare.

The bundle's Apex wheel is the one the `image` fixture's build compiled: it is compiled once per run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import REPO, ca_arguments, docker, run_verlbox

pytestmark = [pytest.mark.docker, pytest.mark.slow]

OFFLINE_TAGS = ("verlbox-test/p40-cu124:offline-a", "verlbox-test/p40-cu124:offline-b")


@pytest.fixture(scope="module")
def bundle(image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "p40-cu124"
    result = run_verlbox("bundle", "p40-cu124", "--out", str(out), *ca_arguments(), timeout=2400)
    assert result.returncode == 0, result.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def offline_images(bundle: Path) -> Iterator[list[str]]:
    """Two `--no-cache` builds from the bundle: the image IDs they gave."""
    ids = []
    try:
        for tag in OFFLINE_TAGS:
            result = run_verlbox(
                "build", "p40-cu124", "--offline", str(bundle), "--no-cache", "--tag", tag, timeout=3000
            )
            assert result.returncode == 0, result.stderr[-5000:]
            ids.append(docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip())
        yield ids
    finally:
        docker("image", "rm", *OFFLINE_TAGS, check=False)


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
    assert [name for name in manifest["files"] if name.startswith("apex/") and name.endswith(".whl")]
    assert "base.tar" in manifest["files"] and manifest["base"]["reference"] == lock["base"]["reference"]
    assert not [path for path in bundle.rglob("*") if path.is_file() and path.stat().st_uid != os.getuid()]


def test_an_offline_build_matches_the_lock(offline_images: list[str]) -> None:
    result = run_verlbox("verify", OFFLINE_TAGS[0])
    assert result.returncode == 0, result.stdout + result.stderr
    created = docker("image", "inspect", "--format", "{{.Created}}", OFFLINE_TAGS[0]).stdout
    lock = json.loads((REPO / "recipes" / "p40-cu124.lock.json").read_text())
    epoch = datetime.fromtimestamp(lock["source_date_epoch"], tz=timezone.utc)
    assert created.startswith(epoch.strftime("%Y-%m-%dT%H:%M:%S")), created  # history and config dated by the lock


# every regular file of the image with its sha256, to name what differs when two builds do
# (without the files `docker run` itself mounts over the image's)
FILE_HASHES = (
    "find / -xdev -type f ! -path /etc/hosts ! -path /etc/hostname ! -path /etc/resolv.conf -print0"
    " | sort -z | xargs -0 sha256sum"
)


def _layers(tag: str) -> list[str]:
    return json.loads(docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag).stdout)


def test_two_clean_offline_builds_give_one_image_id(offline_images: list[str]) -> None:
    first, second = offline_images
    if first == second:
        return
    # not the same: name the steps whose layers differ and the files that do, then fail
    layers = [_layers(tag) for tag in OFFLINE_TAGS]
    differ = [index for index, (a, b) in enumerate(zip(*layers, strict=True)) if a != b]
    files = [
        docker("run", "--rm", "--entrypoint", "bash", tag, "-c", FILE_HASHES).stdout.splitlines()
        for tag in OFFLINE_TAGS
    ]
    differing = sorted({line.split(maxsplit=1)[1] for line in set(files[0]) ^ set(files[1])})
    pytest.fail(
        f"image IDs {first[:19]} and {second[:19]} differ; layers {differ} of {len(layers[0])} (0: the base); "
        f"files {differing[:40]}"
    )
