"""The learning check's parts on the CPU: the task and its reward, the verdict, and that smoke reads each
step's losses where `train` writes them (the run folder's metrics.jsonl, replayed from a recorded GPU run).
The runs themselves need a GPU: `verlbox smoke --gpu --learn`, and bench/learn_gpu.py with the sabotages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO
from verlbox.runtime.checks import learn
from verlbox.runtime.checks.smoke import losses_of
from verlbox.runtime.training.progress import METRICS_FILE, Progress, RunWatch, read_metrics

RECORDED = REPO / "tests" / "fixtures" / "verl-run" / "console.txt"


def test_the_reward_is_the_share_of_filler_words() -> None:
    assert learn.compute_score(learn.DATA_SOURCE, "t100 t199 t150 t120", "") == 1.0
    assert learn.compute_score(learn.DATA_SOURCE, "t100 apples t99 t200", "") == 0.25
    assert learn.compute_score(learn.DATA_SOURCE, "", "") == 0.0
    assert learn.compute_score(learn.DATA_SOURCE, "   ", "", extra_info={"index": 1}) == 0.0


def test_the_task_is_verl_s_row_format_in_the_files_a_profile_reads(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    learn.make_task(tmp_path, rows=12)
    for name in ("train", "test", "validation"):
        rows = pq.read_table(tmp_path / f"{name}.parquet").to_pylist()
        assert len(rows) == 12
        assert {row["data_source"] for row in rows} == {learn.DATA_SOURCE}
        assert all(row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"] for row in rows)
        assert all(row["reward_model"] == {"style": "rule", "ground_truth": ""} for row in rows)
        # no prompt already holds the answer: the policy has to learn it
        assert not any(learn.compute_score("", row["prompt"][0]["content"], "") for row in rows)


@pytest.mark.parametrize(
    ("scores", "learned"),
    [
        ([0.39] + [0.5 + 0.01 * i for i in range(30)] + [0.95] * 9, True),
        ([0.39] * 40, False),  # learning rate 0: flat
        ([0.39 - 0.009 * i for i in range(40)], False),  # a flipped sign: down
        ([0.85] * 40, False),  # high from the start: nothing learned here
        ([0.39] * 35 + [0.65] * 5, False),  # a rise, but not to the bar
        ([0.39, 0.95, 0.95], False),  # too few steps to tell
        ([], False),
    ],
)
def test_the_verdict_needs_a_high_end_and_a_rise(scores: list[float], learned: bool) -> None:
    verdict = learn.judge(scores)
    assert verdict.learned is learned
    assert "pass: last 5 steps >= 0.7" in verdict.describe()


def test_smoke_reads_each_step_s_losses_from_the_run_folder_train_writes(tmp_path: Path) -> None:
    """Replays verl's console of a recorded GPU run through train's reader: the losses smoke finds in
    metrics.jsonl are verl's, and the console a user sees no longer carries them (what broke the GPU tier)."""
    lines = [line for line in RECORDED.read_text().splitlines() if not line.startswith("# verlbox:")]
    shown: list[str] = []
    watch = RunWatch(tmp_path, Progress(samples_per_step=16, memory_limit_gib=24), lambda text: shown.append(str(text)))
    for line in lines:
        watch.take(line, attempt=1)
    printed = [
        (name, float(value))
        for line in lines
        for name, value in re.findall(r"(actor/pg_loss|critic/vf_loss):(\S+)", line)
    ]
    assert len(printed) >= 4
    assert sorted(losses_of(read_metrics(tmp_path / METRICS_FILE))) == sorted(printed)
    assert not any("actor/pg_loss:" in line for line in shown)


def test_the_real_model_option_names_a_bad_folder_before_anything_runs(tmp_path: Path) -> None:
    from conftest import run_verlbox

    alone = run_verlbox("smoke-checks", "--recipe", "p40-cu124", "--data", str(tmp_path))
    assert alone.returncode == 2 and "--data goes with --model" in alone.stderr
    empty = run_verlbox("smoke-checks", "--recipe", "p40-cu124", "--model", str(tmp_path), "--data", str(tmp_path))
    assert empty.returncode == 2 and f"--model {tmp_path}: no config.json there" in empty.stderr
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "train.parquet").write_bytes(b"")
    no_data = run_verlbox("smoke-checks", "--recipe", "p40-cu124", "--model", str(tmp_path), "--data", str(tmp_path))
    assert no_data.returncode == 2, no_data.stderr
    assert f"--data {tmp_path}: neither verl's train.parquet and " in no_data.stderr
    assert "nor a GSM8K source to prepare them from" in no_data.stderr
    on_host = run_verlbox("smoke", "p40-cu124", "--model", str(tmp_path / "absent"))
    assert on_host.returncode == 2 and f"--model {tmp_path / 'absent'}: no such folder" in on_host.stderr
    # in a run folder without GSM8K: not "--data data/gsm8k: no such folder", a flag never given
    no_gsm8k = run_verlbox("smoke", "p40-cu124", "--model", str(tmp_path), cwd=tmp_path)
    assert no_gsm8k.returncode == 2 and "no GSM8K here (neither data/gsm8k" in no_gsm8k.stderr, no_gsm8k.stderr
    assert "`verlbox fetch data` first (smoke prepares it in the image)" in no_gsm8k.stderr
    assert "Traceback" not in alone.stderr + empty.stderr + no_data.stderr + on_host.stderr + no_gsm8k.stderr


def test_gsm8k_as_fetch_leaves_it_is_prepared_for_the_run_on_the_users_model(tmp_path: Path) -> None:
    """`verlbox fetch data` makes data/gsm8k-raw only; smoke --model prepares it where it runs (the image)."""
    from verlbox.runtime.checks.fixtures import make_gsm8k_jsonl
    from verlbox.runtime.commands import _prepared_here
    from verlbox.runtime.training.data import PREPARED

    raw = make_gsm8k_jsonl(tmp_path / "gsm8k-raw", train_rows=8, test_rows=4)
    prepared = _prepared_here(raw)
    assert all((prepared / name).is_file() for name in PREPARED), sorted(p.name for p in prepared.iterdir())
