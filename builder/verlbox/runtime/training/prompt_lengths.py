"""data.max_prompt_length from the data: every prompt's length as verl tokenizes it, measured once per data
file and tokenizer and recorded beside the parquet files (prompt-lengths.json).

verl pads every prompt on the left to data.max_prompt_length. HF generation computes all of those columns
and keeps them in its KV cache for every decoded token, so a length above the data's longest prompt is work
that changes nothing. The profile's value is a ceiling: a run gets the data's longest prompt when that is
shorter, and is told how many prompts the ceiling leaves out when some are longer. A value the user sets is
kept as given.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import PreflightFailed, UsageError
from verlbox.files import write_atomically
from verlbox.runtime.steps.apex_build import file_sha256
from verlbox.runtime.training.data import DataError
from verlbox.runtime.training.overrides import merge_overrides, override_value

KEY = "data.max_prompt_length"
RECORD = "prompt-lengths.json"
RECORD_FORMAT = 2
# tokenizers (with prompt keys) one data folder keeps measurements for: two models trained on one folder
# never measure again for each other; the oldest goes first
RECORD_ENTRIES = 4
# what AutoTokenizer reads from a model folder: a change to any of them can change a prompt's length
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


class FileLengths(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str
    # prompt length in tokens -> how many prompts have it (JSON keys are text)
    lengths: dict[int, int]


class Entry(BaseModel):
    """One tokenizer's lengths of one prompt column, per data file."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: str
    prompt_key: str
    files: dict[str, FileLengths]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int
    entries: list[Entry]

    def entry(self, tokenizer: str, prompt_key: str) -> tuple[Entry, bool]:
        """The entry for TOKENIZER and PROMPT_KEY, made (and the first beyond RECORD_ENTRIES dropped) when there
        is none, and moved last, so that the first is the one longest unused; and whether the order changed."""
        found = next((e for e in self.entries if (e.tokenizer, e.prompt_key) == (tokenizer, prompt_key)), None)
        if found is None:
            found = Entry(tokenizer=tokenizer, prompt_key=prompt_key, files={})
        others = [e for e in self.entries if e is not found]
        before, self.entries = self.entries, [*others[max(0, len(others) - RECORD_ENTRIES + 1) :], found]
        return found, self.entries != before


@dataclass(frozen=True)
class PromptLengths:
    counts: Counter[int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def longest(self) -> int:
        return max(self.counts, default=0)

    def longer_than(self, ceiling: int) -> int:
        return sum(count for length, count in self.counts.items() if length > ceiling)


def tokenizer_digest(model_dir: Path, trust_remote_code: bool = False) -> str | None:
    """The tokenizer's files, hashed; None when the folder has none of them (nothing to tell two models apart).
    With remote code trusted, the folder's Python files may be the tokenizer: they count, and so does the flag."""
    files = [(name, file_sha256(model_dir / name)) for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if not files:
        return None
    if trust_remote_code:
        files += [("trust_remote_code", "")] + [(p.name, file_sha256(p)) for p in sorted(model_dir.glob("*.py"))]
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()


def _read_record(path: Path) -> Record | None:
    """The folder's record, or None when there is none, it cannot be read or an older verlbox wrote it."""
    try:
        record = Record.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None
    return record if record.format == RECORD_FORMAT else None


def _tokenized_lengths(path: Path, tokenizer: object, prompt_key: str) -> Counter[int]:
    """What verl's RLHFDataset filter measures: the chat template applied with the generation prompt, tokenized."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if prompt_key not in table.column_names:
        columns = ", ".join(table.column_names)
        raise DataError(f"{path}: no column {prompt_key!r} (data.prompt_key; the file has {columns})")
    prompts = table.column(prompt_key).to_pylist()
    apply = tokenizer.apply_chat_template  # type: ignore[attr-defined]
    return Counter(len(apply(messages, add_generation_prompt=True)) for messages in prompts)


def load_tokenizer(model_dir: Path, trust_remote_code: bool = False) -> object:
    """MODEL_DIR's tokenizer as verl loads it (its data.trust_remote_code), from the folder only: a mistyped
    path is an error here, never a download."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # tokenizers' Rust side raises a bare Exception for a damaged tokenizer.json
        why = (str(exc).strip().splitlines() or [""])[0]
        raise PreflightFailed(f"{model_dir}: its tokenizer cannot be loaded ({type(exc).__name__}: {why})") from exc


def measure(
    files: Iterable[Path],
    model_dir: Path,
    prompt_key: str,
    say: Callable[[str], None],
    trust_remote_code: bool = False,
    load: Callable[[Path], object] | None = None,
) -> PromptLengths:
    """Every prompt's length in FILES with MODEL_DIR's tokenizer (loaded with verl's data.trust_remote_code,
    by LOAD when given): from each folder's record when it holds the same file, tokenizer and prompt key,
    else measured now and recorded there."""
    digest = tokenizer_digest(model_dir, trust_remote_code)
    tokenizer = None
    counts: Counter[int] = Counter()
    for path in files:
        record_path = path.parent / RECORD
        record = (_read_record(record_path) if digest else None) or Record(format=RECORD_FORMAT, entries=[])
        entry, moved = record.entry(digest or "", prompt_key)
        sha256 = file_sha256(path)
        known = entry.files.get(path.name)
        measured = known is None or known.sha256 != sha256
        if measured:
            # the real tokenizer takes seconds to load: a start whose files are all recorded never needs it
            if tokenizer is None:
                tokenizer = (load or functools.partial(load_tokenizer, trust_remote_code=trust_remote_code))(model_dir)
            say(f"prompt lengths: tokenizing {path.name}'s prompts with {model_dir.name}'s chat template")
            known = FileLengths(sha256=sha256, lengths=dict(_tokenized_lengths(path, tokenizer, prompt_key)))
            entry.files[path.name] = known
        # a record that could not tell this tokenizer from another would mislead the next start; one only
        # reordered that cannot be written costs nothing now, so it is not said at every start
        if digest and (measured or moved):
            _write_record(record_path, record, say if measured else lambda _: None)
        counts.update(known.lengths)
    return PromptLengths(counts)


def _write_record(path: Path, record: Record, say: Callable[[str], None]) -> None:
    try:
        write_atomically(path, record.model_dump_json(indent=1) + "\n")
    except UsageError as exc:  # a read-only data folder: measured again at the next start
        say(f"prompt lengths: not recorded ({exc})")


def fitted(overrides: list[str], lengths: PromptLengths, say: Callable[[str], None]) -> list[str]:
    """OVERRIDES with data.max_prompt_length lowered to the longest prompt when the profile's ceiling is above it."""
    ceiling = int(override_value(overrides, KEY) or 0)
    if not ceiling or not lengths.total:  # verl's own default applies, or there is nothing to fit to
        return overrides
    longer = lengths.longer_than(ceiling)
    if longer:
        say(
            f"prompt lengths: {longer} of {lengths.total} prompts are longer than {ceiling} tokens ({KEY}): "
            + _overlong_fate(overrides)
        )
    length = min(ceiling, lengths.longest)
    if length == ceiling:
        return overrides
    say(
        f"prompt lengths: {KEY}={length}, the longest of {lengths.total} prompts "
        f"(the profile's {ceiling} is a ceiling: a longer width is padding computed in every generated token)"
    )
    return merge_overrides(overrides, [f"{KEY}={length}"])


def _overlong_fate(overrides: list[str]) -> str:
    """What verl 0.4.1 does with a prompt over the width; unset, its ppo_trainer.yaml has the filter off and
    truncation "error" (Hydra reads true/True alike)."""
    if (override_value(overrides, "data.filter_overlong_prompts") or "false").lower() == "true":
        return "verl leaves them out (data.filter_overlong_prompts)"
    truncation = (override_value(overrides, "data.truncation") or "error").lower()
    if truncation == "error":
        return "verl stops at the first of them (data.truncation=error)"
    return f"verl cuts them to the width (data.truncation={truncation})"
