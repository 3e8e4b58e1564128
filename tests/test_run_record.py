"""run.json: one entry per start of `train`, verl's restarts inside it, how it ended; `verlbox runs` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.errors import UsageError
from verlbox.runtime.training.run_record import RUN_FILE, Gpu, Run, RunLog, now, read_runs


def a_run(**changes: object) -> Run:
    fields: dict = {
        "started": now(),
        "recipe": "p40-cu124",
        "recipe_hash": "a" * 64,
        "patch_set_hash": "b" * 64,
        "verlbox": "0.1.0",
        "image": "verlbox/p40-cu124:0.1.0",
        "profile": "p40",
        "overrides": ["data.train_batch_size=64"],
        "gpus": [Gpu(name="Tesla P40", capability="6.1", memory_gib=22.4)],
        "driver": "550.54.14",
        "model": "/models/Qwen2.5-0.5B-Instruct",
        "model_commit": "c" * 40,
        "data": {"/data/gsm8k/train.parquet": "d" * 64},
    }
    return Run(**(fields | changes))


def test_each_start_appends_and_restarts_and_the_end_are_kept(tmp_path: Path) -> None:
    first = RunLog(tmp_path, a_run(), print)
    first.restarted("exit 1", 25)
    first.ended("finished", 50)
    second = RunLog(tmp_path, a_run(profile="grpo"), print)  # a later start: the first stays as it was
    runs = read_runs(tmp_path)
    assert [(r.profile, r.outcome, r.last_step) for r in runs] == [("p40", "finished", 50), ("grpo", None, None)]
    assert [(r.after, r.from_step) for r in runs[0].restarts] == [("exit 1", 25)]
    second.ended("halted (crash loop)", None)
    assert read_runs(tmp_path)[1].outcome == "halted (crash loop)"
    assert json.loads((tmp_path / RUN_FILE).read_text())["format"] == 1


def test_a_damaged_record_is_one_line_for_runs_and_kept_aside_by_a_start(tmp_path: Path) -> None:
    experiment = tmp_path / "checkpoints" / "exp"
    experiment.mkdir(parents=True)
    (experiment / RUN_FILE).write_text('{"format": 1, "runs": [{"started": ')
    with pytest.raises(UsageError, match=rf"{RUN_FILE}: not a readable run record \("):
        read_runs(experiment)
    RunLog(tmp_path / "checkpoints" / "whole", a_run(), print).ended("finished", 200)
    shown = run_verlbox("runs", str(tmp_path / "checkpoints"))
    # the damaged experiment is one row saying so; the others are still listed; exit 1
    assert shown.returncode == 1 and shown.stderr == "" and "Traceback" not in shown.stdout
    rows = {line.split("\u2502")[1].strip(): line for line in shown.stdout.splitlines() if line.startswith("\u2502")}
    assert "unreadable:" in rows["exp"] and "not a readable run record" in rows["exp"]
    assert "finished" in rows["whole"]
    said: list[str] = []
    RunLog(experiment, a_run(), said.append)  # a start goes on: the damaged file is kept, and said
    [kept] = experiment.glob(f"{RUN_FILE}.damaged-*")
    assert kept.read_text().startswith('{"format": 1') and said[0].endswith(f"kept as {kept.name}, starting a new one")
    assert len(read_runs(experiment)) == 1


def test_runs_lists_every_experiment_as_a_table(tmp_path: Path) -> None:
    for name, commit in (("ppo", "c" * 40), ("grpo", None)):
        log = RunLog(tmp_path / name, a_run(profile=name, model_commit=commit), print)
        log.ended("finished", 200)
    shown = run_verlbox("runs", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if "Tesla P40" in line]
    assert len(rows) == 2
    assert "grpo" in rows[0] and "(by hand)" in rows[0] and "finished" in rows[0] and "200" in rows[0]
    assert "ppo" in rows[1] and "cccccccccccc" in rows[1]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path, target_is_directory=True)
    through_run_folder = run_verlbox("runs", str(tmp_path / "run"))  # its .env gone: its checkpoints/ is read
    assert (
        through_run_folder.returncode == 0
        and through_run_folder.stderr == f"runs under {tmp_path / 'run' / 'checkpoints'}\n"
    )
    assert len([line for line in through_run_folder.stdout.splitlines() if "Tesla P40" in line]) == 2
    # a run folder's .env says where its checkpoints are: FOLDER, --run DIR and the current folder agree
    (tmp_path / "run" / ".env").write_text(f"VERLBOX_CHECKPOINTS={tmp_path}\n")
    (tmp_path / "run" / "checkpoints").unlink()
    for words, cwd in ((["run"], tmp_path), (["--run", "run"], tmp_path), ([], tmp_path / "run")):
        shown = run_verlbox("runs", *words, cwd=cwd)
        assert shown.returncode == 0 and shown.stderr == f"run folder {tmp_path / 'run'} (its .env)\n", words
        assert len([line for line in shown.stdout.splitlines() if "Tesla P40" in line]) == 2, words
    both = run_verlbox("runs", "run", "--run", "run", cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr
    empty = run_verlbox("runs", str(tmp_path / "grpo" / "nothing-here"))
    assert empty.returncode == 2 and "not a folder" in empty.stderr
