"""`verlbox verify IMAGE`: a built image against its recipe and lock, one line per difference. Nothing of the image
runs: it is read from outside (its saved layers, image_files.py) by this verlbox and held to what lives outside it.

Compared: the recipe hash, patch set hash and lock hash the image's labels carry; every Python distribution and
version in the venv (read from their METADATA) against the lock; every locked Debian package's version (dpkg's
status), and any Debian package the lock does not list (over a bootstrapped base, whose packages it lists); the
recipe the image was built from; the base's identity (registry digest, or for a local base its package list);
Apex's recorded source commit against the recipe, and its wheel's sha256 against the lock's (Apex compiles to
the same bytes from the same plan, archive and toolchain, so a built image and one built from a bundle are held
to the same wheel). And every file: the image's paths against the record `verlbox build` wrote on this host
(built.py). An image whose layers' diff IDs are those of its own record is that build's image, and nothing is
read; any other image of the recipe is read whole and held to the closest recorded build, each path that differs
named in one line; an image of a recipe no build here recorded is one line too, since nothing can vouch for its
files. Where the lock names the layers of its offline build (layers.py), an image with exactly those layers over
the engine's base is that build's image, wherever it was built: nothing is read, and its versions are the lock's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from rich.console import Console

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.plan import BuildPlan
from verlbox.host.recipes.lock import Lock, LockedLayers, base_identity, read_lock
from verlbox.host.recipes.recipe import RecipeHead
from verlbox.host.trust.built import (
    Facts,
    Record,
    config_differences,
    config_digest,
    identity,
    load_record,
    read_image,
    record_path,
    records_of,
    runtime_config,
)
from verlbox.host.trust.image_files import file_differences
from verlbox.host.trust.layers import layer_differences, layers_of

# installed from the build context or compiled in the build, never from an index: checked otherwise
NOT_FROM_AN_INDEX = {"verlbox", "apex"}

err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Held:
    """An image held to the builds recorded on this host or to the lock's layers: what it says of itself (None: it
    is the lock's own offline build, layer for layer, whose facts were held to the lock when they were recorded),
    and its paths or layers that differ."""

    facts: Facts | None
    differences: list[str]


def held_to_build(
    reference: str, recipe: str, records: Path, locked: LockedLayers | None = None, base: str | None = None
) -> Held:
    """REFERENCE (an image of RECIPE, built on the engine's image BASE) against the records in the folder RECORDS,
    else against the LOCKED layers of its lock."""
    image, layers, _ = identity(reference)
    own = load_record(record_path(records, image))
    # the engine names each layer by the sha256 of its bytes: the same diff IDs are the same files, unread
    if own is not None and own.recipe == recipe and own.layers == layers:
        return Held(own.facts, [])
    base_layers = layers_of(base) if locked else None
    config = config_digest(runtime_config(reference))
    if locked and base_layers is not None and layers == base_layers + locked.diff_ids and config == locked.config:
        return Held(None, [])
    now = read_image(reference)
    built = records_of(records, recipe)
    if not built:
        by_layer = layer_differences(locked, base, base_layers, layers, config) if locked else []
        unvouched = (
            f"image {image[:19]}: no build of recipe {recipe} is recorded on this host ({records}), so nothing "
            f"vouches for its files: build it here (verlbox build {recipe})"
        )
        return Held(now.facts, [*by_layer, unvouched])
    found, closest = min(((_differences(record, now), record) for record in built), key=_fewest)
    if found:
        err.print(f"note: {reference}'s files are held to the build of {closest.image[:19]}", markup=False)
    return Held(now.facts, found)


def _differences(built: Record, now: Record) -> list[str]:
    """Each path, and each part of what a container runs with, that differs between the BUILT record and NOW (a
    record before 2026-12-06 kept no config: its files only)."""
    config = config_differences(built.config, now.config) if built.config else []
    return file_differences(built.files, now.files) + config


def _fewest(pair: tuple[list[str], Record]) -> int:
    return len(pair[0])


def _compare(kind: str, locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    found = []
    for name, version in sorted(locked.items()):
        have = installed.get(name)
        if have != version:
            found.append(f"{kind} {name}: lock {version}, image {have or 'absent'}")
    return found


def other_recipe(recipe: str, image: str, labels: dict[str, str]) -> str | None:
    """Why IMAGE is not an image of RECIPE (its labels name another recipe, or none), else None."""
    built_from = labels.get("io.verlbox.recipe")
    if built_from == recipe:
        return None
    if not built_from:
        return f"{image} is not a verlbox image (no io.verlbox.recipe label), so not one of recipe {recipe}"
    return f"{image} was built from recipe {built_from}, not {recipe}: name recipe {built_from} instead"


# what each hash label stands for, in a sentence
HASH_LABELS = {
    "io.verlbox.recipe.hash": "recipe",
    "io.verlbox.verl-patch-set.hash": "verl patch set",
    "io.verlbox.lock.hash": "lock",
}


def label_differences(recipe: RecipeHead, lock: Lock | None, labels: Mapping[str, str]) -> dict[str, str]:
    """The hash labels (HASH_LABELS) an image carries that differ from this verlbox's RECIPE, verl patch set and
    LOCK (none: not compared), each with the value expected: enough to tell an image of another version of any
    of them without running it."""
    expected = {
        "io.verlbox.recipe.hash": recipe.content_hash,
        "io.verlbox.verl-patch-set.hash": BuildPlan(recipe).patch_set_hash,
    } | ({"io.verlbox.lock.hash": lock.content_hash} if lock else {})
    return {label: value for label, value in expected.items() if labels.get(label) != value}


def differences(recipe: RecipeHead, image: str, labels: dict[str, str], records: Path) -> list[str]:
    """Every way IMAGE differs from RECIPE, its lock and the builds recorded in the folder RECORDS, a line each."""
    if mismatch := other_recipe(recipe.name, image, labels):  # every other line would only follow from it
        return [mismatch]
    if recipe.lock_path is None or not recipe.lock_path.is_file():
        raise UsageError(f"recipe {recipe.name} has no lock ({recipe.lock_path}): run `verlbox lock` first")
    lock: Lock = read_lock(recipe.lock_path, recipe)
    found = [
        f"label {label}: image {labels.get(label) or 'absent'}, expected {value}"
        for label, value in label_differences(recipe, lock, labels).items()
    ]
    if lock.recipe_hash != recipe.content_hash:
        found.append(
            f"lock {recipe.lock_path.name} was made for recipe hash {lock.recipe_hash[:12]}: run `verlbox lock`"
        )
    base = _base_differences(lock, labels.get("io.verlbox.base"))
    held = held_to_build(image, recipe.name, records, lock.layers, labels.get("io.verlbox.base"))
    if held.facts is None:  # the lock's own layers: its versions are the lock's
        return found + base
    pip_locked = {canonicalize_name(name): version for name, version in lock.packages("pip").items()}
    found += _compare("python", pip_locked, held.facts.pip)
    unlocked = sorted(set(held.facts.pip) - set(pip_locked) - NOT_FROM_AN_INDEX)
    found += [f"python {name}: image {held.facts.pip[name]}, not in the lock" for name in unlocked]
    found += _compare("debian", lock.packages("apt"), held.facts.apt)
    if lock.base.packages is not None:  # a registry base's own packages are not listed: nothing to hold them to
        known = {pin.partition("=")[0] for pin in lock.base.packages} | set(lock.packages("apt"))
        unlisted = sorted(set(held.facts.apt) - known)
        found += [f"debian {name}: image {held.facts.apt[name]}, not in the lock" for name in unlisted]
    apex = getattr(recipe, "apex", None)
    if apex and held.facts.apex != apex.commit:
        found.append(f"apex: image built from {held.facts.apex or 'an unrecorded source'}, recipe pins {apex.commit}")
    return found + base + _compiled_differences(lock, held.facts.compiled) + held.differences


# the same plan, archive and toolchain compiled the lock's bytes in every clean build but one measured
# (docs/benchmarks.md): a differing wheel is named, with what can cause it
_RECOMPILED = (
    " (not the lock's compile: another source, plan or toolchain, a compile that did not repeat, or a swapped file)"
)


def _compiled_differences(lock: Lock, inside: dict[str, list[dict[str, str]]]) -> list[str]:
    found = []
    for block, entries in sorted(lock.compiled.items()):
        pinned = {entry.file: entry.sha256 for entry in entries}
        have = {entry["file"]: entry["sha256"] for entry in inside.get(block, [])}
        for name in sorted(set(pinned) | set(have)):
            if pinned.get(name) != have.get(name):
                locked, built = pinned.get(name) or "absent", have.get(name) or "absent"
                found.append(f"{block} wheel {name}: lock {locked}, image {built}{_RECOMPILED}")
    return found


def _base_differences(lock: Lock, reference: str | None) -> list[str]:
    if not reference:
        return ["label io.verlbox.base: absent (built by an older verlbox)"]
    try:
        current = base_identity(reference)
    except VerlboxError as exc:  # the base may be gone from this engine: say so, it is not a match
        return [f"base {reference}: not on this engine, cannot compare ({exc})"]
    if lock.base.digest:
        return (
            []
            if current.get("digest") == lock.base.digest
            else [f"base {reference}: digest {current.get('digest')}, lock {lock.base.digest}"]
        )
    # a local base (debootstrap) differs in file times from run to run: its packages and files are its identity
    locked, have = set(lock.base.packages or []), set(current.get("packages", []))
    tree = current.get("tree")
    return (
        [f"base package {line}: lock only" for line in sorted(locked - have)]
        + [f"base package {line}: base only" for line in sorted(have - locked)]
        + (
            [f"base {reference}: files (tree) {tree}, lock {lock.base.tree}"]
            if lock.base.tree not in (None, tree)
            else []
        )
    )
