"""Synthetic GSM8K rows with the real questions' length distribution (runtime/checks/fixtures.py), for
benchmarks whose speed depends on how long the prompts are."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verlbox.runtime.checks import fixtures
from verlbox.runtime.training.data import prepare_gsm8k

# openai/grade-school-math, question words by whitespace split: rows, mean, median, p90, p99, shortest, longest
REAL = {
    "train": {"rows": 7473, "mean": 45.1, "median": 42, "p90": 69, "p99": 100, "min": 9, "max": 183},
    "test": {"rows": 1319, "mean": 46.3, "median": 43, "p90": 70, "p99": 102, "min": 15, "max": 164},
}


def question_words(folder: Path, split: str) -> list[int]:
    rows = (folder / f"{split}.jsonl").read_text().splitlines()
    return [len(json.loads(row)["question"].split()) for row in rows]


def quantile(sorted_values: list[int], share: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_split_of_real_size_has_the_real_quantiles_and_mean(tmp_path: Path, split: str) -> None:
    real = REAL[split]
    folder = fixtures.make_gsm8k_jsonl(tmp_path, real["rows"], real["rows"], lengths="gsm8k")
    words = sorted(question_words(folder, split))
    assert len(words) == real["rows"]
    assert words[0] == real["min"] and words[-1] == real["max"]
    assert abs(statistics.median(words) - real["median"]) <= 1
    assert abs(quantile(words, 0.9) - real["p90"]) <= 1
    assert abs(quantile(words, 0.99) - real["p99"]) <= 2
    # straight lines between the knots overshoot the skewed tail a little (fixtures.GSM8K_QUESTION_WORDS)
    assert real["mean"] - 0.5 < statistics.mean(words) < real["mean"] + 1.0


def test_a_bench_sized_sample_holds_the_quantiles_and_the_longest_question() -> None:
    """Stratified sampling: 256 rows (a validation set) already sit near the real median and p90, and every
    sample holds the split's longest question, which sets verl's prompt width."""
    for count in (256, 2048):
        words = sorted(fixtures.sample_question_words("train", count, random.Random(7)))
        assert abs(statistics.median(words) - 42) <= 1 and abs(quantile(words, 0.9) - 69) <= 2
        assert words[-1] == 183
    assert fixtures.sample_question_words("test", 1, random.Random(0)) == [164]
    assert fixtures.sample_question_words("test", 0, random.Random(0)) == []


def test_the_inverse_cdf_passes_through_its_knots_and_is_straight_between() -> None:
    knots = ((0.0, 10), (0.5, 20), (1.0, 60))
    assert [fixtures.words_at(knots, q) for q in (0.0, 0.25, 0.5, 0.75, 1.0)] == [10, 15, 20, 40, 60]
    for knots in fixtures.GSM8K_QUESTION_WORDS.values():
        quantiles, words = zip(*knots, strict=True)
        assert quantiles[0] == 0.0 and quantiles[-1] == 1.0
        assert list(quantiles) == sorted(set(quantiles)) and list(words) == sorted(words)


def test_the_same_arguments_write_the_same_bytes_and_another_seed_other_rows(tmp_path: Path) -> None:
    def written(name: str, seed: int) -> bytes:
        folder = fixtures.make_gsm8k_jsonl(tmp_path / name, 64, 16, seed=seed, lengths="gsm8k")
        return (folder / "train.jsonl").read_bytes() + (folder / "test.jsonl").read_bytes()

    assert written("a", 3) == written("b", 3)
    assert written("c", 4) != written("a", 3)


def test_uniform_stays_the_default_nineteen_word_question(tmp_path: Path) -> None:
    """Smoke checks and older figures use the one 19-word question; it stays the default."""
    folder = fixtures.make_gsm8k_jsonl(tmp_path, 16, 8)
    assert set(question_words(folder, "train") + question_words(folder, "test")) == {19}
    assert (
        fixtures.make_gsm8k_jsonl(tmp_path / "u", 16, 8, lengths="uniform").joinpath("train.jsonl").read_bytes()
        == (folder / "train.jsonl").read_bytes()
    )


def test_every_length_is_a_question_verl_s_rows_can_score(tmp_path: Path) -> None:
    """Each row's length is the sampled one, and its answer's final number is the ground truth verl's reward
    reads, however short the question."""
    raw = fixtures.make_gsm8k_jsonl(tmp_path / "raw", 300, 40, seed=1, lengths="gsm8k")
    rng = random.Random(1)
    assert question_words(raw, "train") == fixtures.sample_question_words("train", 300, rng)
    prepare_gsm8k(raw, tmp_path / "gsm8k", validation_size=16)
    for row in pq.read_table(tmp_path / "gsm8k" / "train.parquet").to_pylist():
        a, _, b = row["extra_info"]["question"].split()[-4:-1]
        assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
    assert fixtures.gsm8k_question(9, 1, 2) == "Natalia sold How many is 1 + 2 ?"
