"""`verlbox images`: the verlbox images on the real engine, one row per tag to use, with whether each is current."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import docker, run_verlbox
from tiny_images import labelled, token
from verlbox.host.building.plan import RECIPE_ORIGIN_LABEL, BuildPlan
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.runs import images as images_module
from verlbox.host.trust.verify import HASH_LABELS

# dated in 2099: newer than any other test's image, so that their order among themselves is theirs alone
EPOCH = 4_100_000_000


def current_labels(recipe: str) -> dict[str, str]:
    """The recipe and hash labels this verlbox's build of a shipped recipe carries."""
    labels = BuildPlan(load_recipe(recipe)).labels
    return {"io.verlbox.recipe": recipe} | {label: labels[label] for label in HASH_LABELS if label in labels}


@pytest.fixture
def made(docker_engine: object, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Images of each standing, tagged for this test only; a staging tag and an unlabelled image beside them."""
    mark = token()
    tags = {
        name: f"verlbox-test/images-{name}:{mark}"
        for name in ("current", "also-current", "stale", "user", "unshipped", "unlabelled")
    }
    staging = f"verlbox-build/p40-cu124:1-{mark}-0-elsewhere"
    current = current_labels("p40-cu124")
    stale = current | {"io.verlbox.verl-patch-set.hash": "0" * 64}
    kinds = {
        "current": current,
        "stale": stale,
        "user": current | {RECIPE_ORIGIN_LABEL: "user"},
        "unshipped": {"io.verlbox.recipe": f"mine-{mark}"},
        "unlabelled": {},
    }
    try:
        for offset, (name, labels) in enumerate(kinds.items()):
            labelled(tmp_path / name, labels, tags[name], EPOCH + 100 * offset)
        docker("tag", tags["current"], tags["also-current"])
        docker("tag", tags["current"], staging)
        yield tags | {"staging": staging}
    finally:
        docker("image", "rm", *tags.values(), staging, check=False)


def mine(rows: list[dict], tags: dict[str, str]) -> list[dict]:
    return [row for row in rows if row["tag"] in tags.values()]


@pytest.mark.docker
def test_json_lists_each_tag_to_use_newest_first_with_its_standing(made: dict[str, str]) -> None:
    result = run_verlbox("images", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert not [row for row in rows if row["tag"].startswith("verlbox-build/")]  # staging tags: never
    found = mine(rows, made)
    assert [row["tag"] for row in found] == [
        made["unshipped"],
        made["user"],
        made["stale"],
        made["also-current"],  # the same image as current: newest first, then by name
        made["current"],
    ]
    by_name = {name: row for row in found for name, tag in made.items() if row["tag"] == tag}
    assert (by_name["current"]["current"], by_name["current"]["standing"]) == (True, "yes")
    assert by_name["current"]["image_id"] == by_name["also-current"]["image_id"]
    assert by_name["stale"]["current"] is False
    assert by_name["stale"]["standing"] == (
        "no: built from another version of p40-cu124's verl patch set than this verlbox's "
        "(labels io.verlbox.verl-patch-set.hash)"
    )
    assert (by_name["user"]["current"], by_name["user"]["standing"]) == (
        None,
        "not compared: built from your own recipe file",
    )
    assert by_name["unshipped"]["standing"].startswith("not compared: this verlbox ships no recipe mine-")
    assert by_name["current"]["recipe"] == "p40-cu124" and by_name["current"]["size"] > 0
    assert by_name["current"]["created"] == "2099-12-03T16:53:20Z"  # SOURCE_DATE_EPOCH 4_100_000_000
    assert "verify" not in by_name["current"]


@pytest.mark.docker
def test_the_table_shows_the_same_rows(made: dict[str, str]) -> None:
    result = run_verlbox("images")
    assert result.returncode == 0, result.stderr
    lines = {
        name: next((line for line in result.stdout.splitlines() if f" {tag} " in line), "")
        for name, tag in made.items()
    }
    assert "p40-cu124" in lines["current"] and lines["current"].rstrip(" │").endswith("yes")
    assert "no: built from another version of p40-cu124's verl patch set" in lines["stale"]
    assert lines["unlabelled"] == "" and lines["staging"] == ""


@pytest.mark.docker
def test_verify_runs_verify_once_per_image_and_fails_on_a_difference(
    made: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The comparison itself is faked for the images of this test (they are two bytes FROM scratch: nothing in
    them runs), and for any other image on the engine a pass; each image is compared once, under any tag."""
    compared: list[str] = []

    def differences(recipe: object, tag: str, labels: dict[str, str], records: Path) -> list[str]:
        compared.append(tag)
        return ["python torch: lock 2.6.0, image 2.5.1"] if tag == made["stale"] else []

    monkeypatch.setattr(images_module, "differences", differences)
    code = images_module.images(argparse.Namespace(verify=True, json=True))
    rows = {row["tag"]: row for row in json.loads(capsys.readouterr().out)}
    assert code == 1  # one image differs
    assert rows[made["stale"]]["verify"] == {
        "status": "failed",
        "detail": f"1 difference(s), first: python torch: lock 2.6.0, image 2.5.1 (verlbox verify {made['stale']} "
        "lists all)",
    }
    assert rows[made["current"]]["verify"] == {"status": "passed", "detail": "matches p40-cu124.lock.json"}
    assert rows[made["also-current"]]["verify"] == rows[made["current"]]["verify"]
    assert sorted(tag for tag in compared if tag in made.values()) == sorted([made["also-current"], made["stale"]])
    assert rows[made["user"]]["verify"]["status"] == "skipped"
    assert rows[made["user"]]["verify"]["detail"].endswith(f"verlbox verify {made['user']} --recipe PATH")
    assert rows[made["unshipped"]]["verify"]["status"] == "skipped"


@pytest.mark.docker
def test_a_real_verify_of_an_image_that_cannot_run_reads_it_and_says_what_differs(made: dict[str, str]) -> None:
    """Nothing in the image runs (two bytes FROM scratch), nor need it: verify reads it from outside."""
    labels = current_labels("p40-cu124")
    result = images_module.verify_image(made["current"], labels)
    assert result.status == "failed" and "first: python absl-py: lock 2.5.1, image absent" in result.detail
