"""`verlbox clean`: find, and with --yes remove, only what verlbox itself made and left behind.

What counts as verlbox's, and nothing else:
- the logs failed builds kept (`build.log_directory()`) and the source-archive cache (Apex's, fetched by
  hash into `sources.default_archive_dir()`; a folder VERLBOX_SOURCES names is the user's and stays);
- staging tags (`verlbox-build/...`), which a build's process gives its image until it succeeds: a killed
  build leaves one. A tag whose build still runs here is kept; one made on another host or in another PID
  namespace cannot be judged and goes (clean while no build runs there);
- images with verlbox's recipe label that no tag names (a rebuild moved their tag);
- BuildKit cache mounts verlbox's build steps made: an id of verlbox's own (`verlbox-...`, the
  templates' `verlbox-locked-files`), or pip's and uv's caches first made by a command of verlbox's build
  steps. Their layer records are kept (a rebuild reuses them); --all-build-cache prunes every record not in
  use, other projects' too, as `docker buildx prune --all` does;
- with --images, the tagged verlbox images too, but never one a run folder's .env names (this folder's,
  --run DIR's, any `verlbox init` made, or that of any compose project with a container on the engine) or
  a container uses.

A file some process holds open (a running build's log, a fetch's partial archive) is kept. The default is a
dry run that lists each thing and its size; --yes removes them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
from rich.console import Console
from rich.table import Table

from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.build import log_directory
from verlbox.host.building.sources import default_archive_dir
from verlbox.host.building.staging import REPOSITORY as STAGING_REPOSITORY

# the tag grammar and the judgement of a build's process are staging's own
from verlbox.host.building.staging import build_process, build_running
from verlbox.host.clients.engine import EngineError, client, untag
from verlbox.host.runs.remembered import RUN_FOLDERS, run_folders, state_dir
from verlbox.host.runs.runfolder import RECIPE_LABEL, newest_first

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)
err = Console(stderr=True, highlight=False, soft_wrap=True)

LOG, SOURCE, STAGING, UNTAGGED, CACHE_MOUNT, BUILD_CACHE, IMAGE = (
    "build log",
    "source archive",
    "staging tag",
    "untagged image",
    "cache mount",
    "build cache",
    "image",
)
# BuildKit's description of a cache mount: `cached mount TARGET from exec COMMAND with id "/ID"`
CACHE_MOUNT_TYPE = "exec.cachemount"
OUR_CACHE_ID_PREFIX = "verlbox-"  # host/building/templates/_macros.j2: id=verlbox-locked-files
OUR_STEPS = "/tmp/verlbox/steps/"  # where every verlbox RUN mounts its build steps (_macros.j2)
COMPOSE_FOLDER_LABEL = "com.docker.compose.project.working_dir"
IMAGE_VARIABLE = "VERLBOX_IMAGE"


@dataclass(frozen=True)
class Leftover:
    kind: str
    name: str  # a path, a tag, an image or a BuildKit record ID: what removal acts on
    size: int  # bytes removing it frees (0: nothing, or another tag keeps the image)
    note: str = ""  # what it is, in a few words
    kept: str = ""  # why it stays, when it does


# --- files ---


def held_open(paths: Iterable[Path]) -> set[Path]:
    """Which of PATHS a process holds open (the ones of this user: a build's log, a fetch's partial file)."""
    wanted = {os.path.realpath(path): path for path in paths}  # as /proc shows them: links resolved
    found = set()
    for descriptors in Path("/proc").glob("[0-9]*/fd"):
        try:
            listed = list(descriptors.iterdir())
        except OSError:  # another user's process, or one that ended meanwhile
            continue
        for descriptor in listed:
            try:
                target = os.readlink(descriptor)
            except OSError:  # closed meanwhile (the listing's own, among them)
                continue
            if target in wanted:
                found.add(wanted[target])
    return found


def file_leftovers(environ: Mapping[str, str]) -> list[Leftover]:
    logs = sorted(log_directory().glob("*.log")) if log_directory().is_dir() else []
    leftovers = [Leftover(LOG, str(path), path.stat().st_size, "kept by a build that failed") for path in logs]
    sources = default_archive_dir(environ)
    if environ.get("VERLBOX_SOURCES"):
        leftovers.append(Leftover(SOURCE, str(sources), 0, kept="VERLBOX_SOURCES names it: your folder"))
    elif sources.is_dir():
        archives = sorted(path for path in sources.iterdir() if path.is_file() and not path.is_symlink())
        note = "fetched again by hash on the next build that needs it"
        leftovers += [Leftover(SOURCE, str(path), path.stat().st_size, note) for path in archives]
    busy = held_open(Path(leftover.name) for leftover in leftovers)
    return [replace(item, kept="a process holds it open") if Path(item.name) in busy else item for item in leftovers]


# --- the engine's images and tags ---


def is_staging(tag: str) -> bool:
    return tag.startswith(f"{STAGING_REPOSITORY}/")


def staging_verdict(tag: str) -> str:
    """Why a staging tag may go, or '' when the build that made it still runs on this host."""
    running = build_running(tag)
    if running is None:
        return "its build cannot be judged from here (another host, container or verlbox version): taken as ended"
    return "" if running else f"its build (process {build_process(tag)}) is gone"


def _in_use(engine: Any) -> dict[str, str]:
    """Image ID -> the name of a container (any state) made from it: the engine would refuse to remove it."""
    return {container["ImageID"]: container["Names"][0].lstrip("/") for container in engine.api.containers(all=True)}


def tag_leftovers(listed: list[dict[str, Any]], used: Mapping[str, str]) -> list[Leftover]:
    """Staging tags and untagged verlbox images, from the engine's whole image list. A tag frees its image's
    space only when it is the image's one tag; the engine refuses to untag an image a container uses."""
    leftovers = []
    for image in listed:
        tags = [tag for tag in image.get("RepoTags") or [] if tag != "<none>:<none>"]
        user = used.get(image["Id"])
        for tag in filter(is_staging, tags):
            why, alone = staging_verdict(tag), tags == [tag]
            kept = "" if why else "its build is still running"
            kept = kept or (f"container {user} uses its image" if user and alone else "")
            leftovers.append(Leftover(STAGING, tag, image["Size"] if alone else 0, why, kept))
        if not tags and RECIPE_LABEL in (image.get("Labels") or {}):
            note = f"recipe {image['Labels'][RECIPE_LABEL]}, no tag names it (a rebuild moved its tag, say)"
            kept = f"container {user} uses it" if user else ""
            leftovers.append(Leftover(UNTAGGED, image["Id"], image["Size"], note, kept))
    return leftovers


def run_folder_images(engine: Any, run: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Image -> which run folder's .env names it: the one here (or --run DIR), those `verlbox init` made (its
    list in the state folder), and those of the compose projects with a container on the engine. A run folder
    made otherwise that never started and is not this one cannot be seen from here."""
    from verlbox.run_folder import find_run_folder

    named: dict[str, str] = {}
    if image := environ.get(IMAGE_VARIABLE):
        named[image] = f"{IMAGE_VARIABLE} in this shell names it"
    if (here := find_run_folder(run)) and (image := here.setting(IMAGE_VARIABLE)):
        named.setdefault(image, f"run folder {here.path}'s .env names it")
    containers = engine.api.containers(all=True, filters={"label": COMPOSE_FOLDER_LABEL})
    compose_folders = [Path(container["Labels"][COMPOSE_FOLDER_LABEL]) for container in containers]
    for folder in [*run_folders(environ), *compose_folders]:
        try:
            image = dotenv_values(folder / ".env").get(IMAGE_VARIABLE)
        except VerlboxError:  # a .env compose would refuse too: it names nothing
            continue
        if image:
            named.setdefault(image, f"run folder {folder}'s .env names it")
    return {(name if ":" in name.rpartition("/")[2] else f"{name}:latest"): why for name, why in named.items()}


def image_leftovers(listed: list[dict[str, Any]], used: Mapping[str, str], named: Mapping[str, str]) -> list[Leftover]:
    """The tagged verlbox images (--images), newest first. A tag a run folder names is kept (its image with it);
    an image a container uses keeps every tag. An image's space is counted once, on its last tag."""
    by_tag = {tag: image for image in listed for tag in image.get("RepoTags") or []}
    labelled = [image for image in listed if RECIPE_LABEL in (image.get("Labels") or {})]
    tags = [found.tag for found in newest_first(labelled)]  # staging tags left out: tag_leftovers' own
    tags_of: dict[str, list[str]] = {}
    for tag in tags:
        tags_of.setdefault(by_tag[tag]["Id"], []).append(tag)
    staying = {by_tag[tag]["Id"] for tag in named if tag in by_tag} | set(used)
    leftovers = []
    for tag in tags:
        image = by_tag[tag]
        kept = named.get(tag) or (f"container {used[image['Id']]} uses it" if image["Id"] in used else "")
        # the image goes with its last tag when every tag it has is one of these (no staging tag) and none stays
        goes = image["Id"] not in staying and len(image["RepoTags"]) == len(tags_of[image["Id"]])
        size = image["Size"] if goes and tag == tags_of[image["Id"]][-1] else 0
        leftovers.append(Leftover(IMAGE, tag, size, f"recipe {image['Labels'][RECIPE_LABEL]}", kept))
    return leftovers


# --- BuildKit's cache ---


def cache_mount_id(description: str) -> str | None:
    """The id in BuildKit's description of a cache mount (the target path where the Dockerfile gave none)."""
    _, found, tail = description.rpartition(' with id "')
    return tail.removesuffix('"').removeprefix("/") if found and tail.endswith('"') else None


def ours(record: Mapping[str, Any]) -> bool:
    """A cache mount verlbox's build steps made: an id of verlbox's own, or made by a command of its steps."""
    description = record.get("Description") or ""
    if record.get("Type") != CACHE_MOUNT_TYPE or (mount_id := cache_mount_id(description)) is None:
        return False
    command = description.partition(" from exec ")[2].rpartition(' with id "')[0]
    return mount_id.startswith(OUR_CACHE_ID_PREFIX) or OUR_STEPS in command


def cache_leftovers(records: list[dict[str, Any]], everything: bool) -> list[Leftover]:
    if everything:
        idle = [record for record in records if not record.get("InUse")]
        size = sum(record.get("Size") or 0 for record in idle if not record.get("Shared"))
        note = f"every record not in use ({len(idle)}), other projects' too: as `docker buildx prune --all`"
        return [Leftover(BUILD_CACHE, "all", size, note)]
    leftovers = []
    for record in filter(ours, records):
        note = f"cache mount {cache_mount_id(record['Description'])}"
        kept = "a build is using it" if record.get("InUse") else ""
        leftovers.append(Leftover(CACHE_MOUNT, record["ID"], record.get("Size") or 0, note, kept))
    return leftovers


def other_cache_size(records: list[dict[str, Any]]) -> int:
    """What BuildKit holds besides verlbox's cache mounts and could free (layer records, other projects')."""
    return sum(
        record.get("Size") or 0
        for record in records
        if not ours(record) and not record.get("InUse") and not record.get("Shared")
    )


# --- removal ---


def remove(engine: Any, leftover: Leftover) -> int:
    """Remove LEFTOVER; the bytes freed (BuildKit's own count for its records, else the planned size)."""
    if leftover.kind in (LOG, SOURCE):
        Path(leftover.name).unlink(missing_ok=True)
    elif leftover.kind in (STAGING, IMAGE):
        untag(engine, leftover.name)
    elif leftover.kind == UNTAGGED:
        engine.images.remove(leftover.name, noprune=True)
    elif leftover.kind == CACHE_MOUNT:
        return engine.api.prune_builds(filters={"id": f"^{leftover.name}$"}).get("SpaceReclaimed") or 0
    elif leftover.kind == BUILD_CACHE:
        return engine.api.prune_builds(all=True).get("SpaceReclaimed") or 0
    return leftover.size


def remove_all(engine: Any, leftovers: list[Leftover]) -> tuple[int, list[str]]:
    """Every leftover not kept, removed; the bytes freed and one line per one that could not be."""
    freed, failures = 0, []
    for leftover in leftovers:
        if leftover.kept:
            continue
        try:
            freed += remove(engine, leftover)
        except (OSError, docker.errors.DockerException) as exc:
            failures.append(f"{leftover.kind} {leftover.name}: {getattr(exc, 'explanation', None) or exc}")
    return freed, failures


# --- the command ---


def find_leftovers(
    engine: Any, args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> tuple[list[Leftover], int]:
    """Everything clean would act on, and the bytes BuildKit holds beyond it (0 with --all-build-cache)."""
    listed = engine.api.images()
    used = _in_use(engine)
    found = tag_leftovers(listed, used)
    if args.images:
        found += image_leftovers(listed, used, run_folder_images(engine, args.run, environ))
    records = engine.df().get("BuildCache") or []
    found += cache_leftovers(records, args.all_build_cache)
    return found, 0 if args.all_build_cache else other_cache_size(records)


def human_size(size: int) -> str:
    """Decimal units, as `docker image ls` and `docker system df` count."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{size} B"


def print_leftovers(leftovers: list[Leftover]) -> None:
    table = Table("what", "name", "size", "action")
    for item in leftovers:
        action = f"keep: {item.kept}" if item.kept else f"remove: {item.note}" if item.note else "remove"
        table.add_row(item.kind, item.name, human_size(item.size) if item.size else "-", action)
    out.print(table)


def removing_command(args: argparse.Namespace) -> str:
    """The command that removes what this dry run listed: its own choices, with --yes."""
    words = ["verlbox", "clean"]
    words += ["--images"] if args.images else []
    words += ["--run", shlex.quote(str(args.run))] if args.run else []
    words += ["--all-build-cache"] if args.all_build_cache else []
    return " ".join([*words, "--yes"])


def clean(args: argparse.Namespace) -> int:
    if args.run and not args.images:
        raise UsageError("--run DIR names the run folder whose image --images keeps: give --images too")
    leftovers = file_leftovers(os.environ)
    engine_problem, beyond = "", 0
    try:
        engine = client()
        engine_found, beyond = find_leftovers(engine, args)
        leftovers += engine_found
    except (EngineError, docker.errors.DockerException) as exc:  # the files are still cleaned; bad input is raised
        engine, engine_problem = None, str(exc)
    going = [item for item in leftovers if not item.kept]
    if leftovers:
        print_leftovers(leftovers)
    size = sum(item.size for item in going)
    if engine_problem:
        err.print(f"the engine's part was not looked at: {engine_problem}", markup=False)
    if beyond:
        err.print(
            f"BuildKit holds {human_size(beyond)} more (build layers, verlbox's and other projects'): "
            "--all-build-cache prunes every record not in use",
            markup=False,
        )
    if args.images:
        err.print(
            f"kept: the images the .env of this run folder, of those `verlbox init` made (listed in "
            f"{state_dir() / RUN_FOLDERS}) and of those with a container name; a run folder made otherwise that "
            "never started cannot be seen: check its .env before --yes",
            markup=False,
        )
    if not going:
        err.print("nothing of verlbox's to remove", markup=False)
        return 1 if engine_problem else 0
    if not args.yes:
        err.print(
            f"would remove {len(going)} item(s), about {human_size(size)}: `{removing_command(args)}` does",
            markup=False,
        )
        return 1 if engine_problem else 0
    freed, failures = remove_all(engine, going)  # without an engine, only files are going
    for failure in failures:
        err.print(f"not removed: {failure}", markup=False)
    err.print(f"removed {len(going) - len(failures)} item(s), freed about {human_size(freed)}", markup=False)
    return 1 if failures or engine_problem else 0
