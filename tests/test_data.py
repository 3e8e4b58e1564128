"""GSM8K prep from each local layout into verl's exact rows."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import run_verlbox
from verlbox.runtime.training.data import DataError, prepare_gsm8k

ROWS = {
    "train": [
        {"question": "Natalia sold 48 clips. How many?", "answer": "She sold 48 + 24 = 72.\n#### 72"},
        {"question": "A farm has 1,200 cows and buys 300.", "answer": "1,200 + 300 = 1,500\n#### 1,500"},
    ],
    "test": [{"question": "What is 2 minus 5?", "answer": "2 - 5 = -3\n#### -3"}],
}


def hub_layout(folder: Path) -> Path:
    (folder / "main").mkdir(parents=True)
    for split, rows in ROWS.items():
        pq.write_table(pa.Table.from_pylist(rows), folder / "main" / f"{split}-00000-of-00001.parquet")
    return folder


def jsonl_layout(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for split, rows in ROWS.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def save_to_disk_layout(folder: Path) -> Path:
    """The files datasets.save_to_disk writes: an arrow stream per split beside dataset_dict.json."""
    folder.mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(ROWS)}))
    for split, rows in ROWS.items():
        (folder / split).mkdir()
        table = pa.Table.from_pylist(rows)
        with (
            pa.OSFile(str(folder / split / "data-00000-of-00001.arrow"), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(table)
    return folder


@pytest.mark.parametrize("layout", [hub_layout, jsonl_layout, save_to_disk_layout])
def test_every_layout_gives_verls_exact_rows(tmp_path: Path, layout) -> None:
    written = prepare_gsm8k(layout(tmp_path / "source"), tmp_path / "out")
    assert written == {"train": (2, True), "test": (1, True), "validation": (1, True)}
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert train[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": "A farm has 1,200 cows and buys 300. Let's think step by step and "
                'output the final answer after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1500"},
        "extra_info": {
            "split": "train",
            "index": 1,
            "answer": ROWS["train"][1]["answer"],
            "question": ROWS["train"][1]["question"],
        },
    }
    test = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert test[0]["reward_model"]["ground_truth"] == "-3" and test[0]["extra_info"]["split"] == "test"


def test_second_run_is_a_no_op(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "source")
    prepare_gsm8k(source, tmp_path / "out")
    stamp = (tmp_path / "out" / "train.parquet").stat().st_mtime_ns
    assert prepare_gsm8k(source, tmp_path / "out") == {
        "train": (2, False),
        "test": (1, False),
        "validation": (1, False),
    }
    assert (tmp_path / "out" / "train.parquet").stat().st_mtime_ns == stamp


def test_validation_is_a_fixed_slice_of_test(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "source")
    (source / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n" for i in range(300))
    )
    assert prepare_gsm8k(source, tmp_path / "out")["validation"] == (256, True)
    assert prepare_gsm8k(source, tmp_path / "o2", validation_size=8)["validation"] == (8, True)


def test_missing_column_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "source")
    (source / "test.jsonl").write_text(json.dumps({"question": "q", "solution": "#### 1"}) + "\n")
    with pytest.raises(
        DataError, match=re.escape("test.jsonl: row 0 has no text column 'answer' (columns: question, solution)")
    ):
        prepare_gsm8k(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_answer_without_final_number(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "source")
    (source / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "no idea"}) + "\n")
    with pytest.raises(DataError, match="row 0 answer: no '#### <number>' final answer"):
        prepare_gsm8k(source, tmp_path / "out")


def test_cli_missing_files_exit_2_with_the_expected_layouts(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_verlbox("prepare-data", "gsm8k", "--source", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "no GSM8K train split" in result.stderr and "main/train-00000-of-00001.parquet" in result.stderr
    ok = run_verlbox(
        "prepare-data", "gsm8k", "--source", str(jsonl_layout(tmp_path / "s")), "--out", str(tmp_path / "o")
    )
    assert ok.returncode == 0 and "train.parquet: 2 rows" in ok.stdout


def hide_modules(tmp_path: Path, *names: str) -> dict[str, str]:
    """The environment of a Python that cannot import NAMES, as on a host without them (a sitecustomize)."""
    shim = tmp_path / "hidden-modules"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(f"import sys\n\nfor name in {names!r}:\n    sys.modules[name] = None\n")
    return {"PYTHONPATH": str(shim)}


def test_cli_without_pyarrow_says_what_to_do(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "s")
    result = run_verlbox(
        "prepare-data",
        "gsm8k",
        "--source",
        str(source),
        "--out",
        str(tmp_path / "o"),
        env=hide_modules(tmp_path, "pyarrow"),
    )
    assert result.returncode == 2
    assert result.stderr == (
        "verlbox: error: prepare-data needs pyarrow, which is not installed here: `pip install pyarrow`, "
        "or run it in the image (`verlbox shell --no-gpu -- verlbox prepare-data gsm8k --source /data/gsm8k-raw "
        "--out /data/gsm8k`: the run folder's data/ is /data there), or let `train` prepare it on first start\n"
    )
    assert not (tmp_path / "o").exists()


def test_cli_model_without_transformers_says_what_to_do_and_writes_nothing(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "s")
    out = tmp_path / "o"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    command = ("prepare-data", "gsm8k", "--source", str(source), "--out", str(out), "--model", str(tmp_path / "m"))
    result = run_verlbox(*command, env=hide_modules(tmp_path, "transformers"))
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.startswith("verlbox: error: prepare-data --model needs transformers, which is not installed")


def test_cli_trust_remote_code_without_a_model_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "o"
    command = ("prepare-data", "gsm8k", "--source", str(jsonl_layout(tmp_path / "s")), "--out", str(out))
    result = run_verlbox(*command, "--trust-remote-code")
    assert result.returncode == 2 and not out.exists()
    assert result.stderr == (
        "verlbox: error: --trust-remote-code goes with --model (it says how to load the model's tokenizer)\n"
    )


def test_cli_model_that_is_no_tokenizer_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "o"
    absent = tmp_path / "models" / "Qwen"
    command = ("prepare-data", "gsm8k", "--source", str(jsonl_layout(tmp_path / "s")), "--out", str(out))
    # transformers hidden as well: the folder is checked first, on a host with or without it
    hidden = hide_modules(tmp_path, "transformers")
    result = run_verlbox(*command, "--model", str(absent), env=hidden)
    assert result.returncode == 2 and not out.exists()
    said = f"--model {absent}: no such folder (the model's folder, for its tokenizer)"
    assert result.stderr == f"verlbox: error: {said}\n"
    absent.mkdir(parents=True)
    (absent / "config.json").write_text("{}")
    result = run_verlbox(*command, "--model", str(absent), env=hidden)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.startswith(f"verlbox: error: --model {absent}: no tokenizer files in it (tokenizer.json, ")


def test_parquet_files_get_the_mode_an_ordinary_write_gives(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "source")
    umask = os.umask(0o027)
    try:
        prepare_gsm8k(source, tmp_path / "out")
        (tmp_path / "out" / "train.parquet").chmod(0o604)
        (source / "train.jsonl").write_text(json.dumps(ROWS["train"][0]) + "\n")
        assert prepare_gsm8k(source, tmp_path / "out")["train"] == (1, True)
    finally:
        os.umask(umask)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "out").iterdir()}
    # a new file: 0666 less the umask (not mkstemp's 0600); a rewritten one keeps the mode it had
    assert modes == {"train.parquet": 0o604, "test.parquet": 0o640, "validation.parquet": 0o640}


def test_cli_out_that_is_a_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    source = jsonl_layout(tmp_path / "s")
    out = tmp_path / "gsm8k.parquet"
    out.write_text("mine")
    result = run_verlbox("prepare-data", "gsm8k", "--source", str(source), "--out", str(out))
    assert result.returncode == 2
    assert result.stderr == f"verlbox: error: --out {out} is a file: give a folder for the parquet files\n"
    assert out.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k.parquet", "s"]
