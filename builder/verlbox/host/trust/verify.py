"""`verlbox verify IMAGE`: a built image against its recipe and lock, one line per difference.

Compared: the recipe hash, patch set hash and lock hash the image's labels carry; every Python
distribution and version installed (pip's own view inside the image) against the lock; every locked
Debian package's installed version, and any Debian package the lock does not list (over a
bootstrapped base, whose packages it lists); the recipe the image was built from; the base's identity
(registry digest, or for a local base its package list); Apex's recorded source commit against the
recipe, and its wheel's sha256 against the lock's (Apex compiles to the same bytes from the same plan,
archive and toolchain, so a built image and one built from a bundle are held to the same wheel); and every
file verlbox placed (the patched verl, its own runtime) against the hashes the build recorded (placed.py):
the lock alone cannot see a file swapped inside an installed package. And the bytes (runtime/checks/integrity.py):
every installed Python distribution's files against its RECORD, each RECORD against the one the build recorded,
every file of site-packages owned by some RECORD (bytecode by its source), and Debian's files by `dpkg --verify`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name
from rich.console import Console

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.plan import BuildPlan
from verlbox.host.clients.engine import require_cli
from verlbox.host.recipes.lock import Lock, base_identity, read_lock
from verlbox.host.recipes.recipe import RecipeHead
from verlbox.runtime.checks import integrity

# installed from the build context or compiled in the build, never from an index: checked otherwise
NOT_FROM_AN_INDEX = {"verlbox", "apex"}

err = Console(stderr=True, highlight=False, soft_wrap=True)

# Run with `python -I -S`: the byte check (this verlbox's integrity.py, sent as text, not the image's copy) goes
# first, before `site` runs any .pth that could hide itself or patch what the check calls; then site, for the rest.
_PROBE = """
import json, subprocess, sys, types
integrity = types.ModuleType("verlbox_integrity")
sys.modules[integrity.__name__] = integrity
exec(compile(INTEGRITY, "integrity.py", "exec"), integrity.__dict__)
held = integrity.check()
import site
site.main()
import importlib.metadata as m
from pathlib import Path
pip = {d.metadata["Name"]: d.version for d in m.distributions()}
apt = subprocess.run(["dpkg-query", "-W", "-f", "${Package}=${Version}\\\\n"], capture_output=True, text=True).stdout
try:
    apex = json.loads(m.distribution("apex").read_text("verlbox-source.json") or "{}").get("commit")
except m.PackageNotFoundError:
    apex = None
records = sorted(Path("/opt/verlbox/build-record/compiled").glob("*.json"))
compiled = {p.stem: json.loads(p.read_text()) for p in records}
try:
    from verlbox.runtime.steps.placed import changed_since_build
    placed = changed_since_build()
except ImportError:
    placed = ["no verlbox runtime in the image to check what it placed"]
held = {"differences": held.differences, "notes": held.notes}
print(json.dumps({"pip": pip, "apt": apt.split(), "apex": apex, "compiled": compiled, "placed": placed, "bytes": held}))
"""


def _probe() -> str:
    return f"INTEGRITY = {Path(integrity.__file__).read_text()!r}\n{_PROBE}"


def _inspect(image: str) -> dict:
    run = subprocess.run(
        [require_cli(), "run", "--rm", "--entrypoint", "python", image, "-I", "-S", "-c", _probe()],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise UsageError(f"{image}: cannot look inside ({run.stderr.strip()[-500:]})")
    return json.loads(run.stdout)


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


def differences(recipe: RecipeHead, image: str, labels: dict[str, str]) -> list[str]:
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
    inside = _inspect(image)
    pip_installed = {canonicalize_name(name): version for name, version in inside["pip"].items()}
    pip_locked = {canonicalize_name(name): version for name, version in lock.packages("pip").items()}
    found += _compare("python", pip_locked, pip_installed)
    unlocked = sorted(set(pip_installed) - set(pip_locked) - NOT_FROM_AN_INDEX)
    found += [f"python {name}: image {pip_installed[name]}, not in the lock" for name in unlocked]
    apt_installed = dict(line.split("=", 1) for line in inside["apt"])
    found += _compare("debian", lock.packages("apt"), apt_installed)
    if lock.base.packages is not None:  # a registry base's own packages are not listed: nothing to hold them to
        known = {pin.partition("=")[0] for pin in lock.base.packages} | set(lock.packages("apt"))
        unlisted = sorted(set(apt_installed) - known)
        found += [f"debian {name}: image {apt_installed[name]}, not in the lock" for name in unlisted]
    apex = getattr(recipe, "apex", None)
    if apex and inside["apex"] != apex.commit:
        found.append(f"apex: image built from {inside['apex'] or 'an unrecorded source'}, recipe pins {apex.commit}")
    found += _base_differences(lock, labels.get("io.verlbox.base"))
    found += [f"placed file {line}" for line in inside.get("placed", [])]  # the patched verl, verlbox's runtime
    held = inside["bytes"]
    for note in held.get("notes", []):  # what an image of an older verlbox cannot show: said, not failed
        err.print(f"note: {note}", markup=False)
    return found + _compiled_differences(lock, inside.get("compiled", {})) + held.get("differences", [])


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
