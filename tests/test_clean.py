"""`verlbox clean`: only what verlbox made (logs, cached sources, staging tags, untagged verlbox images, its cache
mounts; tagged images only with --images), a dry run unless --yes; judged on real files and engine objects."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, docker
from tiny_images import build, labelled, prune_records_naming, records_naming, runnable, token, true_command
from verlbox.host.building.staging import REPOSITORY
from verlbox.host.runs import clean
from verlbox.host.runs.clean import (
    CACHE_MOUNT,
    IMAGE,
    LOG,
    OUR_CACHE_ID_PREFIX,
    SOURCE,
    STAGING,
    UNTAGGED,
    Leftover,
    cache_mount_id,
    file_leftovers,
    image_leftovers,
    ours,
    staging_verdict,
    tag_leftovers,
)

TEMPLATES = REPO / "builder" / "verlbox" / "host" / "building" / "templates"
NO_ENGINE = "unix:///nonexistent/docker.sock"


def run_clean(*args: str, cwd: Path, cache: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`verlbox clean` with its cache folder under CACHE (XDG_CACHE_HOME) and no VERLBOX_SOURCES of the caller's."""
    environ = {key: value for key, value in os.environ.items() if key != "VERLBOX_SOURCES"}
    environ |= {"XDG_CACHE_HOME": str(cache)} | (env or {})
    command = [sys.executable, "-m", "verlbox.cli", "clean", *args]
    return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=300, check=False)


def table_rows(output: str) -> dict[str, tuple[str, str, str]]:
    """name -> (what, size, action) from the printed table."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 4 and cells[0] and cells[0] != "what":
            rows[cells[1]] = (cells[0], cells[2], cells[3])
    return rows


def dead_pid() -> int:
    """A process that has exited: no build of this PID runs."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def staging_tag_of(pid: int, mark: str) -> str:
    """A staging tag in staging.py's grammar, of process PID on this host and in this PID namespace."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:80] or "host"
    return f"{REPOSITORY}/clean-test-{mark}:{pid}-{mark[-8:]}-{os.stat('/proc/self/ns/pid').st_ino}-{host}"


# --- what counts as verlbox's, from facts ---


LOCKED_FILES = (
    "cached mount /root/.cache/verlbox/locked-files from exec /bin/bash -o pipefail -c python3 -m venv /opt/venv "
    '&& bash /tmp/verlbox/steps/steps.sh pip python pip==25.1.1 uv==0.9.5 with id "/verlbox-locked-files"'
)
PIP_BY_OUR_STEPS = (
    "cached mount /root/.cache/pip from exec /bin/bash -o pipefail -c python3 -m venv /opt/venv && bash "
    '/tmp/verlbox/steps/steps.sh pip python pip==25.1.1 uv==0.9.5 with id "//root/.cache/pip"'
)
PIP_OF_ANOTHER_PROJECT = (
    'cached mount /root/.cache/pip from exec /bin/sh -c pip install -r requirements.txt with id "//root/.cache/pip"'
)


def test_cache_mounts_are_ours_by_verlbox_s_id_or_by_verlbox_s_steps() -> None:
    """Descriptions as the engine gives them (BuildKit 0.13, Docker 26)."""
    assert cache_mount_id(LOCKED_FILES) == "verlbox-locked-files"
    assert cache_mount_id(PIP_BY_OUR_STEPS) == "/root/.cache/pip"
    for description, expected in ((LOCKED_FILES, True), (PIP_BY_OUR_STEPS, True), (PIP_OF_ANOTHER_PROJECT, False)):
        assert ours({"Type": "exec.cachemount", "Description": description}) is expected, description
    # a layer record of a verlbox step is a build layer, kept by default (a rebuild reuses it)
    layer = "mount / from exec /bin/bash -o pipefail -c bash /tmp/verlbox/steps/steps.sh pip torch torch==2.6.0"
    assert ours({"Type": "regular", "Description": layer}) is False


def test_every_cache_mount_the_templates_make_is_one_clean_knows() -> None:
    """A new cache mount in a template must carry an id clean recognises, or none (its id is then its target,
    and the command that first uses it runs verlbox's steps)."""
    mounts = [
        mount
        for template in TEMPLATES.iterdir()
        for mount in re.findall(r"--mount=type=cache,(\S+)", template.read_text())
    ]
    assert mounts, "the templates make no cache mount: update clean"
    for mount in mounts:
        options = dict(option.split("=", 1) for option in mount.split(","))
        assert "id" not in options or options["id"].startswith(OUR_CACHE_ID_PREFIX), mount


def test_a_staging_tag_goes_unless_its_build_still_runs_here() -> None:
    mark = token()
    assert staging_verdict(staging_tag_of(os.getpid(), mark)) == ""
    dead = dead_pid()
    assert staging_verdict(staging_tag_of(dead, mark)) == f"its build (process {dead}) is gone"
    elsewhere = f"{REPOSITORY}/p40:{os.getpid()}-ab12cd34-1-another-host"
    assert staging_verdict(elsewhere).startswith("its build cannot be judged from here")
    assert staging_verdict(f"{REPOSITORY}/p40:0123456789ab").startswith("its build cannot be judged")


def image(image_id: str, tags: list[str], labels: dict[str, str] | None = None, size: int = 100) -> dict:
    """One entry of the engine's image list."""
    return {"Id": image_id, "RepoTags": tags, "Labels": labels or {}, "Size": size, "Created": 1}


def test_tags_and_untagged_images_from_the_engine_s_list() -> None:
    dead, live = staging_tag_of(dead_pid(), token()), staging_tag_of(os.getpid(), token())
    recipe = {"io.verlbox.recipe": "p40-cu124"}
    listed = [
        image("alone", [dead], recipe),
        image("with-final", [staging_tag_of(dead_pid(), token()), "verlbox/p40-cu124:0.1.0"], recipe),
        image("running", [live], recipe),
        image("untagged", [], recipe),
        image("untagged-used", ["<none>:<none>"], recipe),
        image("not-ours", [], {}),
        image("user-tag", ["mine/p40:1"], recipe),
    ]
    found = {item.name: item for item in tag_leftovers(listed, {"untagged-used": "train-1"})}
    assert set(found) == {dead, listed[1]["RepoTags"][0], live, "untagged", "untagged-used"}
    assert (found[dead].kind, found[dead].size, found[dead].kept) == (STAGING, 100, "")
    assert found[listed[1]["RepoTags"][0]].size == 0  # the final tag keeps the image
    assert found[live].kept == "its build is still running"
    assert (found["untagged"].kind, found["untagged"].kept) == (UNTAGGED, "")
    assert found["untagged-used"].kept == "container train-1 uses it"


def test_tagged_images_go_only_when_no_run_folder_names_them_and_no_container_uses_them() -> None:
    recipe = {"io.verlbox.recipe": "p40-cu124"}
    listed = [
        image("named", ["verlbox/p40-cu124:0.1.0", "verlbox/p40-cu124:copy"], recipe),
        image("used", ["mine/p40:1"], recipe),
        image("free", ["mine/p40:2", "mine/p40:3"], recipe, size=300),
        image("unlabelled", ["other/thing:1"], {}),
    ]
    named = {"verlbox/p40-cu124:0.1.0": "run folder /r's .env names it"}
    found = {item.name: item for item in image_leftovers(listed, {"used": "train-1"}, named)}
    assert set(found) == {"verlbox/p40-cu124:0.1.0", "verlbox/p40-cu124:copy", "mine/p40:1", "mine/p40:2", "mine/p40:3"}
    assert found["verlbox/p40-cu124:0.1.0"].kept == "run folder /r's .env names it"
    assert (found["verlbox/p40-cu124:copy"].kept, found["verlbox/p40-cu124:copy"].size) == ("", 0)  # image stays
    assert found["mine/p40:1"].kept == "container train-1 uses it"
    assert [found["mine/p40:2"].size, found["mine/p40:3"].size] == [0, 300]  # counted once, on the last tag


class NoContainers:
    """The engine's API with no compose container: only init's list tells of other run folders."""

    def containers(self, **_: object) -> list[dict[str, object]]:
        return []


def test_a_run_folder_init_made_keeps_its_image_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run outside the run folder, clean once offered its image for removal: the README says it never does."""
    made = subprocess.run(
        [sys.executable, "-m", "verlbox.cli", "init", "run", "--image", "verlbox-test/p40-cu124:ci"],
        cwd=tmp_path,
        env=os.environ | {"DOCKER_HOST": NO_ENGINE},
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    environ = {key: value for key, value in os.environ.items() if key != "VERLBOX_IMAGE"}
    named = clean.run_folder_images(argparse.Namespace(api=NoContainers()), None, environ)
    assert named == {"verlbox-test/p40-cu124:ci": f"run folder {tmp_path / 'run'}'s .env names it"}
    shutil.rmtree(tmp_path / "run")  # gone: nothing to keep for it, and no error
    assert clean.run_folder_images(argparse.Namespace(api=NoContainers()), None, environ) == {}


def test_files_under_the_cache_folder_and_one_held_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    logs, sources = tmp_path / "verlbox" / "build-logs", tmp_path / "verlbox" / "sources"
    logs.mkdir(parents=True)
    sources.mkdir()
    (logs / "p40-cu124-20260101-000000-aaaaaaaaaaaa.log").write_text("failed\n")
    (sources / "apex-0000.tar.gz").write_bytes(b"x" * 1000)
    with (logs / "p40-20260101-000001-bbbbbbbbbbbb.log").open("w") as writing:  # a running build's log
        writing.write("running\n")
        writing.flush()
        found = {Path(item.name).name: item for item in file_leftovers({"XDG_CACHE_HOME": str(tmp_path)})}
    assert (found["p40-cu124-20260101-000000-aaaaaaaaaaaa.log"].kind, found["apex-0000.tar.gz"].size) == (LOG, 1000)
    assert found["apex-0000.tar.gz"].kind == SOURCE and not found["apex-0000.tar.gz"].kept
    assert found["p40-20260101-000001-bbbbbbbbbbbb.log"].kept == "a process holds it open"
    # a folder VERLBOX_SOURCES names is the user's: never emptied
    mine = file_leftovers({"XDG_CACHE_HOME": str(tmp_path), "VERLBOX_SOURCES": str(sources)})
    assert [(item.kind, item.kept) for item in mine if item.kind == SOURCE] == [
        (SOURCE, "VERLBOX_SOURCES names it: your folder")
    ]


# --- the command ---


@pytest.fixture
def cache_folder(tmp_path: Path) -> Path:
    """XDG_CACHE_HOME holding two failed builds' logs and a cached source archive."""
    logs, sources = tmp_path / "cache" / "verlbox" / "build-logs", tmp_path / "cache" / "verlbox" / "sources"
    logs.mkdir(parents=True)
    sources.mkdir()
    for name in ("p40-cu124-20260101-000000-aaaaaaaaaaaa.log", "p40-20260101-000000-bbbbbbbbbbbb.log"):
        (logs / name).write_text("#12 ERROR: process did not complete successfully\n" * 100)
    (sources / "apex-e13873debc4699d39c6861074b9a3b2a02327f92.tar.gz").write_bytes(b"\x1f\x8b" * 50_000)
    return tmp_path / "cache"


def test_without_an_engine_the_files_are_still_listed_then_removed(cache_folder: Path, tmp_path: Path) -> None:
    files = sorted(path for path in cache_folder.rglob("*") if path.is_file())
    dry = run_clean(cwd=tmp_path, cache=cache_folder, env={"DOCKER_HOST": NO_ENGINE})
    assert dry.returncode == 1, dry.stderr  # the engine's part was not looked at: not a clean bill
    rows = table_rows(dry.stdout)
    assert {rows[str(path)][0] for path in files} == {LOG, SOURCE}
    assert rows[str(files[-1])][1] == "100.0 kB"
    assert "the engine's part was not looked at: no Docker engine answers" in dry.stderr
    assert "would remove 3 item(s), about 109.8 kB: `verlbox clean --yes` does" in dry.stderr
    assert all(path.is_file() for path in files)  # a dry run
    with files[0].open("a"):  # held open, as by a build still writing its log
        removed = run_clean("--yes", cwd=tmp_path, cache=cache_folder, env={"DOCKER_HOST": NO_ENGINE})
    assert removed.returncode == 1, removed.stderr
    assert [path.is_file() for path in files] == [True, False, False]
    assert table_rows(removed.stdout)[str(files[0])][2] == "keep: a process holds it open"
    assert "removed 2 item(s), freed about" in removed.stderr


def test_a_dry_run_names_the_command_that_removes_what_it_listed() -> None:
    def args(**given: object) -> argparse.Namespace:
        return argparse.Namespace(**({"images": False, "run": None, "all_build_cache": False} | given))

    assert clean.removing_command(args()) == "verlbox clean --yes"
    # `verlbox clean --yes` alone would not remove the images an --images dry run listed
    assert clean.removing_command(args(images=True)) == "verlbox clean --images --yes"
    chosen = args(images=True, run=Path("my runs/a"), all_build_cache=True)
    assert clean.removing_command(chosen) == "verlbox clean --images --run 'my runs/a' --all-build-cache --yes"


def test_run_goes_with_images_only(tmp_path: Path) -> None:
    result = run_clean("--run", str(tmp_path), cwd=tmp_path, cache=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "verlbox: error: --run DIR names the run folder whose image --images keeps: give --images too"
    )


@pytest.fixture
def engine_objects(docker_engine, tmp_path: Path) -> Iterator[dict[str, str]]:
    """On the real engine, marked for this test alone: staging tags of a dead and of a running build, an untagged
    verlbox image, two tagged ones (one named by a run folder's .env), and three cache mounts (verlbox's by its
    id, verlbox's by its steps, another project's)."""
    mark = token()
    recipe = {"io.verlbox.recipe": f"clean-test-{mark}"}
    made = {
        "dead": staging_tag_of(dead_pid(), mark),
        "live": staging_tag_of(os.getpid(), mark),
        "named": f"verlbox-test/clean-named:{mark}",
        "free": f"verlbox-test/clean-free:{mark}",
    }
    ids = []
    try:
        for name in ("dead", "live", "named", "free"):
            ids.append(labelled(tmp_path / name, recipe, made[name]))
        made["untagged"] = labelled(tmp_path / "untagged", recipe)
        ids.append(made["untagged"])
        context = tmp_path / "cache-mounts"
        context.mkdir()
        dockerfile = runnable(context, mark)
        dockerfile += f"RUN --mount=type=cache,id={OUR_CACHE_ID_PREFIX}clean-{mark},target=/c {true_command(mark)}\n"
        dockerfile += (
            f"RUN --mount=type=cache,target=/root/.cache/c-{mark} {true_command('/tmp/verlbox/steps/s', mark)}\n"
        )
        dockerfile += f"RUN --mount=type=cache,id=other-{mark},target=/c {true_command(mark)}\n"
        ids.append(build(context, dockerfile))
        run_folder = tmp_path / "run"
        run_folder.mkdir()
        (run_folder / ".env").write_text(f"VERLBOX_IMAGE={made['named']}\n")
        yield made | {"mark": mark, "run": str(run_folder)}
    finally:
        docker("image", "rm", *(made[name] for name in ("dead", "live", "named", "free")), check=False)
        docker("image", "rm", *ids, check=False)
        prune_records_naming(docker_engine, mark)


def cache_mounts(engine, mark: str) -> dict[str, str]:
    """id -> BuildKit record of this test's cache mounts."""
    return {
        str(cache_mount_id(record["Description"])): record["ID"]
        for record in records_naming(engine, mark)
        if record["Type"] == "exec.cachemount"
    }


@pytest.mark.docker
def test_a_dry_run_lists_only_verlbox_s_and_removal_takes_only_what_is_listed(
    docker_engine, engine_objects: dict[str, str], cache_folder: Path
) -> None:
    mark, run = engine_objects["mark"], Path(engine_objects["run"])
    mounts = cache_mounts(docker_engine, mark)
    ours_by_id, ours_by_steps, other = (
        mounts[f"{OUR_CACHE_ID_PREFIX}clean-{mark}"],
        mounts[f"/root/.cache/c-{mark}"],
        mounts[f"other-{mark}"],
    )

    plain = table_rows(run_clean(cwd=run, cache=cache_folder).stdout)
    assert plain[engine_objects["dead"]][0] == STAGING
    assert plain[engine_objects["dead"]][2].startswith("remove: its build (process ")
    assert plain[engine_objects["live"]][2] == "keep: its build is still running"
    assert plain[engine_objects["untagged"]][0] == UNTAGGED
    assert plain[ours_by_id][0] == plain[ours_by_steps][0] == CACHE_MOUNT
    assert other not in plain
    assert engine_objects["named"] not in plain and engine_objects["free"] not in plain  # tagged: --images only

    with_images = run_clean("--images", cwd=run, cache=cache_folder)
    rows = table_rows(with_images.stdout)
    assert rows[engine_objects["named"]] == (IMAGE, "-", f"keep: run folder {run}'s .env names it")
    assert rows[engine_objects["free"]][0] == IMAGE and rows[engine_objects["free"]][2].startswith("remove: recipe ")
    assert "a run folder made otherwise that never started cannot be seen: check its .env" in with_images.stderr
    # all still there: a dry run
    assert docker("image", "inspect", engine_objects["dead"], check=False).returncode == 0
    assert set(cache_mounts(docker_engine, mark).values()) == {ours_by_id, ours_by_steps, other}

    # the removal itself, on this test's objects alone (others' on this engine are no test's to remove)
    args = argparse.Namespace(images=True, all_build_cache=False, run=str(run))
    found, _ = clean.find_leftovers(docker_engine, args, {})
    marked = [item for item in found if mark in item.name or item.name in (ours_by_id, ours_by_steps)]
    marked += [item for item in found if item.name == engine_objects["untagged"]]
    freed, failures = clean.remove_all(docker_engine, marked)
    assert failures == [] and freed >= 0
    gone = {
        name: docker("image", "inspect", engine_objects[name], check=False).returncode != 0
        for name in engine_objects
        if name not in ("mark", "run")
    }
    assert gone == {"dead": True, "live": False, "named": False, "free": True, "untagged": True}
    assert set(cache_mounts(docker_engine, mark).values()) == {other}


def test_a_kept_leftover_is_never_removed(tmp_path: Path) -> None:
    kept = tmp_path / "kept.log"
    kept.write_text("x")
    freed, failures = clean.remove_all(None, [Leftover(LOG, str(kept), 1, kept="a process holds it open")])
    assert (freed, failures, kept.is_file()) == (0, [], True)
