"""A lock's layers: the diff IDs of an offline (bundle) build of the lock above its base. Offline builds repeat to
the byte (one image ID from two `--no-cache` builds), so an image whose layers are the lock's holds the files that
build held, wherever it was built over this host's base: `verlbox verify` of such an image (its config that build's
too) compares digests and reads nothing.

`verlbox lock RECIPE --layers-of IMAGE` records them from an offline build this host made, recorded and verified
(built.py), with the digest of what a container of it runs with (its runtime config, which no layer holds); they stay
out of the lock's hash, which that very build carries in its labels. One layer installs verlbox's own source, so
layers recorded with another verlbox match no image this one builds (a note says so).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from itertools import zip_longest
from pathlib import Path

from rich.console import Console

from verlbox import __version__
from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.context import image_source, image_source_digest
from verlbox.host.recipes.lock import Lock, LockedLayer, LockedLayers, image_created
from verlbox.host.trust.built import (
    config_digest,
    identity,
    load_record,
    read_image,
    record_path,
    runtime_config,
    write_record,
)

err = Console(stderr=True, highlight=False, soft_wrap=True)

OFFLINE_STEP = "steps.sh --offline "  # how an offline build's history names its install steps
# verlbox's package in an image (every recipe's Python is the venv at /opt/venv)
CARRIED = re.compile(r"opt/venv/lib/python[^/]+/site-packages/verlbox/(.+)")


def layers_of(reference: str | None) -> list[str] | None:
    """The engine's image REFERENCE's layers' diff IDs, or None where it is not there."""
    try:
        return identity(reference)[1] if reference else None
    except VerlboxError:
        return None


def layer_differences(
    locked: LockedLayers, base: str | None, base_layers: list[str] | None, layers: list[str], config: str
) -> list[str]:
    """A line per layer of an image (LAYERS, over the engine's BASE with BASE_LAYERS) that is not the LOCKED one,
    and one where its runtime config (CONFIG, its digest) is not the locked build's."""
    found = []
    if config != locked.config:
        found.append(
            f"config: sha256 {config[:12]}, the lock's offline build's {locked.config[:12]}: what a container of it "
            "runs with (entrypoint, command, environment, user, labels) is not that build's"
        )
    if base is None:
        return [*found, "layers: the image names no base (no io.verlbox.base label), so its layers are not the lock's"]
    if base_layers is None:
        unheld = f"layers: base {base} is not on this engine, so the image's layers cannot be held to the lock's"
        return [*found, unheld]
    if layers[: len(base_layers)] != base_layers:
        return [*found, f"layers: the image is not built on this engine's {base}, so its layers are not the lock's"]
    for number, (want, have) in enumerate(zip_longest(locked.layers, layers[len(base_layers) :]), 1):
        if want is None:
            found.append(f"layer {number} above the base: {have[:19]}, which the lock does not list")
        elif have != want.diff_id:
            found.append(
                f"layer {number} above the base ({want.step}): {(have or 'absent')[:19]}, lock {want.diff_id[:19]}"
            )
    if found and locked.verlbox != image_source_digest(__version__):
        note = "the lock's layers were recorded with another verlbox source: the layer that installs it differs"
        err.print(f"note: {note}", markup=False)
    return found


def other_source(files: Mapping[str, str]) -> str | None:
    """How the verlbox an image's FILES (a record's lines) carry differs from this verlbox's source, else None."""
    carried = {
        match.group(1): line.rpartition(" sha256:")[2]
        for path, line in files.items()
        if (match := CARRIED.fullmatch(path)) and line.startswith("file ") and "__pycache__/" not in match.group(1)
    }
    if not carried:
        return "no verlbox package"
    source = image_source("")  # only the package's files are compared: the version is the labels'
    for name, digest in sorted(carried.items()):
        data = source.get(f"verlbox/{name}")
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            return f"its verlbox/{name} is not this verlbox's"
    return None


def offline_layers(image: str, lock: Lock, base: str, records: Path) -> LockedLayers:
    """The layers above BASE of IMAGE, an offline build of LOCK that this host recorded (records in the folder
    RECORDS), for the lock. The caller has verified IMAGE."""
    image_id, layers, _ = identity(image)
    record = load_record(record_path(records, image_id))
    if record is None or record.layers != layers:
        raise UsageError(f"{image}: no record of its build on this host ({records}): build it here, offline")
    if not any(record.steps) or not record.config:  # recorded by an older verlbox, which kept neither: read again
        record = read_image(image)
        write_record(records, record)
    if differing := other_source(record.files):
        raise UsageError(
            f"{image} carries another verlbox than this one ({differing}): the layer that installs it would match no "
            "image this verlbox builds; build it offline with this verlbox"
        )
    if not any(step.startswith("RUN ") and OFFLINE_STEP in step for step in record.steps):
        raise UsageError(
            f"{image} is not an offline build (its history runs no `{OFFLINE_STEP.strip()}` step): an online build "
            "does not repeat to the byte, so its layers would match no other build; build it from a bundle "
            "(verlbox build RECIPE --offline BUNDLE)"
        )
    if lock.source_date_epoch is not None and (created := image_created(image)) != lock.source_date_epoch:
        raise UsageError(
            f"{image} was made at {created}, not at the lock's source_date_epoch {lock.source_date_epoch}: "
            "not an offline build of this lock"
        )
    base_layers = layers_of(base)
    if base_layers is None:
        raise UsageError(f"{image}'s base {base} is not on this engine: its layers cannot be told from the base's")
    if layers[: len(base_layers)] != base_layers:
        raise UsageError(f"{image} is not built on this engine's {base}: build it offline on the lock's base")
    steps = record.steps if len(record.steps) == len(layers) else [""] * len(layers)
    made = zip(layers[len(base_layers) :], steps[len(base_layers) :], strict=True)
    locked = [LockedLayer(diff_id=diff_id, step=step) for diff_id, step in made]
    config = config_digest(runtime_config(image))
    return LockedLayers(verlbox=image_source_digest(__version__), layers=locked, config=config)
