"""Watching a finished run from the host: `verlbox report`'s picture and compose's TensorBoard service, both
from files the lent GPU's run wrote (tests/fixtures/verl-run: metrics.jsonl, run.json, tensorboard/)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.host.runs.report import read_report, render_png
from verlbox.runtime.training import progress
from verlbox.runtime.training.run_record import read_runs

RECORDED = REPO / "tests" / "fixtures" / "verl-run"


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "checkpoints" / "qwen-ppo"
    folder.mkdir(parents=True)
    for name in (progress.METRICS_FILE, "run.json"):
        shutil.copy(RECORDED / name, folder / name)
    shutil.copytree(RECORDED / progress.TENSORBOARD_FOLDER, folder / progress.TENSORBOARD_FOLDER)
    return folder


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_report_shows_every_step_the_validations_and_the_restart(run_folder: Path) -> None:
    records = progress.read_metrics(run_folder / progress.METRICS_FILE)
    [run] = read_runs(run_folder)
    report = read_report(run_folder)
    trained = sorted({r.step for r in records if progress.STEP_SECONDS in r.metrics})
    assert report.reward.steps == trained and report.memory_gib.steps == trained
    assert report.validation.steps == sorted(
        {r.step for r in records if progress.validation_reward(r.metrics) is not None}
    )
    assert report.validation.steps, "the recorded run validated"
    # verl restarted once inside this start of train: marked at the first step logged after it
    [restart] = run.restarts
    [(step, what)] = report.restarts
    assert what == f"restart after {restart.after}" and step == restart.from_step + 1
    assert report.memory_limit_gib == run.memory_cap_gib == 24
    assert all(0 < value < 24 for value in report.memory_gib.values)
    batch = next(int(o.split("=")[1]) for o in run.overrides if o.startswith("data.train_batch_size="))
    last = [r.metrics for r in records if r.step == trained[-1]][-1]
    assert "timing_s/save_checkpoint" in last and "timing_s/testing" in last  # the last step saved and validated
    seconds = last[progress.STEP_SECONDS] - last["timing_s/save_checkpoint"] - last["timing_s/testing"]
    assert report.samples_per_s.values[-1] == pytest.approx(batch / seconds)
    assert png_size(render_png(report)) == (1200, 750)


def test_verlbox_report_writes_the_png_and_bad_folders_are_one_line(run_folder: Path, tmp_path: Path) -> None:
    result = run_verlbox("report", str(run_folder))
    assert result.returncode == 0, result.stderr
    assert png_size((run_folder / "report.png").read_bytes()) == (1200, 750)
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, says in [(tmp_path / "nowhere", "not a folder"), (empty, "no metrics.jsonl")]:
        result = run_verlbox("report", str(folder))
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and says in result.stderr
    typo = tmp_path / "reprots" / "r.png"
    result = run_verlbox("report", str(run_folder), "--out", str(typo))
    assert result.returncode == 2 and result.stderr.strip() == (
        f"verlbox: error: --out {typo}: no folder {typo.parent}; make it first, or name a file in a folder"
    )
    assert not typo.parent.exists()  # a typo makes no folders
    (run_folder / "run.json").write_text('{"format": 1, "runs": [{"started": ')
    result = run_verlbox("report", str(run_folder), "--out", str(tmp_path / "r.png"))
    assert result.returncode == 2 and "run.json: not a readable run record" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "r.png").exists()


def test_report_finds_a_run_through_the_run_folder(run_folder: Path, tmp_path: Path) -> None:
    """In a run folder (or with --run DIR) report takes an EXPERIMENT's name, or the newest run, from the
    checkpoints folder the .env names, and says which it drew."""
    (tmp_path / ".env").write_text("VERLBOX_CHECKPOINTS=./checkpoints\n")
    older = tmp_path / "checkpoints" / "older"
    shutil.copytree(run_folder, older)
    os.utime(older / progress.METRICS_FILE, (1, 1))
    (tmp_path / "checkpoints" / "failed-at-start").mkdir()  # a start with a run.json and no step logged
    shutil.copy(run_folder / "run.json", tmp_path / "checkpoints" / "failed-at-start" / "run.json")
    newest = run_verlbox("report", cwd=tmp_path)
    assert newest.returncode == 0, newest.stderr
    assert newest.stderr.splitlines() == [f"run folder {tmp_path} (its .env), experiment qwen-ppo"]
    assert (run_folder / "report.png").is_file() and not (older / "report.png").exists()
    named = run_verlbox("report", "older", "--run", str(tmp_path))
    assert named.returncode == 0 and (older / "report.png").is_file(), named.stderr
    missing = run_verlbox("report", "olde", "--run", str(tmp_path))
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        f"verlbox: error: {tmp_path / 'checkpoints' / 'olde'}: not a folder; `verlbox runs` lists the run folder's "
        "experiments"
    ]
    (run_folder / "report.png").unlink()
    here = run_verlbox("report", cwd=run_folder)  # in checkpoints/EXPERIMENT, no run folder: this one
    assert here.returncode == 0 and (run_folder / "report.png").is_file(), here.stderr
    listed = run_verlbox("runs", cwd=tmp_path / "checkpoints")  # in checkpoints/: its experiments
    assert listed.returncode == 0 and "qwen-ppo" in listed.stdout and "older" in listed.stdout, listed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    nowhere = run_verlbox("report", cwd=empty)
    assert nowhere.returncode == 2 and "no run folder here" in nowhere.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ask(url: str, timeout_s: float = 90) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return json.load(answer)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.docker
def test_compose_s_tensorboard_serves_the_run_s_scalars_on_loopback(
    run_folder: Path, image: str, compose_cli: None
) -> None:
    project_dir = run_folder.parent.parent
    port = free_port()
    (project_dir / ".env").write_text(
        f"VERLBOX_IMAGE={image}\nVERLBOX_UID={os.getuid()}\nVERLBOX_GID={os.getgid()}\nVERLBOX_TENSORBOARD_PORT={port}\n"
    )
    compose = ["docker", "compose", "-f", str(REPO / "compose.yaml"), "--project-directory", str(project_dir)]
    project = f"verlbox-watch-{uuid.uuid4().hex[:8]}"
    compose += ["-p", project]
    up = subprocess.run([*compose, "up", "-d", "tensorboard"], capture_output=True, text=True)
    try:
        assert up.returncode == 0, up.stderr
        tags = ask(f"http://127.0.0.1:{port}/data/plugin/scalars/tags")
        assert isinstance(tags, dict)
        run = f"qwen-ppo/{progress.TENSORBOARD_FOLDER}"
        assert set(tags) == {run}
        records = progress.read_metrics(run_folder / progress.METRICS_FILE)
        assert {key for r in records for key in r.metrics} <= set(tags[run])
        query = urllib.parse.urlencode({"run": run, "tag": progress.REWARD})
        points = ask(f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?{query}")
        assert isinstance(points, list)
        assert sorted({step for _, step, _ in points}) == sorted(
            {r.step for r in records if progress.REWARD in r.metrics}
        )
        container = subprocess.run([*compose, "ps", "-q", "tensorboard"], capture_output=True, text=True).stdout.strip()
        [inspected] = json.loads(
            subprocess.run(["docker", "inspect", container], capture_output=True, text=True).stdout
        )
        assert [(m["Destination"], m["RW"]) for m in inspected["Mounts"]] == [("/checkpoints", False)]
        # its one line: the address the host reaches; none of TensorBoard's own noise (before: a pkg_resources
        # warning, "TensorFlow installation not found", http://0.0.0.0:6006/)
        said = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
        lines = (said.stdout + said.stderr).strip().splitlines()
        assert lines == [
            f"TensorBoard: http://127.0.0.1:{port} (this host only; from another machine: ssh -L "
            f"{port}:127.0.0.1:{port} HOST)"
        ], lines
        bindings = inspected["HostConfig"]["PortBindings"]["6006/tcp"]
        assert [(b["HostIp"], b["HostPort"]) for b in bindings] == [("127.0.0.1", str(port))]
        # a plain `down` (no profile named) stops it and removes the network
        down = subprocess.run([*compose, "down", "--timeout", "5"], capture_output=True, text=True, check=False)
        assert down.returncode == 0, down.stderr
        label = f"label=com.docker.compose.project={project}"
        left = subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True).stdout
        networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", label], capture_output=True, text=True)
        assert left.strip() == "" and networks.stdout.strip() == ""
    finally:
        subprocess.run([*compose, "down", "-v", "--timeout", "5"], capture_output=True, check=False)
