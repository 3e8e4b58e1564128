"""GSM8K from a local download to verl's parquet rows, exactly as verl's own gsm8k preprocessing makes them.

Accepted sources (no hub access is attempted here; `train` fetches a missing download first, see hub.py):
the hub's layout (main/train-*.parquet, main/test-*.parquet), a `datasets.save_to_disk` folder
(dataset_dict.json + one folder per split), or train.jsonl / test.jsonl with `question` and `answer`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from verlbox.errors import VerlboxError
from verlbox.files import default_mode

if TYPE_CHECKING:  # pyarrow is imported where it is used: the host's `verlbox` runs without it
    import pyarrow as pa

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
# the files prepare_gsm8k writes into its folder
PREPARED = tuple(f"{name}.parquet" for name in (*SPLITS, "validation"))
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


class DataError(VerlboxError):
    exit_code = 2


def ground_truth(answer: str) -> str:
    match = _FINAL_ANSWER.search(answer)
    if match is None:
        raise ValueError("no '#### <number>' final answer")
    return match.group(1).replace(",", "")


def to_verl_row(question: str, answer: str, split: str, index: int) -> dict[str, object]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def _read_split(source: Path, split: str) -> tuple[Path, list[dict[str, object]]]:
    hub = sorted((source / "main").glob(f"{split}-*.parquet")) or sorted(source.glob(f"{split}-*.parquet"))
    if hub:
        return hub[0], [row for path in hub for row in _table(path).to_pylist()]
    arrow = sorted((source / split).glob("*.arrow")) if (source / "dataset_dict.json").is_file() else []
    if arrow:
        return arrow[0], [row for path in arrow for row in _table(path).to_pylist()]
    jsonl = source / f"{split}.jsonl"
    if jsonl.is_file():
        rows = []
        for number, line in enumerate(jsonl.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{jsonl}:{number}: not JSON ({exc.msg})") from None
        return jsonl, rows
    raise DataError(
        f"no GSM8K {split} split in {source}: expected main/{split}-00000-of-00001.parquet "
        f"(the hub's layout), a datasets.save_to_disk folder ({split}/*.arrow beside "
        f"dataset_dict.json) or {split}.jsonl"
    )


def _table(path: Path) -> pa.Table:
    """A parquet file, or an arrow stream as datasets.save_to_disk writes them; a file pyarrow cannot read
    (cut short, say) is named in one line, not an ArrowInvalid traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import ipc

    try:
        if path.suffix == ".arrow":
            with path.open("rb") as handle:
                return ipc.open_stream(handle).read_all()
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path} is not readable by pyarrow ({exc}): copy or fetch it again") from None


def parquet_rows(path: Path) -> int:
    """PATH's row count from its footer alone (cheap at any size); a file verl could not read is a DataError.

    A half-copied file has no footer: `exists` passes it, verl's dataloader would not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path} is not a readable parquet file ({exc})") from None
    if not rows:
        raise DataError(f"{path} holds no rows")
    return rows


def _convert(path: Path, rows: list[dict[str, object]], split: str) -> list[dict[str, object]]:
    converted = []
    for index, row in enumerate(rows):
        missing = [column for column in ("question", "answer") if not isinstance(row.get(column), str)]
        if missing:
            raise DataError(
                f"{path}: row {index} has no text column {missing[0]!r} (columns: {', '.join(sorted(row)) or 'none'})"
            )
        try:
            converted.append(to_verl_row(str(row["question"]), str(row["answer"]), split, index))
        except ValueError as exc:
            raise DataError(f"{path}: row {index} answer: {exc}") from None
    if not converted:
        raise DataError(f"{path}: the {split} split is empty")
    return converted


def write_parquet(rows: list[dict[str, object]], target: Path) -> bool:
    """Write atomically; return False when the file already held exactly these rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    if target.is_file() and _holds(target, table):
        return False
    # mkstemp makes 0600 files: keep the old file's mode, or give the one an ordinary write would
    mode = target.stat().st_mode & 0o7777 if target.is_file() else default_mode()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, temporary)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def _holds(target: Path, table: pa.Table) -> bool:
    """Whether TARGET already holds TABLE; a broken TARGET (a half-copied file) does not, and is replaced."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(target).equals(table)
    except (pa.ArrowException, OSError):
        return False


def prepare_gsm8k(source: Path, out: Path, validation_size: int = 256) -> dict[str, tuple[int, bool]]:
    """Write train.parquet, test.parquet and validation.parquet (the first N test rows) into `out`.

    Returns, per file, its row count and whether it changed. Nothing is written unless every split reads.
    """
    if not source.exists():
        raise DataError(f"--source {source}: no such file or folder")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file: give a folder for the parquet files")
    splits = {}
    for split in SPLITS:
        path, rows = _read_split(source, split)
        splits[split] = _convert(path, rows, split)
    splits["validation"] = splits["test"][:validation_size]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"--out {out}: cannot make this folder ({exc.strerror or exc})") from None
    return {name: (len(rows), write_parquet(rows, out / f"{name}.parquet")) for name, rows in splits.items()}
