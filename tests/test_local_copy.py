"""`verlbox fetch model --from DIR`: a model from a folder on this machine (the Hugging Face cache, a folder `fetch`
filled, a plain model folder), left as `fetch` leaves it, for hosts that reach no hub."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.errors import UsageError
from verlbox.runtime.training import hub
from verlbox.runtime.training.hub import RECORD, FetchError, Source, read_record
from verlbox.runtime.training.local_copy import copy_in

REPO_ID = "Qwen/Qwen2.5-0.5B-Instruct"
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
OLDER = "aa8e72537993ba99e69dfaafa59ed015b17504d1"
MODEL_FILES = {
    "config.json": b'{"model_type": "qwen2"}',
    "generation_config.json": b"{}",
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": b"\x00weights" * 1000,
}
EXPECTED = "expected a model's folder (config.json and *.safetensors) or the Hugging Face cache"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # no hub is asked: none would answer


def source(revision: str = "main", repo: str = REPO_ID) -> Source:
    return Source("model", repo, revision)


def cache_with(root: Path, files: dict[str, bytes], commit: str = COMMIT, ref: str | None = "main") -> Path:
    """A Hugging Face hub cache as huggingface_hub leaves it: blobs named by their hash (sha256 for the weights,
    git's blob id for the rest), a snapshot of links to them, refs/REF naming the commit. Returns the snapshot."""
    repository = root / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = repository / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repository / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        if name.endswith(".safetensors"):
            blob = hashlib.sha256(data).hexdigest()
        else:
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
        (repository / "blobs" / blob).write_bytes(data)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(os.path.relpath(repository / "blobs" / blob, (snapshot / name).parent))
    if ref:
        (repository / "refs").mkdir(exist_ok=True)
        (repository / "refs" / ref).write_text(commit)
    return snapshot


def plain_model(folder: Path, files: dict[str, bytes] = MODEL_FILES) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_hf_cache_is_copied_checked_and_recorded_as_fetch_leaves_a_folder(tmp_path: Path) -> None:
    """Given the cache folder itself (HF_HUB_CACHE): the repository and its `main` found in it; the target holds
    plain files and a record that `fetch` (and so `train`) accepts with no hub to ask."""
    cache_with(tmp_path / "hub", MODEL_FILES)
    out = tmp_path / "run" / "models" / "Qwen2.5-0.5B-Instruct"
    copied = run_verlbox("fetch", "model", "--from", str(tmp_path / "hub"), "--out", str(out), env=OFFLINE)
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.strip().startswith(f"copied {REPO_ID} at {COMMIT[:12]}, 4 files from ")
    record = read_record(out)
    assert record is not None
    assert (record.repo, record.repo_type, record.revision, record.commit) == (REPO_ID, "model", "main", COMMIT)
    assert {entry.path: entry.sha256 for entry in record.files} == {
        name: hashlib.sha256(data).hexdigest() for name, data in MODEL_FILES.items()
    }
    for name, data in MODEL_FILES.items():
        assert not (out / name).is_symlink() and (out / name).read_bytes() == data
    assert sorted(path.name for path in out.parent.iterdir()) == ["Qwen2.5-0.5B-Instruct"]  # no staging left
    again = run_verlbox("fetch", "model", "--out", str(out), env=OFFLINE)
    assert again.returncode == 0 and "matches its verlbox-fetch.json" in again.stdout, again.stderr


def test_a_run_folder_s_model_folder_is_filled_from_hf_home(tmp_path: Path) -> None:
    cache_with(tmp_path / "hf-home" / "hub", MODEL_FILES)
    run = tmp_path / "run"
    (run / "models").mkdir(parents=True)
    (run / ".env").write_text("VERLBOX_MODELS=./models\nVERLBOX_MODEL_NAME=Qwen2.5-0.5B-Instruct\n")
    copied = run_verlbox("fetch", "model", "--from", str(tmp_path / "hf-home"), cwd=run, env=OFFLINE)
    assert copied.returncode == 0, copied.stderr
    assert read_record(run / "models" / "Qwen2.5-0.5B-Instruct") is not None


def test_a_damaged_cache_blob_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    snapshot = cache_with(tmp_path / "hub", MODEL_FILES)
    blob = (snapshot / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")  # one byte changed, the size kept
    out = tmp_path / "models" / "Qwen2.5-0.5B-Instruct"
    with pytest.raises(FetchError, match=r"model\.safetensors does not match its blob in the Hugging Face cache"):
        copy_in(source(), tmp_path / "hub", out, print)
    assert list((tmp_path / "models").iterdir()) == []


def test_a_snapshot_is_taken_by_its_commit_and_a_pinned_revision_must_be_it(tmp_path: Path) -> None:
    cache_with(tmp_path / "hub", MODEL_FILES, commit=COMMIT)
    older = cache_with(tmp_path / "hub", MODEL_FILES, commit=OLDER, ref=None)
    out = tmp_path / "older"
    said = copy_in(source(), older, out, print)  # named directly: used with the default main, as fetch does
    assert said.startswith(f"copied {REPO_ID} at {OLDER[:12]}")
    record = read_record(out)
    assert record is not None and (record.revision, record.commit) == (OLDER, OLDER)
    with pytest.raises(
        UsageError, match=rf"^--from {older}: its snapshot {OLDER[:12]} is not v2 .*main = {COMMIT[:12]}"
    ):
        copy_in(source("v2"), older, tmp_path / "v2", print)
    pinned = copy_in(source(OLDER), tmp_path / "hub", tmp_path / "pinned", print)  # a commit picks its snapshot
    assert OLDER[:12] in pinned


def test_two_snapshots_and_no_ref_ask_which(tmp_path: Path) -> None:
    cache_with(tmp_path / "hub", MODEL_FILES, commit=COMMIT, ref=None)
    cache_with(tmp_path / "hub", MODEL_FILES, commit=OLDER, ref=None)
    with pytest.raises(UsageError, match=r"no snapshot of main in .*snapshots \(it holds 7ae557604adf, aa8e72537993\)"):
        copy_in(source(), tmp_path / "hub", tmp_path / "out", print)


def test_a_cache_of_another_repository_is_named(tmp_path: Path) -> None:
    snapshot = cache_with(tmp_path / "hub", MODEL_FILES)
    with pytest.raises(
        UsageError, match=rf"holds model {REPO_ID}, not Qwen/Qwen2.5-1.5B \(--repo or VERLBOX_MODEL_REPO\)"
    ):
        copy_in(source(repo="Qwen/Qwen2.5-1.5B"), snapshot, tmp_path / "out", print)


def test_a_plain_model_folder_is_recorded_without_a_commit(tmp_path: Path) -> None:
    given = plain_model(tmp_path / "mine")
    (given / ".cache" / "huggingface").mkdir(parents=True)  # a hub client's local_dir state: not part of the model
    (given / ".cache" / "huggingface" / "x.lock").write_text("")
    out = tmp_path / "out"
    said = copy_in(source(), given, out, print)
    assert said.startswith(f"copied {REPO_ID} (no commit known), 4 files from {given}")
    record = read_record(out)
    assert record is not None and record.commit == "" and record.endpoint == given.resolve().as_uri()
    assert not (out / ".cache").exists()
    assert hub.check_record(out, record, source()).startswith(f"{out} matches its {RECORD}")


def test_a_folder_fetch_filled_is_checked_then_copied_with_its_record(tmp_path: Path) -> None:
    first = tmp_path / "first"
    copy_in(source(), cache_with(tmp_path / "hub", MODEL_FILES), first, print)
    second = tmp_path / "second"
    copy_in(source(), first, second, print)
    assert (second / RECORD).read_text() == (first / RECORD).read_text()
    (first / "tokenizer.json").write_bytes(b"changed!!!!!!!!!!!")  # same size: only the hash tells
    with pytest.raises(FetchError, match=r"tokenizer\.json does not match .*its sha256 differs"):
        copy_in(source(), first, tmp_path / "third", print)


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (
            {"model.safetensors": b"w"},
            "no config.json there: " + EXPECTED,
        ),
        ({"config.json": b"{}", "README.md": b"hi"}, "a config.json but no weights (*.safetensors): " + EXPECTED),
        (
            {
                "config.json": b"{}",
                "model-00001-of-00002.safetensors": b"w",
                "model.safetensors.index.json": json.dumps(
                    {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
                ).encode(),
            },
            "model.safetensors.index.json names model-00002-of-00002.safetensors, not there (a partial download?)",
        ),
    ],
    ids=["no-config", "no-weights", "missing-shard"],
)
def test_a_folder_that_is_no_whole_model_is_one_line_exit_2(tmp_path: Path, files: dict[str, bytes], said: str) -> None:
    given = plain_model(tmp_path / "given", files)
    out = tmp_path / "out"
    refused = run_verlbox("fetch", "model", "--from", str(given), "--out", str(out), env=OFFLINE)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"verlbox: error: --from {given}: {said}"
    assert not out.exists()


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    refused = run_verlbox("fetch", "model", "--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"))
    assert (
        refused.returncode == 2
        and refused.stderr.strip() == f"verlbox: error: --from {tmp_path / 'nowhere'}: no such folder"
    )


def test_a_target_that_holds_other_files_is_refused(tmp_path: Path) -> None:
    given = plain_model(tmp_path / "given")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stray.txt").write_text("x")
    with pytest.raises(UsageError, match=rf"^{out} already holds files but no {RECORD}"):
        copy_in(source(), given, out, print)
