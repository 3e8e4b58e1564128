"""A lock's layers (host/trust/layers.py): the diff IDs of an offline build of the lock, kept out of the lock's hash,
validated like the rest of it, and held against an image layer by layer, each differing layer named by its step."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from verlbox import __version__, paths
from verlbox.errors import UsageError
from verlbox.host.building.context import image_source, image_source_digest
from verlbox.host.recipes.lock import LockedLayer, LockedLayers, read_lock
from verlbox.host.trust import built
from verlbox.host.trust import layers as layers_module
from verlbox.host.trust.built import config_differences
from verlbox.host.trust.image_files import STEP_WIDTH, layer_steps
from verlbox.host.trust.layers import layer_differences, other_source

SHIPPED_LOCK = REPO / "recipes" / "p40-cu124.lock.json"
BASE = ["sha256:" + "b" * 64]
CONFIG = "c" * 64  # the locked build's runtime config, by digest


def _digest(mark: str) -> str:
    return "sha256:" + hashlib.sha256(mark.encode()).hexdigest()


def _locked(*marks: str) -> LockedLayers:
    return LockedLayers(
        verlbox=image_source_digest("0"),
        layers=[LockedLayer(diff_id=_digest(mark), step=f"RUN step {mark}") for mark in marks],
        config=CONFIG,
    )


def test_each_layer_s_step_is_what_its_history_says_without_buildkit_s_wrapping() -> None:
    torch = "bash /tmp/verlbox/steps/steps.sh --offline pip torch torch==2.6.0"
    long = "pip install " + "x" * 200
    config = {
        "history": [
            {"created_by": "verlbox: a debootstrapped base"},
            {"created_by": "ARG SOURCE_DATE_EPOCH", "empty_layer": True},
            {"created_by": f"RUN |1 SOURCE_DATE_EPOCH=1796234500 /bin/bash -o pipefail -c {torch} # buildkit"},
            {"created_by": "COPY image-spec.json /opt/verlbox/image-spec.json # buildkit"},
            {"created_by": f"RUN /bin/sh -c {long}"},
        ]
    }
    steps = layer_steps(config, 4)
    spec = "COPY image-spec.json /opt/verlbox/image-spec.json"
    assert steps[:3] == ["verlbox: a debootstrapped base", f"RUN {torch}", spec]
    assert len(steps[3]) == STEP_WIDTH and steps[3].startswith("RUN pip install xxx") and steps[3].endswith("...")
    # a history that does not say which entry made which layer: the layers go by number alone
    assert layer_steps(config, 5) == [""] * 5
    assert layer_steps({}, 2) == ["", ""]
    # a crafted config is no reason to fail: its layers go by number
    assert layer_steps({"history": [1]}, 1) == [""]
    assert layer_steps([], 1) == [""]


def test_a_lock_s_layers_are_not_part_of_its_hash_and_read_back_as_written(tmp_path: Path) -> None:
    lock = read_lock(SHIPPED_LOCK)
    with_layers = lock.model_copy(update={"layers": _locked("one", "two")})
    assert with_layers.content_hash == lock.model_copy(update={"layers": None}).content_hash
    # the hash still follows everything else the lock says
    assert lock.model_copy(update={"source_date_epoch": 1}).content_hash != lock.content_hash
    path = tmp_path / "p40-cu124.lock.json"
    path.write_text(json.dumps(with_layers.model_dump(exclude_none=True)))
    assert read_lock(path).layers == _locked("one", "two")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda layers: layers["layers"][0].update(diff_id="sha256:xyz"), "layers.layers.0.diff_id"),
        (lambda layers: layers.update(verlbox="not hex"), "layers.verlbox"),
        (lambda layers: layers["layers"][1].update(step="RUN a\nRUN b"), "layers.layers.1.step"),
        (lambda layers: layers.update(by="me"), "layers.by: unknown key"),
        (lambda layers: layers.pop("config"), "layers.config: required key is missing"),
        # none at all would make the bare base, relabelled, "the build" (the layers are outside the lock's hash)
        (lambda layers: layers.update(layers=[]), "layers.layers: List should have at least 1 item"),
    ],
)
def test_a_lock_s_layers_are_validated_naming_the_file_and_key(
    change: Callable[[dict[str, Any]], None], key: str, tmp_path: Path
) -> None:
    data = json.loads(SHIPPED_LOCK.read_text())
    data["layers"] = _locked("one", "two").model_dump()
    change(data["layers"])
    path = tmp_path / "p40-cu124.lock.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError) as refused:
        read_lock(path)
    assert f"{path}: {key}" in str(refused.value)


def test_each_layer_that_is_not_the_lock_s_is_named_with_its_step() -> None:
    locked = _locked("python", "torch", "verlbox")
    same = BASE + locked.diff_ids
    assert layer_differences(locked, "base", BASE, same, CONFIG) == []
    changed = [*BASE, _digest("python"), _digest("torch, rebuilt"), _digest("verlbox"), _digest("a .pth")]
    assert layer_differences(locked, "base", BASE, changed, CONFIG) == [
        f"layer 2 above the base (RUN step torch): {_digest('torch, rebuilt')[:19]}, lock {_digest('torch')[:19]}",
        f"layer 4 above the base: {_digest('a .pth')[:19]}, which the lock does not list",
    ]
    assert layer_differences(locked, "base", BASE, [*BASE, _digest("python")], CONFIG) == [
        f"layer 2 above the base (RUN step torch): absent, lock {_digest('torch')[:19]}",
        f"layer 3 above the base (RUN step verlbox): absent, lock {_digest('verlbox')[:19]}",
    ]


def test_an_image_not_over_the_engine_s_base_is_one_line() -> None:
    locked = _locked("python")
    assert layer_differences(locked, "debian:x", None, BASE + locked.diff_ids, CONFIG) == [
        "layers: base debian:x is not on this engine, so the image's layers cannot be held to the lock's"
    ]
    assert layer_differences(locked, None, None, BASE + locked.diff_ids, CONFIG) == [
        "layers: the image names no base (no io.verlbox.base label), so its layers are not the lock's"
    ]
    assert layer_differences(locked, "debian:x", [_digest("other base")], BASE + locked.diff_ids, CONFIG) == [
        "layers: the image is not built on this engine's debian:x, so its layers are not the lock's"
    ]


def test_the_source_digest_follows_what_an_image_carries_of_verlbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "verlbox"
    shutil.copytree(paths.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__", "shipped"))
    monkeypatch.setattr(paths, "PACKAGE_DIR", package)
    before = image_source_digest("1.0")
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"bytecode")
    (package / "shipped").mkdir()
    (package / "shipped" / "mine.yaml").write_text("name: mine\n")
    assert image_source_digest("1.0") == before  # neither goes into an image
    assert image_source_digest("1.1") != before  # the image's pyproject names the version
    (package / "cli.py").write_text((package / "cli.py").read_text() + "# edited\n")
    assert image_source_digest("1.0") != before


def _carried(source: dict[str, bytes]) -> dict[str, str]:
    """A record's lines for verlbox's package as an image carries SOURCE."""
    site = "opt/venv/lib/python3.11/site-packages/"
    return {
        site + path: f"file 0644 0:0 sha256:{hashlib.sha256(data).hexdigest()}"
        for path, data in source.items()
        if path.startswith("verlbox/")
    }


def test_an_image_carrying_another_verlbox_is_named_by_its_first_other_file() -> None:
    lines = _carried(image_source("0"))
    assert other_source(lines) is None
    site = "opt/venv/lib/python3.11/site-packages/"
    assert other_source(lines | {site + "verlbox/__pycache__/cli.cpython-311.pyc": "file 0644 0:0 sha256:00"}) is None
    edited = lines | {site + "verlbox/errors.py": "file 0644 0:0 sha256:" + "0" * 64}
    assert other_source(edited) == "its verlbox/errors.py is not this verlbox's"
    added = lines | {site + "verlbox/extra.py": "file 0644 0:0 sha256:" + "0" * 64}
    assert other_source(added) == "its verlbox/extra.py is not this verlbox's"
    assert other_source({"etc/hostname": "file 0644 0:0 sha256:00"}) == "no verlbox package"


def test_an_image_that_runs_other_things_over_the_lock_s_layers_is_named_by_its_config() -> None:
    locked = _locked("python")
    assert layer_differences(locked, "base", BASE, BASE + locked.diff_ids, "d" * 64) == [
        "config: sha256 dddddddddddd, the lock's offline build's cccccccccccc: what a container of it runs with "
        "(entrypoint, command, environment, user, labels) is not that build's"
    ]


def test_each_part_of_the_runtime_config_that_differs_is_one_line() -> None:
    built = {
        "Entrypoint": ["verlbox"],
        "Cmd": ["train"],
        "Env": ["PATH=/opt/venv/bin:/usr/bin", "HF_HUB_OFFLINE=1"],
        "Labels": {"io.verlbox.recipe": "p40-cu124", "io.verlbox.pin.torch": "2.6.0"},
        "Os": "linux",
    }
    assert config_differences(built, dict(built)) == []
    now = built | {
        "Entrypoint": ["python", "-c", "print('forged')"],
        "Env": ["PATH=/opt/venv/bin:/usr/bin", "HF_HUB_OFFLINE=1", "LD_PRELOAD=/tmp/x.so"],
        "Labels": {"io.verlbox.recipe": "p40-cu124", "io.verlbox.pin.torch": "2.7.0"},
        "User": "0",
    }
    assert config_differences(built, now) == [
        'config Entrypoint: image ["python", "-c", "print(\'forged\')"], built ["verlbox"]',
        'config Env LD_PRELOAD: image "/tmp/x.so", built absent',
        'config User: image "0", built absent',
        'config label io.verlbox.pin.torch: image "2.7.0", built "2.6.0"',
    ]


@pytest.fixture
def offline_record(monkeypatch: pytest.MonkeyPatch) -> built.Record:
    """The engine and the records faked at their boundary: an image of layers BASE + two, recorded as an offline
    build carrying this verlbox, dated by the lock, over the engine's BASE."""
    layers = [*BASE, _digest("python"), _digest("verlbox")]
    record = built.Record(
        recipe="p40-cu124",
        lock_hash=None,
        image="sha256:" + "1" * 64,
        layers=layers,
        facts=built.Facts({}, {}, None, {}),
        files=_carried(image_source("0")),
        steps=["verlbox: a debootstrapped base", "RUN bash steps.sh --offline apt python", "RUN pip install x"],
        config={"Entrypoint": ["verlbox"]},
    )
    monkeypatch.setattr(layers_module, "identity", lambda image: (record.image, layers, {}))
    monkeypatch.setattr(layers_module, "load_record", lambda path: record)
    monkeypatch.setattr(layers_module, "image_created", lambda image: 1000)
    monkeypatch.setattr(layers_module, "layers_of", lambda base: BASE if base == "base" else None)
    monkeypatch.setattr(layers_module, "runtime_config", lambda image: record.config)
    return record


def _offline_layers(lock_epoch: int = 1000, base: str = "base") -> LockedLayers:
    lock = read_lock(SHIPPED_LOCK).model_copy(update={"source_date_epoch": lock_epoch})
    return layers_module.offline_layers("img", lock, base, Path("records"))


def test_an_offline_build_s_layers_are_taken_above_its_base_with_their_steps(offline_record: built.Record) -> None:
    locked = _offline_layers()
    assert locked.diff_ids == offline_record.layers[1:]
    assert [layer.step for layer in locked.layers] == offline_record.steps[1:]
    assert locked.config == built.config_digest(offline_record.config)
    assert locked.verlbox == image_source_digest(__version__)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda record: record.steps.__setitem__(1, "RUN bash steps.sh apt python"), "img is not an offline build"),
        (lambda record: record.files.clear(), "img carries another verlbox than this one (no verlbox package)"),
    ],
)
def test_an_image_that_is_not_this_verlbox_s_offline_build_is_refused(
    offline_record: built.Record, change: Callable[[built.Record], None], refusal: str
) -> None:
    change(offline_record)
    with pytest.raises(UsageError) as refused:
        _offline_layers()
    assert str(refused.value).startswith(refusal)


def test_an_image_of_another_date_or_base_is_refused_naming_both(offline_record: built.Record) -> None:
    with pytest.raises(UsageError) as refused:
        _offline_layers(lock_epoch=999)
    assert "img was made at 1000, not at the lock's source_date_epoch 999" in str(refused.value)
    with pytest.raises(UsageError) as refused:
        _offline_layers(base="gone")
    assert str(refused.value).startswith("img's base gone is not on this engine")


def test_an_image_no_build_here_recorded_is_refused(
    offline_record: built.Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers_module, "load_record", lambda path: None)
    with pytest.raises(UsageError) as refused:
        _offline_layers()
    assert str(refused.value).startswith("img: no record of its build on this host (records)")
