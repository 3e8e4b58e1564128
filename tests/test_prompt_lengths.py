"""data.max_prompt_length fitted to the data: the record beside the parquet files and the lowered override.

The tokenizer is the one boundary faked here (the host has no transformers); the smoke's CPU check "prompt
length fitted as verl counts" holds the same code to verl's own RLHFDataset filter in the image.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from test_data import jsonl_layout
from verlbox.errors import PreflightFailed
from verlbox.runtime import commands
from verlbox.runtime.training import prompt_lengths
from verlbox.runtime.training.data import DataError, to_verl_row, write_parquet
from verlbox.runtime.training.prompt_lengths import KEY, PromptLengths, fitted, measure
from verlbox.runtime.training.train import fit_prompt_length


class WordTokenizer:
    """A chat template of two words around each message; one token per word."""

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        assert add_generation_prompt  # verl's filter asks for the assistant's opening too
        words = [word for message in messages for word in ["<start>", *message["content"].split(), "<end>"]]
        return list(range(len(words) + 1))


def _data(folder: Path, extra_words: list[int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [to_verl_row("q" + " w" * n, "#### 1", "train", i) for i, n in enumerate(extra_words)]
    write_parquet(rows, folder / "train.parquet")
    return folder / "train.parquet"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _counting_loader(loads: list[Path]) -> Callable[[Path], WordTokenizer]:
    def load(model_dir: Path) -> WordTokenizer:
        loads.append(model_dir)
        return WordTokenizer()

    return load


# the instruction verlbox appends to every GSM8K question, in words, and the template's three tokens
BASE = len(to_verl_row("q", "#### 1", "train", 0)["prompt"][0]["content"].split()) + 3


def test_lengths_are_measured_once_and_recorded_beside_the_data(tmp_path: Path, model: Path) -> None:
    train = _data(tmp_path / "data", [0, 2, 5, 5])
    loads: list[Path] = []
    said: list[str] = []
    first = measure([train], model, "prompt", said.append, load=_counting_loader(loads))
    assert first.counts == Counter({BASE: 1, BASE + 2: 1, BASE + 5: 2}) and first.longest == BASE + 5
    assert len(loads) == 1 and len(said) == 1 and "train.parquet" in said[0]
    record = json.loads((tmp_path / "data" / prompt_lengths.RECORD).read_text())
    (entry,) = record["entries"]
    assert entry["prompt_key"] == "prompt" and set(entry["files"]) == {"train.parquet"}
    again = measure([train], model, "prompt", said.append, load=_counting_loader(loads))
    assert again == first and len(loads) == 1 and len(said) == 1


def test_new_rows_or_another_tokenizer_are_measured_again(tmp_path: Path, model: Path) -> None:
    train = _data(tmp_path / "data", [1])
    loads: list[Path] = []
    assert measure([train], model, "prompt", print, load=_counting_loader(loads)).longest == BASE + 1
    _data(tmp_path / "data", [1, 7])
    assert measure([train], model, "prompt", print, load=_counting_loader(loads)).longest == BASE + 7
    (model / "tokenizer.json").write_text('{"changed": true}')
    measure([train], model, "prompt", print, load=_counting_loader(loads))
    (tmp_path / "data" / prompt_lengths.RECORD).write_text("{not json")
    measure([train], model, "prompt", print, load=_counting_loader(loads))
    assert len(loads) == 4


def test_a_file_without_the_prompt_column_is_named(tmp_path: Path, model: Path) -> None:
    train = _data(tmp_path / "data", [1])
    with pytest.raises(DataError, match=r"train\.parquet: no column 'question_text' \(data.prompt_key"):
        measure([train], model, "question_text", print, load=_counting_loader([]))
    assert not (tmp_path / "data" / prompt_lengths.RECORD).exists()


def test_the_profile_width_is_a_ceiling_lowered_to_the_longest_prompt() -> None:
    said: list[str] = []
    overrides = ["data.train_batch_size=64", f"{KEY}=256", "data.max_response_length=256"]
    lowered = fitted(overrides, PromptLengths(Counter({40: 3, 187: 1})), said.append)
    assert lowered == ["data.train_batch_size=64", f"{KEY}=187", "data.max_response_length=256"]
    assert len(said) == 1 and "the longest of 4 prompts" in said[0]


def test_prompts_above_the_ceiling_are_counted_and_the_ceiling_kept() -> None:
    said: list[str] = []
    overrides = [f"{KEY}=256", "data.filter_overlong_prompts=True"]
    assert fitted(overrides, PromptLengths(Counter({100: 7, 300: 2})), said.append) == overrides
    assert said == [
        f"prompt lengths: 2 of 9 prompts are longer than 256 tokens ({KEY}): verl leaves them out "
        "(data.filter_overlong_prompts)"
    ]
    # unset, verl 0.4.1's ppo_trainer.yaml has the filter off; Hydra reads false and False alike
    assert fitted([f"{KEY}=256"], PromptLengths(Counter({300: 1})), said.append) == [f"{KEY}=256"]
    assert fitted([f"{KEY}=256", "data.filter_overlong_prompts=true"], PromptLengths(Counter({300: 1})), said.append)
    assert said[-2].endswith("(data.truncation=error)") and said[-1].endswith("(data.filter_overlong_prompts)")
    unfiltered = [f"{KEY}=256", "data.filter_overlong_prompts=false"]
    said.clear()
    fitted(unfiltered, PromptLengths(Counter({300: 1})), said.append)
    assert said and said[0].endswith("verl stops at the first of them (data.truncation=error)")
    said.clear()
    fitted([*unfiltered, "data.truncation=left"], PromptLengths(Counter({300: 1})), said.append)
    assert said and said[0].endswith("verl cuts them to the width (data.truncation=left)")


def test_without_a_profile_width_or_any_prompt_nothing_changes() -> None:
    assert fitted(["data.train_batch_size=8"], PromptLengths(Counter({10: 1})), print) == ["data.train_batch_size=8"]
    assert fitted([f"{KEY}=256"], PromptLengths(Counter()), print) == [f"{KEY}=256"]


def test_a_model_folder_without_tokenizer_files_is_measured_but_never_recorded(tmp_path: Path) -> None:
    # nothing would tell its record from another such model's
    bare = tmp_path / "bare-model"
    bare.mkdir()
    train = _data(tmp_path / "data", [2])
    loads: list[Path] = []
    for _ in range(2):
        assert measure([train], bare, "prompt", print, load=_counting_loader(loads)).longest == BASE + 2
    assert len(loads) == 2 and not (tmp_path / "data" / prompt_lengths.RECORD).exists()


def test_a_record_of_another_format_is_measured_again(tmp_path: Path, model: Path) -> None:
    train = _data(tmp_path / "data", [2])
    loads: list[Path] = []
    measure([train], model, "prompt", print, load=_counting_loader(loads))
    record = tmp_path / "data" / prompt_lengths.RECORD
    (entry,) = json.loads(record.read_text())["entries"]
    # format 1 (verlbox of 2026-12-03): one tokenizer per folder, at the top level; here with a wrong length
    entry["files"]["train.parquet"]["lengths"] = {"1": 1}
    record.write_text(json.dumps({"format": 1} | entry))
    assert measure([train], model, "prompt", print, load=_counting_loader(loads)).longest == BASE + 2
    assert len(loads) == 2 and json.loads(record.read_text())["format"] == prompt_lengths.RECORD_FORMAT == 2


def _model(folder: Path, tokenizer: str) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_text(tokenizer)
    return folder


def test_two_models_on_one_data_folder_keep_their_own_lengths(tmp_path: Path) -> None:
    train = _data(tmp_path / "data", [1, 4])
    models = [_model(tmp_path / f"model-{n}", f'{{"model": {n}}}') for n in range(prompt_lengths.RECORD_ENTRIES + 1)]
    loads: list[Path] = []
    for model in [models[0], models[1], models[0], models[1]]:
        assert measure([train], model, "prompt", print, load=_counting_loader(loads)).longest == BASE + 4
    assert loads == models[:2]  # each measured once, however they alternate
    for model in models[1:]:  # one more than a folder keeps: the one longest unused (model 0) goes
        measure([train], model, "prompt", print, load=_counting_loader(loads))
    record = json.loads((tmp_path / "data" / prompt_lengths.RECORD).read_text())
    assert len(record["entries"]) == prompt_lengths.RECORD_ENTRIES
    measure([train], models[0], "prompt", print, load=_counting_loader(loads))
    assert loads == [*models[:2], *models[2:], models[0]]


def test_the_entry_dropped_is_the_one_longest_unused(tmp_path: Path) -> None:
    train = _data(tmp_path / "data", [3])
    models = [_model(tmp_path / f"model-{n}", f'{{"model": {n}}}') for n in range(prompt_lengths.RECORD_ENTRIES + 1)]
    loads: list[Path] = []
    for model in [*models[:-1], models[0], models[-1], models[0]]:  # model 0 used again before the last comes
        measure([train], model, "prompt", print, load=_counting_loader(loads))
    assert loads == models  # model 1 went, not model 0
    measure([train], models[1], "prompt", print, load=_counting_loader(loads))
    assert loads == [*models, models[1]]


def test_prepare_data_records_for_a_train_run_that_trusts_remote_code(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prepare-data --model DIR --trust-remote-code` loads the tokenizer as such a run would, and the run
    finds every length recorded."""
    loaded: list[bool] = []

    def load(model_dir: Path, trust_remote_code: bool = False) -> WordTokenizer:
        loaded.append(trust_remote_code)
        return WordTokenizer()

    monkeypatch.setattr(prompt_lengths, "load_tokenizer", load)
    monkeypatch.setattr(commands, "_missing", lambda *modules: [])  # transformers: the image has it
    out = tmp_path / "gsm8k"
    arguments = {"source": str(jsonl_layout(tmp_path / "raw")), "out": str(out), "validation_size": 2}
    commands.prepare_data(Namespace(**arguments, model=str(model), trust_remote_code=True))
    assert loaded == [True]
    overrides = [
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'validation.parquet'}",
        f"{KEY}=256",
        f"actor_rollout_ref.model.path={model}",
        "data.trust_remote_code=True",
    ]
    said: list[str] = []
    fit_prompt_length(overrides, [], said.append)
    assert loaded == [True] and not any("tokenizing" in line for line in said)


def test_with_remote_code_trusted_the_folder_s_python_files_count(tmp_path: Path, model: Path) -> None:
    """verl's data.trust_remote_code may load a tokenizer class from the model folder: another class, or an
    edit of it, may count tokens differently."""
    train = _data(tmp_path / "data", [2])
    loads: list[Path] = []

    def lengths(trusted: bool) -> int:
        return measure([train], model, "prompt", print, trusted, load=_counting_loader(loads)).longest

    lengths(False)
    (model / "tokenization_custom.py").write_text("# a tokenizer class\n")
    lengths(False)  # not trusted: the Python file is never run, so it cannot change a length
    assert len(loads) == 1
    lengths(True)
    lengths(True)
    assert len(loads) == 2
    (model / "tokenization_custom.py").write_text("# the class, edited\n")
    lengths(True)
    lengths(False)  # the untrusted entry is still there
    assert len(loads) == 3


def test_a_width_the_user_gave_is_kept_and_nothing_is_measured(tmp_path: Path) -> None:
    overrides = [f"{KEY}=100", f"data.train_files={tmp_path}/absent.parquet", "actor_rollout_ref.model.path=/nowhere"]
    assert fit_prompt_length(overrides, [f"{KEY}=100"], print) == overrides


def test_a_record_that_cannot_be_written_is_said_and_the_run_goes_on(tmp_path: Path, model: Path) -> None:
    # root (CI) writes through any mode: a folder in the record's place refuses the write for everyone
    train = _data(tmp_path / "data", [3])
    (tmp_path / "data" / prompt_lengths.RECORD).mkdir()
    said: list[str] = []
    assert measure([train], model, "prompt", said.append, load=_counting_loader([])).longest == BASE + 3
    assert said[-1].startswith("prompt lengths: not recorded (") and "cannot write here" in said[-1]
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == [prompt_lengths.RECORD, "train.parquet"]


def test_train_measures_with_verls_remote_code_flag_and_lowers_the_width(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = _data(tmp_path / "data", [4, 9])
    validation = _data(tmp_path / "validation", [11])
    loaded: list[tuple[Path, bool]] = []

    def load(model_dir: Path, trust_remote_code: bool = False) -> WordTokenizer:
        loaded.append((model_dir, trust_remote_code))
        return WordTokenizer()

    monkeypatch.setattr(prompt_lengths, "load_tokenizer", load)
    overrides = [
        f"data.train_files={train}",
        f"data.val_files={validation}",
        f"{KEY}=256",
        f"actor_rollout_ref.model.path={model}",
        "data.trust_remote_code=True",
    ]
    said: list[str] = []
    assert f"{KEY}={BASE + 11}" in fit_prompt_length(overrides, [], said.append)
    assert loaded == [(model, True)]
    assert (tmp_path / "data" / prompt_lengths.RECORD).is_file()
    assert (tmp_path / "validation" / prompt_lengths.RECORD).is_file()


def test_a_tokenizer_transformers_cannot_load_is_a_preflight_line_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class DamagedTokenizerJson:
        @staticmethod
        def from_pretrained(folder: Path, **options: object) -> None:
            # as tokenizers' Rust side raises it for a tokenizer.json whose merges name tokens not in its vocab
            raise Exception("Error while initializing BPE: Token `t` out of vocabulary\nmore detail")

    monkeypatch.setitem(sys.modules, "transformers", SimpleNamespace(AutoTokenizer=DamagedTokenizerJson))
    with pytest.raises(PreflightFailed) as refused:
        prompt_lengths.load_tokenizer(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: its tokenizer cannot be loaded (Exception: Error while initializing BPE: Token `t` out of "
        "vocabulary)"
    )
