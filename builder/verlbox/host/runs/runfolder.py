"""`verlbox init [DIR]`: a run folder for `docker compose up train`, for a user who `pip install`ed verlbox.

It holds the shipped compose.yaml, a .env rendered from the shipped .env.example (the caller's uid/gid,
the image the last `verlbox build` made, else the newest verlbox image on this engine that this verlbox's
recipes made, the GPU count nvidia-smi lists)
and the folders compose binds, made by the caller so that they are the caller's (compose binds them with
create_host_path: false).

Re-running it never loses an edit: a file equal to what init writes now is left alone, one init wrote
and nobody changed since is updated, and any other is refused (exit 2) unless --force, which keeps the
old file as NAME.bak. Every file is checked before anything is written. What init wrote is told apart
from an edit by the sha256 of every text it wrote there, kept in RECORD.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import docker
from rich.console import Console

from verlbox import paths
from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.host.building.plan import from_users_recipe
from verlbox.host.building.staging import REPOSITORY as STAGING_REPOSITORY
from verlbox.host.clients.engine import EngineError, client
from verlbox.host.clients.reference import parse_reference
from verlbox.host.recipes.lock import Lock, read_lock
from verlbox.host.recipes.recipe import RecipeHead, load_recipe, recipe_names
from verlbox.host.runs.remembered import last_build, remember_run_folder
from verlbox.host.trust.verify import HASH_LABELS, label_differences
from verlbox.run_folder import INIT_RECORD, unfit_for_run_folder

err = Console(stderr=True, highlight=False, soft_wrap=True)

RECIPE_LABEL = "io.verlbox.recipe"
CUDA_LABEL = "io.verlbox.pin.cuda"
FOLDERS = ("models", "data", "checkpoints", "hf-cache")
RECORD = INIT_RECORD
NVIDIA_SMI_TIMEOUT_S = 30
# the .env may come to hold HF_TOKEN
ENV_MODE = 0o600

ENV_HEADER = """\
# Written by `verlbox init` for compose.yaml beside it; edit freely: `verlbox init` again keeps a
# changed file (--force replaces it and keeps yours as .env.bak). Every key is documented below.
"""


@dataclass(frozen=True)
class Planned:
    """One file of the run folder: its new text, and what writing it does to the one there."""

    name: str
    text: str
    # keep: already this text; update: init's own text, unchanged since; replace: edited, and --force given
    action: Literal["create", "keep", "update", "replace"]


def init(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if problem := unfit_for_run_folder(directory):
        raise UsageError(problem)
    template = paths.env_example_file().read_text()
    previous = dotenv_values(directory / ".env")
    notes: list[str] = []
    image = _image(args.image, previous, notes)
    gpus, gpu_problem = gpu_count()
    if gpu_problem:
        notes.append(f"{gpu_problem}: VERLBOX_GPUS=1 (set it in .env)")
    elif note := driver_note(image):
        notes.append(note)
    uid, gid = caller(os.environ)
    settings = {"VERLBOX_IMAGE": image, "VERLBOX_UID": str(uid), "VERLBOX_GID": str(gid), "VERLBOX_GPUS": str(gpus)}
    texts = {"compose.yaml": paths.compose_file().read_text(), ".env": render_env(template, settings)}
    plan = plan_files(directory, texts, force=args.force)
    new_folder = not directory.exists()
    backups, made = write_run_folder(directory, plan)
    if problem := remember_run_folder(directory):
        notes.append(problem)
    if (uid, gid) != (os.getuid(), os.getgid()):
        written = [planned.name for planned in plan if planned.action != "keep"]
        kept = [backup.name for backup in backups]
        give_to(directory, [*(["."] if new_folder else []), *made, RECORD, *written, *kept], uid, gid)
    for note in notes:
        err.print(f"note: {note}", markup=False)
    err.print(_summary(directory, plan, backups, made, settings), markup=False)
    here = directory.resolve() == Path.cwd().resolve()
    err.print(f"next: {'' if here else f'cd {shlex.quote(str(directory))} && '}docker compose up train", markup=False)
    return 0


def caller(environ: Mapping[str, str]) -> tuple[int, int]:
    """Who the run folder is for: the user behind `sudo` (SUDO_UID/SUDO_GID, when root runs this through
    it), else this process's user. A container running as root would leave root's files in the folders."""
    if os.getuid() == 0 and environ.get("SUDO_UID", "").isdigit() and environ.get("SUDO_GID", "").isdigit():
        return int(environ["SUDO_UID"]), int(environ["SUDO_GID"])
    return os.getuid(), os.getgid()


def give_to(directory: Path, names: list[str], uid: int, gid: int) -> None:
    """NAMES in the run folder (`.`: the folder itself), owned by UID:GID (root running through sudo)."""
    for path in (directory / name for name in names):
        if path.exists() or path.is_symlink():
            os.chown(path, uid, gid, follow_symlinks=False)  # a link swapped in never hands over its target


def _image(requested: str | None, previous: dict[str, str], notes: list[str]) -> str:
    """--image, else the image the folder's .env already names (a rerun never switches a run's image behind
    its back), else the one the last `verlbox build` made, while the engine still holds it under its tag,
    else the newest verlbox image here (of this verlbox's recipes when there is one). compose.yaml
    never pulls (pull_policy: never): an image the engine lacks is named only on purpose (--image, or a kept
    .env), with a note; a new folder with no image found is refused, so that no default name is ever run."""
    if requested is not None:
        try:
            parse_reference(requested)
        except ValueError as exc:
            raise UsageError(f"--image {exc}") from None
        if (kept := previous.get("VERLBOX_IMAGE")) and kept != requested:
            notes.append(f"VERLBOX_IMAGE={requested}, in place of {kept}")
        if not engine_has(requested):
            notes.append(
                f"{requested} is not on this Docker engine, and compose never pulls: `docker pull` it or build it"
            )
        return requested
    if kept := previous.get("VERLBOX_IMAGE"):
        said = "" if engine_has(kept) else ", though it is not on this Docker engine (build it or `docker pull` it)"
        notes.append(f"VERLBOX_IMAGE={kept} kept from .env{said}; --image REF takes another")
        return kept
    if built := last_build_here():
        notes.append(f"VERLBOX_IMAGE={built}, the image the last `verlbox build` made; --image REF takes another")
        return built
    try:
        found = verlbox_images()
    except VerlboxError as exc:
        problem, advice = str(exc), "so init cannot find your image: name one with --image"
    else:
        if found:
            return newest_current(found, notes)
        problem = "no verlbox image on this Docker engine"
        advice = "build one first (`verlbox doctor` says which recipe fits), or name one with --image"
    raise UsageError(f"{problem}: {advice}")


def last_build_here() -> str | None:
    """The tag the last `verlbox build` gave, while the engine holds the image that build made under it."""
    if (built := last_build()) is None:
        return None
    tag, image_id = built
    try:
        return tag if client().images.get(tag).id == image_id else None
    except (docker.errors.DockerException, EngineError):  # gone, retagged by another build, or no engine
        return None


def newest_current(found: list[FoundImage], notes: list[str]) -> str:
    """The newest current image of FOUND (newest first): built from this verlbox's own recipe, verl patch set
    and lock, or from a recipe it does not ship (a user's own file named like a shipped one included: its
    origin label says `user`). One built from another version of them (an older verlbox's
    build, say) only when there is no other, and never without a note naming it."""
    stale = {image.tag: reason for image in found if (reason := out_of_date(image.labels))}
    tags = [image.tag for image in found]
    chosen = next((tag for tag in tags if tag not in stale), tags[0])
    newer, others = tags[: tags.index(chosen)], tags[tags.index(chosen) + 1 :]
    also = (f"Also here: {', '.join(others)}; " if others else "") + "--image REF takes another."
    if chosen in stale:
        recipe = found[0].labels[RECIPE_LABEL]
        verify = f"; `verlbox verify {chosen}` lists what differs" if _shipped(paths.recipes_dir(), recipe)[1] else ""
        notes.append(
            f"VERLBOX_IMAGE={chosen}, the newest verlbox image here, was built from {stale[chosen]}. Rebuild it "
            f"(`verlbox build {recipe}`) for a current one{verify}. {also}"
        )
    elif newer:
        passed_over = "; ".join(f"{tag}, built from {stale[tag]}" for tag in newer)
        notes.append(
            f"VERLBOX_IMAGE={chosen}, the newest verlbox image that is current. Passed over, though newer: "
            f"{passed_over}. {also}"
        )
    elif others:
        notes.append(f"VERLBOX_IMAGE={chosen}, the newest verlbox image here. {also}")
    return chosen


def out_of_date(labels: Mapping[str, str]) -> str | None:
    """What an image with LABELS was built from, when it is not what this verlbox builds from the shipped
    recipe it names; None when it is, or when it was built from a user's file (one named like a shipped
    recipe included) or names no shipped recipe: nothing here to hold it to."""
    name, recipes = labels.get(RECIPE_LABEL, ""), paths.recipes_dir()
    if from_users_recipe(labels) or name not in recipe_names(recipes):
        return None
    changed = label_differences(*_shipped(recipes, name), labels)
    if not changed:
        return None
    words = [HASH_LABELS[label] for label in changed]
    parts = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
    return f"another version of {name}'s {parts} than this verlbox's (labels {', '.join(changed)})"


@functools.cache
def _shipped(recipes: Path, name: str) -> tuple[RecipeHead, Lock | None]:
    """Recipe NAME of the folder RECIPES and its lock; a lock that cannot be read or was made for another
    version of the recipe (a checkout whose recipe was edited, not locked again) is held against no image."""
    recipe = load_recipe(recipes / f"{name}.yaml")
    try:
        lock = read_lock(recipe.lock_path, recipe) if recipe.lock_path and recipe.lock_path.is_file() else None
    except VerlboxError:
        return recipe, None
    return recipe, lock if lock and lock.recipe_hash == recipe.content_hash else None


def driver_note(image: str) -> str | None:
    """What doctor would say of this host's driver and IMAGE's CUDA (its io.verlbox.pin.cuda label), when
    the driver is too old for it or runs it only through CUDA's minor-version compatibility; else nothing."""
    from verlbox.host.runs.doctor import GpuQueryError, driver_support, query_gpus
    from verlbox.runtime.gpu import CUDA_MIN_DRIVER

    try:
        cuda = (client().images.get(image).labels or {}).get(CUDA_LABEL)
        drivers = sorted({gpu.driver for gpu in query_gpus()})
    except (docker.errors.DockerException, EngineError, GpuQueryError):
        return None  # no image to read, or no driver to ask: nothing to compare (gpu_count said why)
    if cuda not in CUDA_MIN_DRIVER or len(drivers) != 1:  # no floor known, or GPUs that disagree: doctor says
        return None
    runs, said = driver_support(drivers[0], cuda)
    if runs and not said:
        return None
    if runs:
        return f"driver {drivers[0]} runs {image}'s CUDA {cuda} {said}"
    return (
        f"driver {drivers[0]} cannot run {image}'s CUDA {cuda} ({said}): train's preflight will stop there; "
        "`verlbox doctor` names the recipes this driver runs"
    )


def engine_has(image: str) -> bool:
    """Whether the engine holds IMAGE; True when no engine answers (nothing to compare with, said elsewhere)."""
    try:
        client().images.get(image)
    except docker.errors.ImageNotFound:
        return False
    except (docker.errors.DockerException, EngineError):
        return True
    return True


@dataclass(frozen=True)
class FoundImage:
    """A tag of an image `verlbox build` made, with the image's labels."""

    tag: str
    labels: dict[str, str]


def verlbox_images() -> list[FoundImage]:
    """The tagged images on the engine that `verlbox build` made (they carry the recipe label), newest first."""
    try:
        listed = client().api.images(filters={"label": RECIPE_LABEL})
    except docker.errors.DockerException as exc:
        raise EngineError(f"cannot list the engine's images ({exc})") from None
    return newest_first(listed)


def newest_first(listed: list[dict]) -> list[FoundImage]:
    """From the engine's image list (`Created` in seconds, `RepoTags`, `Labels`): newest first, then by name.

    A staging tag names an image until its build succeeds, never one to train with; `<none>:<none>` is
    how older engines spell an untagged image.
    """
    candidates = [
        (-image["Created"], tag, image.get("Labels") or {})
        for image in listed
        for tag in image.get("RepoTags") or []
        if not tag.startswith(f"{STAGING_REPOSITORY}/") and tag != "<none>:<none>"
    ]
    return [FoundImage(tag, labels) for _, tag, labels in sorted(candidates, key=lambda found: found[:2])]


def gpu_count() -> tuple[int, str | None]:
    """The GPUs `nvidia-smi -L` lists, or 1 and why it could not tell."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        return 1, "no nvidia-smi on PATH"
    except subprocess.TimeoutExpired:
        return 1, f"nvidia-smi -L gave no answer in {NVIDIA_SMI_TIMEOUT_S} s"
    if listing.returncode != 0:
        said = (listing.stderr or listing.stdout).strip().splitlines()
        return 1, f"nvidia-smi -L failed ({said[-1] if said else f'exit {listing.returncode}'})"
    # MIG devices are indented lines under their GPU: one container reservation per physical GPU
    count = sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    return (count, None) if count else (1, "nvidia-smi -L lists no GPU")


def render_env(template: str, settings: dict[str, str]) -> str:
    """.env.example with init's header and values: the two files document the same keys the same way.

    The template's header is everything before its first blank line.
    """
    _, _, body = template.partition("\n\n")
    lines = []
    for line in body.splitlines(keepends=True):
        key = line.split("=", 1)[0]
        lines.append(f"{key}={settings[key]}\n" if "=" in line and key in settings else line)
    return ENV_HEADER + "\n" + "".join(lines)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_record(directory: Path) -> dict[str, list[str]]:
    """The hashes of every text init wrote to each file; a missing or unreadable record knows none."""
    try:
        record = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {name: hashes for name, hashes in record.items() if isinstance(hashes, list)}


def plan_files(directory: Path, texts: dict[str, str], force: bool) -> list[Planned]:
    """What writing each file does; refuses (before anything is written) a path that cannot be used or an edit."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} exists and is not a folder")
    for folder in FOLDERS:
        if (directory / folder).exists() and not (directory / folder).is_dir():
            raise UsageError(f"{directory / folder} exists and is not a folder; compose binds a folder there")
    record = read_record(directory)
    plan, edited, foreign = [], [], []
    for name, text in texts.items():
        path = directory / name
        if not path.exists():
            plan.append(Planned(name, text, "create"))
            continue
        if not path.is_file():
            raise UsageError(f"{path} exists and is not a file")
        try:
            there = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if there == text.encode():
            plan.append(Planned(name, text, "keep"))
        elif _sha256(there) in record.get(name, []):
            plan.append(Planned(name, text, "update"))
        else:
            plan.append(Planned(name, text, "replace"))
            (edited if name in record else foreign).append(str(path))
    if (edited or foreign) and not force:
        said = []
        if foreign:  # a user's own file where init would write: init never wrote it, so it was never "changed"
            said.append(
                f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not verlbox's (init never wrote it)"
            )
        if edited:
            them = "it" if len(edited) == 1 else "them"
            said.append(f"{', '.join(edited)} changed since `verlbox init` wrote {them}")
        backups = ", ".join(Path(path).name + ".bak" for path in edited + foreign)
        them = "it" if len(edited + foreign) == 1 else "them"
        raise UsageError(f"{'; '.join(said)}; nothing written (--force replaces {them} and keeps yours as {backups})")
    return plan


def _backup_path(path: Path) -> Path:
    """NAME.bak, or the first free NAME.bak.N: an older backup is the user's too."""
    candidate, number = path.with_name(f"{path.name}.bak"), 1
    while candidate.exists() or candidate.is_symlink():
        number += 1
        candidate = path.with_name(f"{path.name}.bak.{number}")
    return candidate


def write_run_folder(directory: Path, plan: list[Planned]) -> tuple[list[Path], list[str]]:
    """Writes the plan: the record first, so a crash between files still knows every text init wrote.

    Returns the backups made and the folders made.
    """
    made = [folder for folder in FOLDERS if not (directory / folder).is_dir()]
    try:
        for folder in made:
            (directory / folder).mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"{directory}: cannot make the run folder ({exc.strerror or exc})") from None
    record = read_record(directory)
    known = json.dumps(record, sort_keys=True)
    for planned in plan:
        hashes = record.setdefault(planned.name, [])
        if (digest := _sha256(planned.text.encode())) not in hashes:
            hashes.append(digest)
    if json.dumps(record, sort_keys=True) != known:
        write_atomically(directory / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
    backups = []
    for planned in plan:
        path = directory / planned.name
        if planned.action == "replace":
            backups.append(_backup_path(path))
            try:
                shutil.copy2(path, backups[-1])
            except OSError as exc:
                raise UsageError(f"{backups[-1]}: cannot keep {path.name} there ({exc.strerror or exc})") from None
        if planned.action != "keep":
            new_env = planned.name == ".env" and planned.action == "create"
            write_atomically(path, planned.text, mode=ENV_MODE if new_env else None)
    return backups, made


def _summary(
    directory: Path, plan: list[Planned], backups: list[Path], made: list[str], settings: dict[str, str]
) -> str:
    written = [planned.name for planned in plan if planned.action != "keep"]
    done = f"wrote {', '.join(written)}" if written else "compose.yaml and .env up to date"
    if backups:
        done += f" (yours kept as {', '.join(path.name for path in backups)})"
    if made:
        done += f", made {', '.join(f'{folder}/' for folder in made)}"
    gpus = settings["VERLBOX_GPUS"]
    return (
        f"{directory}: {done}; image {settings['VERLBOX_IMAGE']}, {gpus} GPU{'' if gpus == '1' else 's'}, "
        f"user {settings['VERLBOX_UID']}:{settings['VERLBOX_GID']}"
    )
