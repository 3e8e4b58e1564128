"""The host's record of a build (host/trust/built.py) and verify's hold on an image by it: the facts verify compares
with the lock, read from the image's files; an image of the recorded layers is not read; any other is read and
each path that differs is one line; an image no build here recorded is one line."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tiny_images
from conftest import docker
from verlbox.host.recipes.lock import LockedLayer, LockedLayers
from verlbox.host.trust import built, verify
from verlbox.host.trust.built import keep, read_facts, read_image, record_path, write_record

MODULE = b"ANSWER = 42\n"
SITE = "opt/venv/lib/python3.11/site-packages"
STATUS = b"""Package: bash
Status: install ok installed
Version: 5.2.15-2+b8

Package: gone
Status: deinstall ok config-files
Version: 1.0

Package: never
Status: purge ok not-installed
"""


def test_the_facts_verify_compares_are_read_from_the_image_s_files() -> None:
    kept = {
        f"{SITE}/Torch-2.6.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: Torch\nVersion: 2.6.0\n\nbody",
        f"{SITE}/apex-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n",
        f"{SITE}/apex-0.1.dist-info/verlbox-source.json": b'{"commit": "abc123"}',
        "opt/verlbox/build-record/compiled/apex.json": b'[{"file": "apex-0.1-cp311.whl", "sha256": "00"}]',
        "var/lib/dpkg/status": STATUS,
    }
    assert all(keep(path) for path in kept)
    assert not keep(f"{SITE}/torch/__init__.py") and not keep(f"{SITE}/torch-2.6.0.dist-info/RECORD")
    facts = read_facts(kept)
    assert facts.pip == {"torch": "2.6.0", "apex": "0.1"}
    assert facts.apt == {"bash": "5.2.15-2+b8", "gone": "1.0"}  # as `dpkg-query -W` lists them
    assert facts.apex == "abc123"
    assert facts.compiled == {"apex": [{"file": "apex-0.1-cp311.whl", "sha256": "00"}]}


@pytest.fixture
def recorded(docker_engine: object, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tiny image of recipe `tiny` FROM scratch (nothing in it runs), built and recorded as `verlbox build`
    does: (its tag, the records folder)."""
    tag = f"verlbox-test/built:{tiny_images.token()}"
    folder = tmp_path / "image"
    folder.mkdir()
    (folder / "module.py").write_bytes(MODULE)
    tiny_images.build(folder, "FROM scratch\nLABEL io.verlbox.recipe=tiny\nCOPY module.py /opt/app/module.py\n", tag)
    records = tmp_path / "records"
    write_record(records, read_image(tag))
    yield tag, records
    docker("image", "rm", tag, check=False)


def test_an_image_with_the_recorded_layers_is_not_read(
    recorded: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, records = recorded

    def never(reference: str) -> None:
        raise AssertionError("the image was read")

    monkeypatch.setattr(verify, "read_image", never)
    assert verify.held_to_build(tag, "tiny", records).differences == []


def test_a_derived_image_is_read_and_each_changed_or_added_file_named(
    recorded: tuple[str, Path], tmp_path: Path
) -> None:
    tag, records = recorded
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "module.py").write_text("ANSWER = 43\n")
    (folder / "hide.pth").write_text("import os\n")
    derived = tiny_images.build(
        folder, f"FROM {tag}\nCOPY module.py /opt/app/module.py\nCOPY hide.pth /opt/app/zz.pth\n"
    )
    try:
        found = verify.held_to_build(derived, "tiny", records).differences
    finally:
        docker("image", "rm", derived, check=False)
    was, now, pth = (hashlib.sha256(data).hexdigest()[:12] for data in (MODULE, b"ANSWER = 43\n", b"import os\n"))
    assert found == [
        f"file /opt/app/module.py: changed since the build (file 0644 0:0 sha256 {now}, "
        f"built file 0644 0:0 sha256 {was})",
        f"file /opt/app/zz.pth: added since the build (file 0644 0:0 sha256 {pth})",
    ]


def test_a_record_that_names_other_layers_is_no_shortcut(recorded: tuple[str, Path]) -> None:
    """The record is keyed by image ID, but the layers decide: a record whose layers are not the image's is read."""
    tag, records = recorded
    image, _, _ = built.identity(tag)
    path = record_path(records, image)
    record = built.load_record(path)
    assert record is not None
    record.layers = ["sha256:" + "0" * 64]
    record.files["opt/app/module.py"] = "file 0644 0:0 sha256:" + "1" * 64
    write_record(records, record)
    now = hashlib.sha256(MODULE).hexdigest()[:12]
    assert verify.held_to_build(tag, "tiny", records).differences == [
        f"file /opt/app/module.py: changed since the build (file 0644 0:0 sha256 {now}, built file 0644 0:0 sha256 "
        "111111111111)"
    ]


def test_an_image_of_a_recipe_no_build_here_recorded_is_one_line(recorded: tuple[str, Path], tmp_path: Path) -> None:
    tag, _ = recorded
    image, _, _ = built.identity(tag)
    found = verify.held_to_build(tag, "tiny", tmp_path / "no-records").differences
    assert found == [
        f"image {image[:19]}: no build of recipe tiny is recorded on this host ({tmp_path / 'no-records'}), so "
        "nothing vouches for its files: build it here (verlbox build tiny)"
    ]


def test_a_record_is_the_image_s_every_path(recorded: tuple[str, Path]) -> None:
    tag, records = recorded
    image, layers, _ = built.identity(tag)
    data = json.loads(gzip.decompress(record_path(records, image).read_bytes()))
    assert (data["recipe"], data["image"], data["layers"]) == ("tiny", image, layers)
    assert data["files"]["opt/app/module.py"].endswith(hashlib.sha256(MODULE).hexdigest())


@pytest.fixture
def over_a_base(docker_engine: object, tmp_path: Path) -> Iterator[tuple[str, str, LockedLayers]]:
    """A tiny base and an image of recipe `tiny` over it, both FROM scratch: (the base's tag, the image's tag, the
    image's layers above the base as a lock names them). No build is recorded."""
    mark = tiny_images.token()
    base, tag = f"verlbox-test/built-base:{mark}", f"verlbox-test/built:{mark}"
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "os-release").write_text("ID=tiny\n")
    tiny_images.build(folder, "FROM scratch\nCOPY os-release /etc/os-release\n", base)
    (folder / "module.py").write_bytes(MODULE)
    tiny_images.build(folder, f"FROM {base}\nLABEL io.verlbox.recipe=tiny\nCOPY module.py /opt/app/module.py\n", tag)
    _, layers, _ = built.identity(tag)
    locked = LockedLayers(
        verlbox="0" * 64,
        layers=[LockedLayer(diff_id=layers[1], step="COPY module.py /opt/app/module.py")],
        config=built.config_digest(built.runtime_config(tag)),
    )
    yield base, tag, locked
    docker("image", "rm", tag, base, check=False)


def test_an_image_with_the_lock_s_layers_over_its_base_is_not_read_and_needs_no_record(
    over_a_base: tuple[str, str, LockedLayers], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, tag, locked = over_a_base

    def never(reference: str) -> None:
        raise AssertionError("the image was read")

    monkeypatch.setattr(verify, "read_image", never)
    held = verify.held_to_build(tag, "tiny", tmp_path / "no-records", locked, base)
    assert (held.facts, held.differences) == (None, [])  # None: its facts are the lock's


def test_an_image_with_a_layer_the_lock_lacks_is_read_and_each_such_layer_named(
    over_a_base: tuple[str, str, LockedLayers], tmp_path: Path
) -> None:
    base, tag, locked = over_a_base
    folder = tmp_path / "derived"
    folder.mkdir()
    (folder / "hide.pth").write_text("import os\n")
    derived = tiny_images.build(folder, f"FROM {tag}\nCOPY hide.pth /opt/app/zz.pth\n")
    try:
        image, layers, _ = built.identity(derived)
        found = verify.held_to_build(derived, "tiny", tmp_path / "no-records", locked, base).differences
        # a base the engine lacks: the layers cannot be held to the lock's, and nothing else vouches either
        missing = verify.held_to_build(tag, "tiny", tmp_path / "no-records", locked, base + "-gone").differences
    finally:
        docker("image", "rm", derived, check=False)
    unvouched = (
        f"image {image[:19]}: no build of recipe tiny is recorded on this host ({tmp_path / 'no-records'}), so "
        "nothing vouches for its files: build it here (verlbox build tiny)"
    )
    assert found == [f"layer 2 above the base: {layers[2][:19]}, which the lock does not list", unvouched]
    assert (
        missing[0]
        == f"layers: base {base}-gone is not on this engine, so the image's layers cannot be held to the lock's"
    )
    assert len(missing) == 2


def test_a_saved_image_names_what_made_each_layer(over_a_base: tuple[str, str, LockedLayers]) -> None:
    _, tag, _ = over_a_base
    assert read_image(tag).steps == ["COPY os-release /etc/os-release", "COPY module.py /opt/app/module.py"]


def test_an_image_of_the_lock_s_layers_that_runs_something_else_is_named_by_its_config(
    over_a_base: tuple[str, str, LockedLayers], tmp_path: Path
) -> None:
    """ENTRYPOINT adds no layer: the layers are the lock's, what a container runs is not."""
    base, tag, locked = over_a_base
    derived = tiny_images.build(tmp_path / "derived", f'FROM {tag}\nENTRYPOINT ["/opt/app/other"]\n')
    try:
        assert built.identity(derived)[1] == built.identity(tag)[1]
        now = built.config_digest(built.runtime_config(derived))
        found = verify.held_to_build(derived, "tiny", tmp_path / "no-records", locked, base).differences
    finally:
        docker("image", "rm", derived, check=False)
    assert found[0] == (
        f"config: sha256 {now[:12]}, the lock's offline build's {locked.config[:12]}: what a container of it runs "
        "with (entrypoint, command, environment, user, labels) is not that build's"
    )
    assert len(found) == 2 and "nothing vouches for its files" in found[1]


def test_a_changed_entrypoint_is_one_line_against_the_build_s_record(
    recorded: tuple[str, Path], tmp_path: Path
) -> None:
    tag, records = recorded
    derived = tiny_images.build(tmp_path / "derived", f'FROM {tag}\nENTRYPOINT ["/opt/app/other"]\n')
    try:
        found = verify.held_to_build(derived, "tiny", records).differences
    finally:
        docker("image", "rm", derived, check=False)
    assert found == ['config Entrypoint: image ["/opt/app/other"], built absent']
