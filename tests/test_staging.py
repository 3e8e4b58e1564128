"""Staging tags: a killed build's is removed by the next build on the host, a running build's is kept."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import docker, staging_tags
from verlbox.host.building.staging import REPOSITORY, remove_dead_builds_tags, staging_tag

RECIPE = "verlbox-test-staging"


def test_a_staging_tag_names_this_process_and_host_in_a_valid_tag() -> None:
    first, second = staging_tag("p40-cu124"), staging_tag("p40-cu124")
    assert first != second
    tag = first.rpartition(":")[2]
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag
    pid, _token, namespace, _host = tag.split("-", 3)
    assert pid == str(os.getpid()) and namespace == str(os.stat("/proc/self/ns/pid").st_ino)


@pytest.mark.docker
def test_only_the_tags_of_dead_builds_on_this_host_are_removed(docker_engine, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY Dockerfile /\n")
    image = docker("buildx", "build", "--load", "--quiet", str(tmp_path)).stdout.strip()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # that process has exited
    live = staging_tag(RECIPE)  # this test's own process
    killed = live.replace(live.rpartition(":")[2].partition("-")[0], str(dead_pid), 1)
    elsewhere = f"{killed}-on-another-host"
    foreign = f"{REPOSITORY}/{RECIPE}:0123456789ab"  # an older verlbox's tag: unknown owner, kept
    pid, token, _namespace, host = killed.rpartition(":")[2].split("-", 3)
    # a build in another container on this host: its PID is another namespace's, so it cannot be judged
    other_namespace = f"{REPOSITORY}/{RECIPE}:{pid}-{token}-1-{host}"
    # the same image under a user's repository, in the shape of a dead build's tag: not ours to remove
    users = f"mine/{RECIPE}:{killed.rpartition(':')[2]}"
    made = [live, killed, elsewhere, foreign, other_namespace, users]
    try:
        for tag in made:
            docker("tag", image, tag)
        assert remove_dead_builds_tags(docker_engine, RECIPE) == [killed]
        assert {tag for tag in staging_tags() if f"/{RECIPE}:" in tag} == {live, elsewhere, foreign, other_namespace}
        assert docker("image", "inspect", users, check=False).returncode == 0
    finally:
        docker("image", "rm", *made, check=False)


@pytest.mark.docker
def test_a_sigterm_to_verlbox_build_stops_buildx_and_leaves_no_staging_tag(
    docker_engine, tmp_path: Path, sources_dir: Path
) -> None:
    """A service manager or `kill` signals verlbox alone, not its process group: buildx (a stand-in here
    that only sleeps, so the build never ends by itself) is stopped too, and the build says it was
    interrupted."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho $$ >"$FAKE_BUILDX_PID"\necho "#1 [internal] load build"\nexec sleep 120\n')
    fake.chmod(0o755)
    pid_file = tmp_path / "buildx.pid"
    before = staging_tags()
    env = os.environ | {"PATH": f"{fake.parent}:{os.environ['PATH']}", "FAKE_BUILDX_PID": str(pid_file)}
    build = subprocess.Popen(
        [sys.executable, "-m", "verlbox.cli", "build", "p40-cu124", "--tag", "verlbox-test/sigterm:never"],
        env=env | {"VERLBOX_SOURCES": str(sources_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(300):
        if pid_file.is_file() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    buildx = int(pid_file.read_text())
    build.send_signal(signal.SIGTERM)
    _, stderr = build.communicate(timeout=60)
    assert build.returncode == 130 and "verlbox: interrupted" in stderr, stderr[-2000:]
    with pytest.raises(ProcessLookupError):
        os.kill(buildx, 0)
    assert staging_tags() == before
