"""The model and data checks read what verl reads: files a later save needs, parquet files cut short."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from test_data import ROWS, hub_layout
from verlbox.runtime.training import preflight, train
from verlbox.runtime.training.data import prepare_gsm8k
from verlbox.runtime.training.train import DATA_KEYS


def model_folder(folder: Path) -> Path:
    """The files of a hub model folder, with stand-in contents: only names and JSON are checked here."""
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"):
        (folder / name).write_text(json.dumps({"name": name}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_model_without_generation_config_is_named_with_the_fix(tmp_path: Path) -> None:
    model = model_folder(tmp_path / "model")
    (model / "generation_config.json").unlink()
    check = preflight.check_model(model)
    assert not check.ok
    assert check.detail == (
        f"{model} has no generation_config.json, which verl reads at every checkpoint save: copy it from the "
        f"model's repository, or empty {model} and `train` fetches the model, or fill it on a connected machine "
        f"with `verlbox fetch model --out {model}` (README: Model and data)"
    )


def test_each_model_file_that_is_no_json_is_its_own_sentence(tmp_path: Path) -> None:
    model = model_folder(tmp_path / "model")
    (model / "generation_config.json").write_text('{"eos_token_id": ')  # cut short
    (model / "tokenizer.json").write_bytes(b"\xff\xfe")
    check = preflight.check_model(model)
    sentences = check.detail.split("; ")
    assert not check.ok and len(sentences) == 2
    assert sentences[0].startswith(f"{model / 'generation_config.json'} does not load as JSON (Expecting value")
    assert sentences[1].startswith(f"{model / 'tokenizer.json'} does not load as JSON (")
    assert all(
        sentence.endswith(f"`verlbox fetch model --out {model}` (README: Model and data)") for sentence in sentences
    )


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[Path, Path]:
    """GSM8K's hub layout and verl's parquet files made from it by the data prep."""
    source = hub_layout(tmp_path / "gsm8k-raw")
    out = tmp_path / "gsm8k"
    prepare_gsm8k(source, out)
    return source, out


def cut_short(path: Path) -> None:
    """The first half of the file, as a copy interrupted halfway leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def verl_files(out: Path) -> list[Path]:
    return [out / "train.parquet", out / "validation.parquet"]


def test_a_cut_short_train_parquet_is_made_again_from_the_source(prepared: tuple[Path, Path]) -> None:
    source, out = prepared
    train = out / "train.parquet"
    train.chmod(0o640)
    cut_short(train)
    said: list[str] = []
    check = preflight.check_data(verl_files(out), source, said.append)
    assert check.ok, check.detail
    assert check.detail == f"{train} (2 rows), {out / 'validation.parquet'} (1 rows)"
    assert pq.ParquetFile(train).metadata.num_rows == len(ROWS["train"])
    assert pq.read_table(train).column("extra_info").to_pylist()[1]["index"] == 1
    assert stat.S_IMODE(train.stat().st_mode) == 0o640  # replaced in place, its mode kept
    [line] = said
    assert line.startswith(f"{train} is not a readable parquet file (")
    assert line.endswith(f"made {out} again from {source} (train 2 rows, test 1 rows, validation 1 rows)")
    assert sorted(path.name for path in out.iterdir()) == ["test.parquet", "train.parquet", "validation.parquet"]


def test_without_the_source_a_cut_short_file_is_one_sentence(prepared: tuple[Path, Path]) -> None:
    _, out = prepared
    train = out / "train.parquet"
    cut_short(train)
    before = train.read_bytes()
    said: list[str] = []
    check = preflight.check_data(verl_files(out), out.parent / "absent", said.append)
    assert not check.ok and said == []
    assert check.detail.startswith(f"{train} is not a readable parquet file (")
    assert check.detail.endswith(
        f": delete it and `train` makes it again (fetching GSM8K into {out.parent / 'absent'} first), "
        f"or make it with `verlbox prepare-data gsm8k --source DIR --out {out}`"
    )
    assert "; " not in check.detail  # the intact validation.parquet is not mentioned
    assert train.read_bytes() == before


def test_a_broken_source_is_named_and_the_parquet_files_stay(prepared: tuple[Path, Path]) -> None:
    source, out = prepared
    raw = source / "main" / "train-00000-of-00001.parquet"
    cut_short(raw)
    cut_short(out / "train.parquet")
    check = preflight.check_data(verl_files(out), source, lambda _: None)
    assert not check.ok
    assert check.detail.startswith(f"{out} has unreadable files; making them again from {source}: {raw} is not ")
    assert check.detail.endswith("copy or fetch it again")


def test_a_users_own_parquet_is_never_replaced_by_gsm8k(prepared: tuple[Path, Path]) -> None:
    source, out = prepared
    mine = out / "mine.parquet"
    mine.write_bytes((out / "train.parquet").read_bytes()[:100])
    check = preflight.check_data([mine], source, lambda _: None)
    assert not check.ok
    assert check.detail.startswith(f"{mine} is not a readable parquet file (")
    assert check.detail.endswith("copy it again (verlbox makes only train.parquet, test.parquet, validation.parquet)")
    assert mine.stat().st_size == 100


def test_rerunning_the_prep_over_a_cut_short_file_replaces_it(prepared: tuple[Path, Path]) -> None:
    source, out = prepared
    cut_short(out / "test.parquet")
    written = prepare_gsm8k(source, out)
    assert written == {"train": (2, False), "test": (1, True), "validation": (1, False)}
    assert pq.ParquetFile(out / "test.parquet").metadata.num_rows == 1


def test_train_checks_a_hand_filled_model_for_what_a_save_needs(prepared: tuple[Path, Path], tmp_path: Path) -> None:
    """The single-host and the cluster preflight share one input check: a folder filled by hand (no fetch
    record) still has its generation_config.json looked for before step 1, not at the save of step 25."""
    source, out = prepared
    model = model_folder(tmp_path / "model")
    (model / "generation_config.json").unlink()
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        *(f"{key}={path}" for key, path in zip(DATA_KEYS, verl_files(out), strict=True)),
    ]
    environ = {"HF_HUB_OFFLINE": "1", "VERLBOX_GSM8K_SOURCE": str(source)}
    model_check, data_check = train.inputs_ready(overrides, environ, Console(file=io.StringIO()))
    assert data_check.ok, data_check.detail
    assert not model_check.ok and f"{model} has no generation_config.json" in model_check.detail
    (model / "generation_config.json").write_text("{}")
    model_check, data_check = train.inputs_ready(overrides, environ, Console(file=io.StringIO()))
    assert data_check.ok and "generation_config.json" not in model_check.detail  # on to loading it
