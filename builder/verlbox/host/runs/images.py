"""`verlbox images`: the images `verlbox build` made on this engine, one row per tag, newest first.

An image is verlbox's when it carries the recipe label; a staging tag (`verlbox-build/...`) names an image
only until its build succeeds, so it is never listed as one to use (`verlbox clean` removes those a killed
build left). Each row says whether the image's labels are current for this verlbox (the recipe, verl patch
set and lock hashes `init` holds an image to); `--verify` also runs `verlbox verify` on each image (seconds
each: it runs the image), and `--json` prints the rows for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import docker
from rich.console import Console
from rich.table import Table

from verlbox import paths
from verlbox.errors import VerlboxError
from verlbox.host.building.plan import from_users_recipe
from verlbox.host.clients.engine import EngineError, client
from verlbox.host.recipes.recipe import load_recipe, recipe_names
from verlbox.host.runs.clean import human_size, is_staging
from verlbox.host.runs.remembered import build_records
from verlbox.host.runs.runfolder import RECIPE_LABEL, newest_first, out_of_date
from verlbox.host.trust.verify import differences

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)
err = Console(stderr=True, highlight=False, soft_wrap=True)

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class Verification:
    status: str  # passed, failed or skipped
    detail: str


@dataclass(frozen=True)
class ImageRow:
    tag: str
    image_id: str
    recipe: str
    created: int  # seconds since the epoch, as the engine says
    size: int  # bytes
    # True: built from this verlbox's recipe, patch set (and lock); False: from another version of them;
    # None: nothing here to hold it to (a user's own recipe file, a recipe this verlbox does not ship)
    current: bool | None
    standing: str
    verify: Verification | None = None


def standing(labels: dict[str, str]) -> tuple[bool | None, str]:
    """Whether an image with LABELS is current for this verlbox, and the words a row shows."""
    name = labels.get(RECIPE_LABEL, "")
    if from_users_recipe(labels):
        return None, "not compared: built from your own recipe file"
    if name not in recipe_names(paths.recipes_dir()):
        return None, f"not compared: this verlbox ships no recipe {name}"
    if reason := out_of_date(labels):
        return False, f"no: built from {reason}"
    return True, "yes"


def image_rows(listed: list[dict[str, Any]]) -> list[ImageRow]:
    """The engine's image list (label-filtered) as rows: every usable tag, newest first, staging tags left out."""
    by_tag = {tag: image for image in listed for tag in image.get("RepoTags") or []}
    rows = []
    for found in newest_first(listed):
        image = by_tag[found.tag]
        current, words = standing(found.labels)
        rows.append(
            ImageRow(
                found.tag,
                image["Id"],
                found.labels.get(RECIPE_LABEL, ""),
                int(image["Created"]),
                int(image["Size"]),
                current,
                words,
            )
        )
    return rows


def verify_image(tag: str, labels: dict[str, str]) -> Verification:
    """`verlbox verify TAG` as one result: the image against the lock of the shipped recipe it names."""
    name = labels.get(RECIPE_LABEL, "")
    if from_users_recipe(labels):
        return Verification(SKIPPED, f"built from your own recipe file: verlbox verify {tag} --recipe PATH")
    if name not in recipe_names(paths.recipes_dir()):
        return Verification(SKIPPED, f"this verlbox ships no recipe {name}: verlbox verify {tag} --recipe PATH")
    recipe = load_recipe(name)
    if recipe.lock_path is None or not recipe.lock_path.is_file():
        return Verification(SKIPPED, f"recipe {name} has no lock to compare with")
    try:
        found = differences(recipe, tag, labels, build_records())
    except VerlboxError as exc:
        return Verification(FAILED, str(exc))
    if found:
        return Verification(FAILED, f"{len(found)} difference(s), first: {found[0]} (verlbox verify {tag} lists all)")
    return Verification(PASSED, f"matches {recipe.lock_path.name}")


def verified(rows: list[ImageRow], labels: dict[str, dict[str, str]]) -> list[ImageRow]:
    """ROWS with each image's verification; an image under several tags is run once."""
    results: dict[str, Verification] = {}
    done = []
    for number, row in enumerate(rows, 1):
        if row.image_id not in results:
            with err.status(f"verifying {row.tag} ({number}/{len(rows)}): its layers or files"):
                results[row.image_id] = verify_image(row.tag, labels[row.tag])
        done.append(replace(row, verify=results[row.image_id]))
    return done


def _created(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def print_table(rows: list[ImageRow]) -> None:
    with_verify = any(row.verify for row in rows)
    table = Table("tag", "image", "recipe", "created", "size", "current", *(["verify"] if with_verify else []))
    for row in rows:
        cells = [row.tag, row.image_id.removeprefix("sha256:")[:12], row.recipe, _created(row.created)]
        cells += [human_size(row.size), row.standing]
        if row.verify:
            cells.append(f"{row.verify.status}: {row.verify.detail}")
        table.add_row(*cells)
    out.print(table)


def as_json(rows: list[ImageRow]) -> str:
    def entry(row: ImageRow) -> dict[str, Any]:
        fields = asdict(row)
        fields["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.created))
        if row.verify is None:
            del fields["verify"]
        return fields

    return json.dumps([entry(row) for row in rows], indent=2) + "\n"


def listed_images() -> list[dict[str, Any]]:
    """The engine's list of the images that carry the recipe label (staging tags and untagged ones too)."""
    try:
        return client().api.images(filters={"label": RECIPE_LABEL})
    except docker.errors.DockerException as exc:
        raise EngineError(f"cannot list the engine's images ({exc})") from None


def images(args: argparse.Namespace) -> int:
    listed = listed_images()
    rows = image_rows(listed)
    if args.verify:
        rows = verified(rows, {found.tag: found.labels for found in newest_first(listed)})
    if args.json:
        sys.stdout.write(as_json(rows))
        return _exit_code(rows)
    if rows:
        print_table(rows)
    else:
        err.print("no verlbox image on this engine: `verlbox doctor` says which recipe to build", markup=False)
    if leftovers := leftovers_note(listed):
        err.print(leftovers, markup=False)
    return _exit_code(rows)


def _exit_code(rows: list[ImageRow]) -> int:
    return 1 if any(row.verify and row.verify.status == FAILED for row in rows) else 0


def leftovers_note(listed: list[dict[str, Any]]) -> str:
    """What of verlbox's images is no image to use (no tag, or only a staging tag): `clean`'s to remove."""
    unused = [
        image
        for image in listed
        if not [tag for tag in image.get("RepoTags") or [] if tag != "<none>:<none>" and not is_staging(tag)]
    ]
    if not unused:
        return ""
    size = human_size(sum(image["Size"] for image in unused))
    return f"also here: {len(unused)} verlbox image(s) with no tag to use ({size}): `verlbox clean` lists them"
