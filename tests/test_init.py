"""`verlbox init [DIR]`: a run folder that `docker compose` resolves, re-runs that keep a user's edits."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker import errors as docker_errors

from conftest import REPO, docker, run_verlbox
from verlbox import paths
from verlbox.host.building.build import default_tag
from verlbox.host.building.plan import RECIPE_ORIGIN_LABEL, BuildPlan
from verlbox.host.commands import _lock_check
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.runs import remembered, runfolder
from verlbox.host.runs.runfolder import ENV_HEADER, FOLDERS, FoundImage, newest_current, newest_first
from verlbox.host.trust.verify import HASH_LABELS

IMAGE = "verlbox-test/init:given"
# No engine answers here, so the newest-image lookup cannot depend on what this engine holds.
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def init(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_verlbox("init", *args, cwd=cwd, env=NO_ENGINE | (env or {}))


def compose_config(compose_file: Path, cwd: Path) -> dict:
    # a VERLBOX_* variable in the test's own environment would win over .env
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VERLBOX_")}
    result = subprocess.run(
        ["docker", "compose", "-f", str(compose_file), "config", "--format", "json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def env_values(path: Path) -> dict[str, str]:
    lines = (line for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return dict(line.split("=", 1) for line in lines)


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every path under FOLDER with its inode, mtime and bytes: equal snapshots mean nothing was written."""
    return {
        str(path.relative_to(folder)): (
            path.stat().st_ino,
            path.stat().st_mtime_ns,
            path.read_bytes() if path.is_file() else None,
        )
        for path in sorted(folder.rglob("*"))
    }


@pytest.mark.docker
def test_a_pip_installed_verlbox_writes_a_folder_compose_resolves(
    wheel_venv: Path, tmp_path: Path, compose_cli
) -> None:
    result = subprocess.run(
        [str(wheel_venv / "bin" / "verlbox"), "init", "run", "--image", IMAGE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ | NO_ENGINE,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "next: cd run && docker compose up train"
    run = tmp_path / "run"
    # the installed package's own copy of the shipped file, not the checkout's path
    assert (run / "compose.yaml").read_text() == (REPO / "compose.yaml").read_text()
    train = compose_config(run / "compose.yaml", tmp_path)["services"]["train"]
    assert train["user"] == f"{os.getuid()}:{os.getgid()}"
    assert train["image"] == IMAGE
    sources = {volume["target"]: volume["source"] for volume in train["volumes"]}
    assert sources == {
        "/models": str(run / "models"),
        "/data": str(run / "data"),
        "/checkpoints": str(run / "checkpoints"),
        "/cache/huggingface": str(run / "hf-cache"),
    }
    assert all((run / folder).is_dir() for folder in FOLDERS)


@pytest.mark.docker
def test_two_run_folders_are_two_compose_projects(tmp_path: Path, compose_cli) -> None:
    names = []
    for folder in ("first-run", "second-run"):
        assert init(folder, "--image", IMAGE, cwd=tmp_path).returncode == 0
        names.append(compose_config(tmp_path / folder / "compose.yaml", tmp_path)["name"])
    assert names == ["first-run", "second-run"]


def test_the_folders_and_env_belong_to_the_caller(tmp_path: Path) -> None:
    result = init("run", "--image", IMAGE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    for folder in FOLDERS:
        assert ((run / folder).stat().st_uid, (run / folder).stat().st_gid) == (os.getuid(), os.getgid())
    settings = env_values(run / ".env")
    assert (settings["VERLBOX_UID"], settings["VERLBOX_GID"]) == (str(os.getuid()), str(os.getgid()))
    # it may come to hold HF_TOKEN
    assert (run / ".env").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.getuid() != 0, reason="only root can hand files to another user, as sudo's root does")
def test_through_sudo_the_folder_belongs_to_the_user_behind_it(tmp_path: Path) -> None:
    result = init("run", "--image", IMAGE, cwd=tmp_path, env={"SUDO_UID": "4321", "SUDO_GID": "4322"})
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    assert (env_values(run / ".env")["VERLBOX_UID"], env_values(run / ".env")["VERLBOX_GID"]) == ("4321", "4322")
    for path in [run, *(run / folder for folder in FOLDERS), run / ".env", run / "compose.yaml"]:
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322), path


def test_a_rerun_leaves_equal_files_alone_and_updates_its_own(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0
    (run / "models" / "weights.bin").write_bytes(b"the user's model")
    before = snapshot(run)
    again = init("run", "--image", IMAGE, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert snapshot(run) == before
    assert "compose.yaml and .env up to date" in again.stderr
    # .env is still exactly what init wrote: a new image replaces it, with no backup needed
    updated = init("run", "--image", "verlbox-test/init:newer", cwd=tmp_path)
    assert updated.returncode == 0, updated.stderr
    assert env_values(run / ".env")["VERLBOX_IMAGE"] == "verlbox-test/init:newer"
    assert not list(run.glob("*.bak*"))
    assert (run / "compose.yaml").stat().st_ino == before["compose.yaml"][0]
    assert (run / "models" / "weights.bin").read_bytes() == b"the user's model"


def test_an_edited_file_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0
    with (run / ".env").open("a") as env:
        env.write("HF_TOKEN=mine\n")
    (run / "data").rmdir()
    before = snapshot(run)
    # a new image would change .env, and data/ is missing: neither happens while .env is refused
    result = init("run", "--image", "verlbox-test/init:newer", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "verlbox: error: run/.env changed since `verlbox init` wrote it; nothing written "
        "(--force replaces it and keeps yours as .env.bak)"
    ]
    assert snapshot(run) == before


def test_a_users_own_compose_file_is_named_as_theirs_not_as_changed(tmp_path: Path) -> None:
    """Before: "changed since `verlbox init` wrote it" for a file init never wrote."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "compose.yaml").write_text("services: {}\n")
    before = snapshot(run)
    result = init("run", "--image", IMAGE, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "verlbox: error: run/compose.yaml is not verlbox's (init never wrote it); nothing written "
        "(--force replaces it and keeps yours as compose.yaml.bak)"
    ]
    assert snapshot(run) == before


def test_force_replaces_an_edited_file_and_keeps_it_as_bak(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0
    edits = []
    for token in ("first", "second"):
        edits.append((run / ".env").read_text() + f"HF_TOKEN={token}\n")
        (run / ".env").write_text(edits[-1])
        result = init("run", "--image", IMAGE, "--force", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert env_values(run / ".env")["HF_TOKEN"] == ""
    # an older backup is the user's too: the second goes beside it
    assert (run / ".env.bak").read_text() == edits[0]
    assert (run / ".env.bak.2").read_text() == edits[1]
    assert "yours kept as .env.bak.2" in result.stderr
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0


def test_a_file_where_a_folder_belongs_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("not a folder")
    result = init("run", "--image", IMAGE, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "verlbox: error: run/checkpoints exists and is not a folder; compose binds a folder there"
    ]
    assert sorted(path.name for path in run.iterdir()) == ["checkpoints"]


def test_a_bad_image_reference_is_bad_input(tmp_path: Path) -> None:
    result = init("run", "--image", "Not An Image", cwd=tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("verlbox: error: --image ")
    assert not (tmp_path / "run").exists()


def test_without_an_image_to_name_a_new_folder_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """No default name is ever written for compose to run: an image nobody built here is nobody's."""
    result = init("run", cwd=tmp_path)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("verlbox: error: no Docker engine answers")
    assert line.endswith(": so init cannot find your image: name one with --image")
    assert not (tmp_path / "run").exists()


def test_without_an_engine_a_rerun_keeps_the_image_init_found_before(tmp_path: Path) -> None:
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0
    result = init("run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_IMAGE"] == IMAGE
    assert f"VERLBOX_IMAGE={IMAGE}" in result.stderr


class StandInImages:
    """The engine's image store as init reads it: tag -> image ID."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def get(self, tag: str) -> argparse.Namespace:
        if tag not in self.tags:
            raise docker_errors.ImageNotFound(tag)
        return argparse.Namespace(id=self.tags[tag], labels={})


def test_init_takes_the_image_the_last_build_made_while_the_engine_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not the newest verlbox image on the engine, which may be anyone's (a test's, a tampered one)."""
    store = StandInImages({"verlbox/p40-cu124:0.1.0": "sha256:built", "verlbox-test/newer:1": "sha256:other"})
    monkeypatch.setattr(runfolder, "client", lambda: argparse.Namespace(images=store))
    monkeypatch.setattr(runfolder, "verlbox_images", lambda: [found("verlbox-test/newer:1", {})])
    assert remembered.remember_build("verlbox/p40-cu124:0.1.0", "sha256:built") is None
    notes: list[str] = []
    assert runfolder._image(None, {}, notes) == "verlbox/p40-cu124:0.1.0"
    assert notes == [
        "VERLBOX_IMAGE=verlbox/p40-cu124:0.1.0, the image the last `verlbox build` made; --image REF takes another"
    ]
    # the tag moved to another image since (a build elsewhere, a `docker tag`): the newest one, as before
    store.tags["verlbox/p40-cu124:0.1.0"] = "sha256:retagged"
    assert runfolder._image(None, {}, []) == "verlbox-test/newer:1"


def fake_nvidia_smi(folder: Path, script: str) -> dict[str, str]:
    folder.mkdir()
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\n{script}\n")
    (folder / "nvidia-smi").chmod(0o755)
    return {"PATH": str(folder)}


@pytest.mark.parametrize(
    ("script", "gpus", "note"),
    [
        (
            "printf 'GPU 0: Tesla P40 (UUID: GPU-a)\\nGPU 1: Tesla P40 (UUID: GPU-b)\\n"
            "  MIG 1g.10gb Device 0: (UUID: MIG-c)\\nGPU 2: Tesla P40 (UUID: GPU-d)\\n'",
            "3",
            None,
        ),
        (
            "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
            "1",
            "note: nvidia-smi -L failed (NVIDIA-SMI has failed because it could not communicate with the NVIDIA "
            "driver.): VERLBOX_GPUS=1 (set it in .env)",
        ),
        (None, "1", "note: no nvidia-smi on PATH: VERLBOX_GPUS=1 (set it in .env)"),
    ],
    ids=["three-gpus", "no-driver", "no-nvidia-smi"],
)
def test_the_gpu_count_is_what_nvidia_smi_lists(
    tmp_path: Path, script: str | None, gpus: str, note: str | None
) -> None:
    path = fake_nvidia_smi(tmp_path / "bin", script) if script else {"PATH": str(tmp_path / "empty")}
    result = init("run", "--image", IMAGE, cwd=tmp_path, env=path)
    assert result.returncode == 0, result.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_GPUS"] == gpus
    assert [line for line in result.stderr.splitlines() if "nvidia-smi" in line] == ([note] if note else [])
    assert f", {gpus} GPU" in result.stderr


def test_env_example_documents_what_init_writes_and_every_compose_variable(tmp_path: Path) -> None:
    assert init("run", "--image", IMAGE, cwd=tmp_path).returncode == 0
    written = (tmp_path / "run" / ".env").read_text()
    example = (REPO / ".env.example").read_text()
    assert written.startswith(ENV_HEADER)

    def without_header_and_values(text: str) -> list[str]:
        body = text.split("\n\n", 1)[1]
        return [line.split("=", 1)[0] for line in body.splitlines()]

    # the same keys, in the same order, under the same comments
    assert without_header_and_values(written) == without_header_and_values(example)
    # `$${NAME}` is the shell's, escaped from compose: not a setting
    compose_variables = set(re.findall(r"(?<!\$)\$\{(\w+)", (REPO / "compose.yaml").read_text()))
    assert compose_variables <= set(env_values(REPO / ".env.example"))
    # the note without an image promises that `verlbox build p40` makes the example's image
    assert env_values(REPO / ".env.example")["VERLBOX_IMAGE"] == default_tag(BuildPlan(load_recipe("p40")))


def test_the_newest_tagged_image_wins_and_staging_tags_never_do() -> None:
    listed = [
        {"Created": 100, "RepoTags": ["verlbox/p40:0.1.0"]},
        {"Created": 300, "RepoTags": ["verlbox-build/p40:123-abc-host"]},  # a build still running
        {"Created": 250, "RepoTags": ["<none>:<none>"]},
        {"Created": 200, "RepoTags": ["verlbox/p40-cu124:0.1.0", "mine/p40:latest"]},
        {"Created": 200, "RepoTags": []},
    ]
    found = [image.tag for image in newest_first(listed)]
    assert found == ["mine/p40:latest", "verlbox/p40-cu124:0.1.0", "verlbox/p40:0.1.0"]
    assert newest_first(listed[1:3]) == []


def build_labelled(folder: Path, tag: str, epoch: int, label: bool, more: str = "", recipe: str = "init-test") -> None:
    """A two-byte image FROM scratch, dated EPOCH (BuildKit's SOURCE_DATE_EPOCH sets its Created)."""
    folder.mkdir()
    (folder / "marker").write_text(tag)
    labels = f"LABEL io.verlbox.recipe={recipe}{more}\n" if label else ""
    (folder / "Dockerfile").write_text(f"FROM scratch\n{labels}COPY marker /marker\n")
    docker("buildx", "build", "-q", "--load", "--build-arg", f"SOURCE_DATE_EPOCH={epoch}", "-t", tag, str(folder))


@pytest.mark.docker
def test_verify_and_smoke_ask_for_the_users_own_recipe_file_of_an_image_built_from_one(
    docker_engine: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held to the shipped recipe of its name, an image of an edited copy would list every change as a fault."""
    tag = f"verlbox-test/verify-user-recipe:{os.getpid()}"
    note = f"{tag} was built from your own recipe file named p40-cu124 (label {RECIPE_ORIGIN_LABEL}=user)"
    try:
        build_labelled(tmp_path / "image", tag, 1, label=True, more=f" {RECIPE_ORIGIN_LABEL}=user", recipe="p40-cu124")
        result = run_verlbox("verify", tag)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].endswith(f"{note}: pass --recipe PATH, that file")
        # smoke's host row (the in-image checks need a real image): by the shipped name, a failure that says why
        row = _lock_check(argparse.Namespace(recipe="p40-cu124"), tag)
        assert (row.name, row.status) == ("image of this recipe", "failed")
        assert row.detail == f"{note}, not the shipped one: name that file's path instead"
        mine = tmp_path / "mine"
        mine.mkdir()
        shutil.copy(REPO / "recipes" / "p40-cu124.yaml", mine / "p40-cu124.yaml")  # its lock stays behind
        row = _lock_check(argparse.Namespace(recipe=str(mine / "p40-cu124.yaml")), tag)
        assert (row.name, row.status) == ("matches its lock", "skipped")
        # an unchanged copy with its lock is 'shipped' by content, yet named by its path it is held to that lock:
        # the comparison itself is faked (it runs the image, and this one is two bytes FROM scratch)
        shutil.copy(REPO / "recipes" / "p40-cu124.lock.json", mine / "p40-cu124.lock.json")
        monkeypatch.setattr("verlbox.host.trust.verify.differences", lambda recipe, *_: [f"held to {recipe.lock_path}"])
        row = _lock_check(argparse.Namespace(recipe=str(mine / "p40-cu124.yaml")), tag)
        assert (row.name, row.status, row.detail) == (
            "matches its lock",
            "failed",
            f"held to {mine}/p40-cu124.lock.json",
        )
    finally:
        docker("image", "rm", tag, check=False)


@pytest.fixture
def labelled_images(docker_engine: object, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Dated in 2096, so that they are newer than any image a build makes on this engine today."""
    # tagged per process: another session's teardown on this engine never removes these
    images = {"older": f"verlbox-test/init-older:{os.getpid()}", "newest": f"verlbox-test/init-newest:{os.getpid()}"}
    unlabelled = f"verlbox-test/init-unlabelled:{os.getpid()}"
    try:
        build_labelled(tmp_path / "older", images["older"], 4_000_000_000, label=True)
        build_labelled(tmp_path / "newest", images["newest"], 4_000_000_100, label=True)
        build_labelled(tmp_path / "unlabelled", unlabelled, 4_000_000_200, label=False)
        yield images
    finally:
        docker("image", "rm", *images.values(), unlabelled, check=False)


@pytest.mark.docker
def test_init_picks_the_newest_verlbox_image_on_the_engine(tmp_path: Path, labelled_images: dict[str, str]) -> None:
    result = run_verlbox("init", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_IMAGE"] == labelled_images["newest"]
    # the other candidates are named: an image someone else tagged newer is not taken silently
    (note,) = [line for line in result.stderr.splitlines() if "VERLBOX_IMAGE" in line]
    assert note.startswith(
        f"note: VERLBOX_IMAGE={labelled_images['newest']}, the newest verlbox image here. Also here: "
    )
    assert labelled_images["older"] in note


@pytest.mark.docker
def test_a_rerun_keeps_the_image_the_env_names_though_a_newer_one_is_here(
    tmp_path: Path, labelled_images: dict[str, str]
) -> None:
    """Before, a second `init` switched the folder to the newest verlbox image on the engine."""
    older = labelled_images["older"]
    assert run_verlbox("init", "run", "--image", older, cwd=tmp_path).returncode == 0
    result = run_verlbox("init", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_IMAGE"] == older
    assert f"note: VERLBOX_IMAGE={older} kept from .env; --image REF takes another" in result.stderr.splitlines()
    newest = labelled_images["newest"]
    switched = run_verlbox("init", "run", "--image", newest, cwd=tmp_path)  # told otherwise: switched, and said
    assert switched.returncode == 0, switched.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_IMAGE"] == newest
    assert f"note: VERLBOX_IMAGE={newest}, in place of {older}" in switched.stderr.splitlines()


def hash_labels(shipped: str, **replaced: str) -> dict[str, str]:
    """The recipe and hash labels this verlbox's build of recipe SHIPPED carries; REPLACED (by HASH_LABELS'
    words, spaces as underscores) given other values."""
    labels = BuildPlan(load_recipe(shipped)).labels
    values = {label: labels[label] for label in HASH_LABELS if label in labels}  # p40 has no lock
    for label, word in HASH_LABELS.items():
        if word.replace(" ", "_") in replaced:
            values[label] = replaced[word.replace(" ", "_")]
    return {"io.verlbox.recipe": shipped} | values


@pytest.mark.docker
def test_init_passes_over_a_newer_image_of_another_version_of_a_shipped_recipe(
    tmp_path: Path, docker_engine: object
) -> None:
    """After `pip install -U verlbox`, an image the old verlbox built (another patch set) is not taken over the
    one this verlbox built, even when it is newer. Dated after every other test's image (2096)."""
    current = "".join(f" {key}={value}" for key, value in hash_labels("p40-cu124").items() if key in HASH_LABELS)
    older_patches = "".join(
        f" {key}={value}" for key, value in hash_labels("p40-cu124", verl_patch_set="0" * 64).items()
        if key in HASH_LABELS
    )  # fmt: skip
    tags = {"current": f"verlbox-test/init-current:{os.getpid()}", "stale": f"verlbox-test/init-stale:{os.getpid()}"}
    try:
        build_labelled(tmp_path / "current", tags["current"], 4_000_001_000, True, current, "p40-cu124")
        build_labelled(tmp_path / "stale", tags["stale"], 4_000_001_300, True, older_patches, "p40-cu124")
        result = run_verlbox("init", "run", cwd=tmp_path)
    finally:
        docker("image", "rm", *tags.values(), check=False)
    assert result.returncode == 0, result.stderr
    assert env_values(tmp_path / "run" / ".env")["VERLBOX_IMAGE"] == tags["current"]
    (note,) = [line for line in result.stderr.splitlines() if "VERLBOX_IMAGE" in line]
    assert note.startswith(
        f"note: VERLBOX_IMAGE={tags['current']}, the newest verlbox image that is current. Passed over, though "
        f"newer: {tags['stale']}, built from another version of p40-cu124's verl patch set than this verlbox's "
        "(labels io.verlbox.verl-patch-set.hash). "
    )


def found(tag: str, labels: dict[str, str]) -> FoundImage:
    return FoundImage(tag, labels)


def test_an_older_image_of_another_recipe_version_is_only_listed() -> None:
    newest, second = found("a:cur", hash_labels("p40-cu124")), found("b:cur", hash_labels("p40-cu124"))
    old = found("old:stale", hash_labels("p40-cu124", recipe="0"))
    notes: list[str] = []
    assert newest_current([newest, second, old], notes) == "a:cur"
    assert notes == [
        "VERLBOX_IMAGE=a:cur, the newest verlbox image here. Also here: b:cur, old:stale; --image REF takes another."
    ]
    notes.clear()
    assert newest_current([old, newest], notes) == "a:cur"
    assert notes == [
        "VERLBOX_IMAGE=a:cur, the newest verlbox image that is current. Passed over, though newer: old:stale, "
        "built from another version of p40-cu124's recipe than this verlbox's (labels io.verlbox.recipe.hash). "
        "--image REF takes another."
    ]


def test_with_only_images_of_another_recipe_version_init_takes_the_newest_and_says_so() -> None:
    stale = found("verlbox/p40-cu124:old", {"io.verlbox.recipe": "p40-cu124", "io.verlbox.recipe.hash": "0"})
    older = found("verlbox/p40:old", hash_labels("p40", verl_patch_set="0"))
    notes: list[str] = []
    assert newest_current([stale, older], notes) == stale.tag
    assert notes == [
        f"VERLBOX_IMAGE={stale.tag}, the newest verlbox image here, was built from another version of p40-cu124's "
        "recipe, verl patch set and lock than this verlbox's (labels " + ", ".join(HASH_LABELS) + "). Rebuild it "
        f"(`verlbox build p40-cu124`) for a current one; `verlbox verify {stale.tag}` lists what differs. Also "
        f"here: {older.tag}; --image REF takes another."
    ]
    # p40 has no lock, and `verlbox verify` needs one: not offered
    notes.clear()
    assert newest_current([older], notes) == older.tag
    assert notes == [
        f"VERLBOX_IMAGE={older.tag}, the newest verlbox image here, was built from another version of p40's verl "
        "patch set than this verlbox's (labels io.verlbox.verl-patch-set.hash). Rebuild it (`verlbox build p40`) "
        "for a current one. --image REF takes another."
    ]
    # a recipe verlbox does not ship (a user's own file) has nothing here to hold it to: it counts as current
    own = found("mine/custom:1", {"io.verlbox.recipe": "my-own"})
    assert newest_current([stale, own], []) == own.tag
    # nor does a user's edited copy that kept a shipped recipe's name: its image is current, with no note
    edited = found("mine/p40-cu124:1", stale.labels | {RECIPE_ORIGIN_LABEL: "user"})
    notes.clear()
    assert newest_current([edited, stale], notes) == edited.tag
    assert notes == [
        f"VERLBOX_IMAGE={edited.tag}, the newest verlbox image here. Also here: {stale.tag}; --image REF takes another."
    ]


def test_a_lock_made_for_another_recipe_version_is_held_against_no_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkout whose recipe was edited and not locked again: init still works, judging by recipe and
    patch set only (`verlbox build` is where that lock is refused)."""
    labels = hash_labels("p40-cu124") | {"io.verlbox.lock.hash": "anything"}
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    lock = recipes / "p40-cu124.lock.json"
    lock.write_text(lock.read_text().replace(load_recipe("p40-cu124").content_hash, "0" * 64))
    monkeypatch.setattr(paths, "recipes_dir", lambda: recipes)
    assert runfolder.out_of_date(labels) is None
    assert runfolder.out_of_date(labels | {"io.verlbox.recipe.hash": "0"}) is not None


@pytest.mark.docker
def test_an_image_the_engine_lacks_is_named_only_on_purpose_and_compose_never_pulls(
    tmp_path: Path, docker_engine: object, compose_cli
) -> None:
    missing = f"verlbox-test/never-built:{os.getpid()}"
    result = run_verlbox("init", "run", "--image", missing, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        f"note: {missing} is not on this Docker engine, and compose never pulls: `docker pull` it or build it"
        in result.stderr.splitlines()
    )
    services = compose_config(tmp_path / "run" / "compose.yaml", tmp_path)["services"]
    assert services["train"]["pull_policy"] == "never" and services["train"]["image"] == missing
    up = subprocess.run(
        ["docker", "compose", "up", "--no-start", "train"], cwd=tmp_path / "run", capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert up.returncode != 0 and "Pulling" not in up.stdout + up.stderr
    subprocess.run(["docker", "compose", "down"], cwd=tmp_path / "run", capture_output=True, check=False)


@pytest.mark.docker
@pytest.mark.parametrize(
    ("driver", "note"),
    [
        ("470.82.01", "driver 470.82.01 cannot run {image}'s CUDA 12.4 (needs driver >= 525.60.13, full support "
         "from 550.54.14): train's preflight will stop there; `verlbox doctor` names the recipes this driver runs"),
        ("535.104.05", "driver 535.104.05 runs {image}'s CUDA 12.4 through CUDA minor-version compatibility "
         "(>= 525.60.13), full support from 550.54.14"),
        ("550.54.14", None),
    ],
    ids=["too-old", "compatibility", "full"],
)  # fmt: skip
def test_init_says_when_this_driver_cannot_run_the_image_s_cuda(
    docker_engine: object, tmp_path: Path, driver: str, note: str | None
) -> None:
    """doctor's rule, applied by init to the image it names (its io.verlbox.pin.cuda label) and the driver
    nvidia-smi reports: quiet when the driver fully supports it."""
    image = f"verlbox-test/init-cuda:{os.getpid()}"
    build_labelled(tmp_path / "image", image, 4_000_000_000, label=True, more=" io.verlbox.pin.cuda=12.4")
    listing = "echo 'GPU 0: Tesla P40 (UUID: GPU-a)'"
    query = f"echo '0, Tesla P40, 6.1, 24576, {driver}'"
    fake_nvidia_smi(tmp_path / "bin", f'if [ "$1" = -L ]; then {listing}; else {query}; fi')
    try:
        path = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
        result = run_verlbox("init", "run", "--image", image, cwd=tmp_path, env={"PATH": path})
    finally:
        docker("image", "rm", image, check=False)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "driver" in line]
    assert said == ([f"note: {note.format(image=image)}"] if note else [])
