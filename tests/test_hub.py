"""Model and GSM8K from a stand-in hub: the real huggingface_hub client against a local server in the hub's layout.

The stand-in answers what snapshot_download asks: GET /api/{models,datasets}/REPO/revision/REV (the file list,
with sizes and hashes under ?blobs=True), then HEAD and GET /[datasets/]REPO/resolve/COMMIT/PATH (with Range
for a resumed file). It can drop a connection half-way through a file, serve a file other than it lists, list a
file without its hash, or list a file to the client's own second listing only.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pty
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from conftest import run_verlbox
from standins import closed_port_url
from test_data import hide_modules
from verlbox.errors import UsageError
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import hub, preflight, train
from verlbox.runtime.training.environment import SETTINGS_SOURCE
from verlbox.runtime.training.hub import RECORD, FetchError, Hub, Source
from verlbox.runtime.training.preflight import GpuDevice, GpuFacts
from verlbox.runtime.training.profile import Topology, TrainingPlan

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
WEIGHTS = "model.safetensors"
LFS_SUFFIXES = (".safetensors", ".parquet")
GSM8K_ROWS = {
    "train": [{"question": "Natalia sold 48 clips. How many?", "answer": "48 + 24 = 72\n#### 72"}],
    "test": [{"question": "What is 2 minus 5?", "answer": "2 - 5 = -3\n#### -3"}],
}


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(f"blob {len(content)}\0".encode() + content).hexdigest()


def sibling(name: str, content: bytes) -> dict[str, object]:
    """A file as the hub lists it with ?blobs=True: LFS files carry their sha256, the rest their git blob id."""
    if not name.endswith(LFS_SUFFIXES):
        return {"rfilename": name, "size": len(content), "blobId": git_blob_id(content)}
    sha256 = hashlib.sha256(content).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(content)}\n".encode()
    lfs = {"size": len(content), "sha256": sha256, "pointerSize": len(pointer)}
    return {"rfilename": name, "size": len(content), "blobId": git_blob_id(pointer), "lfs": lfs}


@dataclass
class StandInHub:
    endpoint: str = ""
    # (repo type, repo) -> {"refs": {branch: commit}, "commits": {commit: {path: bytes}}}
    repos: dict[tuple[str, str], dict[str, dict]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)  # path -> GETs left to cut off half-way
    corrupt: set[str] = field(default_factory=set)  # paths served with other bytes than listed
    tokens: dict[str, str] = field(default_factory=dict)  # private repo -> the token it wants
    relisted: dict[str, dict[str, object]] = field(default_factory=dict)  # path -> keys its listing shows instead
    sneaked: dict[str, bytes] = field(default_factory=dict)  # files listed only without ?blobs=True, and served
    bare_404: bool = False  # a mirror or proxy: a 404 without the hub's X-Error-Code
    stalls: dict[str, int] = field(default_factory=dict)  # path -> bytes served before the rest waits for release
    release: threading.Event = field(default_factory=threading.Event)

    def publish(self, repo_type: str, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        commit = hashlib.sha1(repr((repo, sorted(files.items()))).encode()).hexdigest()
        entry = self.repos.setdefault((repo_type, repo), {"refs": {}, "commits": {}})
        entry["commits"][commit] = files
        entry["refs"][branch] = commit
        return commit

    def resolve(self, repo_type: str, repo: str, revision: str) -> tuple[str | None, str | None]:
        """(commit, None), or (None, the hub's X-Error-Code)."""
        entry = self.repos.get((repo_type, repo))
        if entry is None:
            return None, "RepoNotFound"
        commit = entry["refs"].get(revision) or (revision if revision in entry["commits"] else None)
        return (commit, None) if commit else (None, "RevisionNotFound")

    def gets(self, path: str) -> list[str | None]:
        """The Range header of each GET of a file (None: from the start)."""
        return [rng for method, url, rng in self.requests if method == "GET" and url.endswith("/" + path)]


def handler_for(stand_in: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: the test log is the record
            pass

        def do_GET(self) -> None:
            self.answer(body=True)

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            stand_in.requests.append((self.command, self.path, self.headers.get("Range")))
            words = path.strip("/").split("/")
            private = next((repo for repo in stand_in.tokens if f"/{repo}/" in path), None)
            if private and self.headers.get("Authorization") != f"Bearer {stand_in.tokens[private]}":
                return self.send(401, b"", {})  # as the hub answers for a private repo without its token
            if words[0] == "api":  # api/models/OWNER/NAME/revision/REV
                self.repo_info(words[1].rstrip("s"), "/".join(words[2:4]), words[5], "blobs=" in self.path)
            else:  # [datasets/]OWNER/NAME/resolve/COMMIT/PATH...
                repo_type = "dataset" if words[0] == "datasets" else "model"
                words = words[1:] if repo_type == "dataset" else words
                self.file(repo_type, "/".join(words[:2]), words[3], "/".join(words[4:]), body)

        def repo_info(self, repo_type: str, repo: str, revision: str, blobs: bool) -> None:
            commit, error = stand_in.resolve(repo_type, repo, revision)
            if commit is None:
                return self.refuse(error)
            files = stand_in.repos[(repo_type, repo)]["commits"][commit] | ({} if blobs else stand_in.sneaked)
            siblings = [sibling(n, c) | stand_in.relisted.get(n, {}) for n, c in files.items()]
            listing = {"id": repo, "sha": commit, "siblings": siblings}
            self.send(200, json.dumps(listing).encode(), {"Content-Type": "application/json"})

        def file(self, repo_type: str, repo: str, revision: str, name: str, body: bool) -> None:
            commit, error = stand_in.resolve(repo_type, repo, revision)
            if commit is None:
                return self.refuse(error)
            content = (stand_in.repos[(repo_type, repo)]["commits"][commit] | stand_in.sneaked)[name]
            etag = sibling(name, content).get("lfs", {}).get("sha256") or git_blob_id(content)
            if name in stand_in.corrupt:
                content = bytes(255 - byte for byte in content)
            start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
            headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
            payload = content[start:]
            if body and stand_in.drops.get(name, 0) > 0:
                # the connection breaks half-way: the client sees fewer bytes than Content-Length promised
                stand_in.drops[name] -= 1
                self.close_connection = True
                return self.send(206 if start else 200, payload, headers, cut=len(payload) // 2)
            if body and name in stand_in.stalls:
                # a slow link: the first bytes, then nothing until the test lets the rest go
                self.send(206 if start else 200, payload, headers, cut=stand_in.stalls[name])
                if stand_in.release.wait(timeout=60):
                    self.wfile.write(payload[stand_in.stalls[name] :])
                return None
            self.send(206 if start else 200, payload, headers, body=body)

        def refuse(self, code: str | None) -> None:
            self.send(404, b"", {} if stand_in.bare_404 else {"X-Error-Code": code or ""})

        def send(self, status: int, payload: bytes, headers: dict[str, str], body: bool = True, cut: int = -1) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(payload))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(payload[:cut] if cut >= 0 else payload)
                self.wfile.flush()

    return Handler


@pytest.fixture(autouse=True)
def local_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing goes through a proxy to 127.0.0.1, and a broken download is retried at once."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(hub, "RETRY_DELAY_S", 0.0)


@pytest.fixture
def stand_in() -> Iterator[StandInHub]:
    state = StandInHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.endpoint = f"http://127.0.0.1:{server.server_port}"
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()
    thread.join()


def fake_model(seed: int) -> dict[str, bytes]:
    """A Qwen2-shaped folder with random weights: the hub client does not read what it carries."""
    rng = random.Random(seed)
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "vocab_size": 128}
    return {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "config.json": json.dumps(config).encode(),
        "generation_config.json": json.dumps({"seed": seed}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 512}',
        "vocab.json": json.dumps({f"t{i}": i for i in range(128)}).encode(),
        "merges.txt": b"#version: 0.2\nt 1\n",
        WEIGHTS: rng.randbytes(1 << 20),
    }


def parquet(rows: list[dict[str, str]]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


def fake_gsm8k() -> dict[str, bytes]:
    files = {f"main/{split}-00000-of-00001.parquet": parquet(rows) for split, rows in GSM8K_ROWS.items()}
    return {"README.md": b"# gsm8k\n", **files}


def model_hub(stand_in: StandInHub) -> Hub:
    return Hub(stand_in.endpoint, None, False)


def ensure_model(stand_in: StandInHub, folder: Path, revision: str = "main") -> str:
    return hub.ensure(Source("model", MODEL, revision), folder, model_hub(stand_in), lambda _: None)


def one_line_error(result: object) -> str:
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("verlbox: error: "), result.stderr  # type: ignore[attr-defined]
    return lines[0]


def left_behind(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir()) if parent.exists() else []


def test_a_fetch_records_the_commit_and_every_files_sha256(stand_in: StandInHub, tmp_path: Path) -> None:
    files = fake_model(1)
    commit = stand_in.publish("model", MODEL, files)
    folder = tmp_path / "models" / "Qwen2.5-0.5B-Instruct"
    # an earlier attempt's file that this commit does not have must not end up in the folder
    (tmp_path / "models" / "Qwen2.5-0.5B-Instruct.partial").mkdir(parents=True)
    (tmp_path / "models" / "Qwen2.5-0.5B-Instruct.partial" / "stale.bin").write_bytes(b"old")
    folder.mkdir()  # an empty folder is filled, as a missing one is
    done = ensure_model(stand_in, folder)
    assert done.startswith(f"fetched {MODEL} at {commit[:12]}, {len(files)} files into {folder}")
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == sorted(
        [*files, RECORD]
    )
    assert all((folder / name).read_bytes() == content for name, content in files.items())
    assert left_behind(tmp_path / "models") == ["Qwen2.5-0.5B-Instruct"]  # no staging, no client state
    record = json.loads((folder / RECORD).read_text())
    assert {k: record[k] for k in ("repo", "repo_type", "revision", "commit", "endpoint")} == {
        "repo": MODEL,
        "repo_type": "model",
        "revision": "main",
        "commit": commit,
        "endpoint": stand_in.endpoint,
    }
    assert record["files"] == sorted(
        ({"path": n, "size": len(c), "sha256": hashlib.sha256(c).hexdigest()} for n, c in files.items()),
        key=lambda entry: [*files].index(entry["path"]),
    )
    # the files came from the commit the branch resolved to, not from the branch itself
    assert all(
        f"/resolve/{commit}/" in url for method, url, _ in stand_in.requests if method == "GET" and "/api/" not in url
    )


def test_empty_settings_mean_unset() -> None:
    """compose passes every setting, unset ones as empty strings."""
    empty = {
        "HF_ENDPOINT": "",
        "HF_TOKEN": "",
        "HF_HUB_OFFLINE": "",
        "VERLBOX_DATA_REPO": "",
        "VERLBOX_DATA_REVISION": "",
    }
    assert Hub.from_environment(empty) == Hub("https://huggingface.co", None, False)
    assert hub.source_from_environment("data", empty) == Source("data", "openai/gsm8k", "main")
    assert Hub.from_environment({"HF_ENDPOINT": "http://mirror:8080/", "HF_HUB_OFFLINE": "yes"}) == Hub(
        "http://mirror:8080", None, True
    )


@pytest.mark.parametrize(
    ("endpoint", "shown", "such_as"),
    [
        ("hf-mirror.com", "hf-mirror.com", "https://hf-mirror.com"),
        ("user:s3cret@hf-mirror.com", "hf-mirror.com", "https://hf-mirror.com"),  # the login never shown
        ("ftp://mirror", "ftp://mirror", "https://huggingface.co"),
        ("https://", "https:", "https://huggingface.co"),  # a trailing / is dropped before the check
    ],
)
def test_an_endpoint_that_is_no_http_url_is_refused_naming_the_setting(endpoint: str, shown: str, such_as: str) -> None:
    """huggingface_hub would take it and requests say "No scheme supplied" at the first download, naming neither
    the setting nor where it was set."""
    expected = f"expected the hub's or a mirror's URL, http:// or https:// and a host, such as {such_as}"
    with pytest.raises(UsageError) as refused:
        Hub.from_environment({"HF_ENDPOINT": endpoint})
    assert str(refused.value) == f"HF_ENDPOINT={shown}: {expected}"
    with pytest.raises(UsageError) as from_compose:
        Hub.from_environment({"HF_ENDPOINT": endpoint, SETTINGS_SOURCE: ".env"})
    assert str(from_compose.value) == f"HF_ENDPOINT={shown} from .env: {expected}"


def test_a_later_start_checks_the_record_without_the_hub(stand_in: StandInHub, tmp_path: Path) -> None:
    stand_in.publish("model", MODEL, fake_model(2))
    folder = tmp_path / "model"
    ensure_model(stand_in, folder)
    asked = len(stand_in.requests)
    offline = Hub("http://127.0.0.1:9", None, True)
    assert "matches its verlbox-fetch.json" in hub.ensure(Source("model", MODEL, "main"), folder, offline, print)
    assert len(stand_in.requests) == asked


def test_a_pinned_revision_is_fetched_and_kept(stand_in: StandInHub, tmp_path: Path) -> None:
    old = stand_in.publish("model", MODEL, fake_model(3))
    stand_in.publish("model", MODEL, fake_model(4))  # main moves on
    source = hub.source_from_environment("model", {"VERLBOX_MODEL_REVISION": old, "VERLBOX_MODEL_REPO": ""})
    assert source == Source("model", MODEL, old)
    folder = tmp_path / "model"
    hub.ensure(source, folder, model_hub(stand_in), print)
    assert (folder / "generation_config.json").read_bytes() == fake_model(3)["generation_config.json"]
    record = json.loads((folder / RECORD).read_text())
    assert (record["revision"], record["commit"]) == (old, old)


def test_a_copied_pinned_folder_is_used_unless_another_revision_is_pinned(stand_in: StandInHub, tmp_path: Path) -> None:
    """The offline flow: fetched with --revision COMMIT elsewhere, copied here, where compose asks for main."""
    old = stand_in.publish("model", MODEL, fake_model(3))
    new = stand_in.publish("model", MODEL, fake_model(4))  # main moves on
    folder = tmp_path / "model"
    hub.ensure(Source("model", MODEL, old), folder, model_hub(stand_in), print)
    asked = len(stand_in.requests)
    offline = Hub("http://127.0.0.1:9", None, True)
    used = hub.ensure(Source("model", MODEL, "main"), folder, offline, print)
    assert used.startswith(f"{folder} matches its {RECORD}") and "\n" not in used
    assert f"note: fetched at {old}, not main, and used as is" in used
    assert len(stand_in.requests) == asked
    # a pinned revision other than the one fetched: one sentence, not a silent swap
    with pytest.raises(FetchError, match=f"holds {MODEL} at {old} .* but {MODEL} at {new} is asked for") as caught:
        ensure_model(stand_in, folder, revision=new)
    assert "\n" not in str(caught.value)
    assert len(stand_in.requests) == asked


def test_a_dropped_connection_resumes_where_it_broke(
    stand_in: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small chunks, so that what arrived before the break is on disk (the client writes whole chunks)
    monkeypatch.setattr(hub, "WRITTEN_PIECE", 64 * 1024)
    files = fake_model(5)
    stand_in.publish("model", MODEL, files)
    stand_in.drops[WEIGHTS] = 1
    folder = tmp_path / "model"
    ensure_model(stand_in, folder)
    first, resumed = stand_in.gets(WEIGHTS)
    assert first is None and resumed is not None
    offset = int(resumed.removeprefix("bytes=").rstrip("-"))
    assert 0 < offset < len(files[WEIGHTS])
    assert (folder / WEIGHTS).read_bytes() == files[WEIGHTS]


def test_a_restart_resumes_and_no_half_folder_is_used(
    stand_in: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "WRITTEN_PIECE", 64 * 1024)
    files = fake_model(6)
    stand_in.publish("model", MODEL, files)
    stand_in.drops[WEIGHTS] = hub.ATTEMPTS  # every attempt of this start breaks
    folder = tmp_path / "model"
    with pytest.raises(FetchError) as caught:
        ensure_model(stand_in, folder)
    message = str(caught.value)
    assert "\n" not in message and f"`verlbox fetch model --out {folder}`" in message
    assert "the connection broke (Connection broken: IncompleteRead(" in message
    assert f"kept in {folder}.partial and the next start resumes it" in message
    assert not folder.exists()
    kept = [path.stat().st_size for path in (tmp_path / "model.partial").rglob("*.incomplete")]
    assert kept and 0 < kept[0] < len(files[WEIGHTS])
    ensure_model(stand_in, folder)  # the next start
    assert stand_in.gets(WEIGHTS)[-1] == f"bytes={kept[0]}-"
    assert (folder / WEIGHTS).read_bytes() == files[WEIGHTS]
    assert left_behind(tmp_path) == ["model"]


def test_ctrl_c_ends_a_download_at_once_and_the_same_command_resumes_it(stand_in: StandInHub, tmp_path: Path) -> None:
    """On a slow link Ctrl-C used to wait, silently, for the file under way to end (the hub client's own
    threads are joined as Python exits): here the read timeout, 10 s."""
    files = fake_model(31)
    # the client writes what arrived in 10 MiB pieces: 10.5 MiB arrive, then the link stalls
    files[WEIGHTS] = random.Random(31).randbytes(12 << 20)
    stand_in.publish("model", MODEL, files)
    stand_in.stalls[WEIGHTS] = 21 << 19
    out = tmp_path / "model"
    env = os.environ | {"HF_ENDPOINT": stand_in.endpoint, "HF_HOME": str(tmp_path / "hf")}
    command = [sys.executable, "-m", "verlbox.cli", "fetch", "model", "--out", str(out)]
    # as from a terminal: a shell's background job (CI runs these tests as one) starts with SIGINT ignored, and
    # Python then installs no KeyboardInterrupt for it
    fetching = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    partial = tmp_path / "model.partial"
    deadline = time.monotonic() + 60
    while sum(path.stat().st_size for path in partial.rglob("*.incomplete")) < 10 << 20:
        assert fetching.poll() is None and time.monotonic() < deadline, fetching.communicate()
        time.sleep(0.05)
    fetching.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, stderr = fetching.communicate(timeout=30)
    took = time.monotonic() - interrupted
    assert fetching.returncode == 130 and took < 1.5, (took, stderr)
    assert stderr.strip().splitlines()[-1] == (
        f"verlbox: interrupted: what arrived is kept in {partial}; the same command resumes it from there"
    )
    kept = [path.stat().st_size for path in partial.rglob("*.incomplete")]
    assert kept == [10 << 20] and not out.exists()
    stand_in.release.set()
    resumed = run_verlbox("fetch", "model", "--out", str(out), env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert stand_in.gets(WEIGHTS)[-1] == f"bytes={10 << 20}-"
    assert (out / WEIGHTS).read_bytes() == files[WEIGHTS]


def test_what_arrives_on_a_slow_link_is_on_disk_for_the_bar_before_the_file_ends(
    stand_in: StandInHub, tmp_path: Path
) -> None:
    """The bar shows the partial file's size: the client's own 10 MiB pieces left it at 0 until a file ended (or
    10 MiB came), minutes on a slow link. Here 3.5 MiB of a 12 MiB file arrive, then the link stalls."""
    files = fake_model(33)
    files[WEIGHTS] = random.Random(33).randbytes(12 << 20)
    stand_in.publish("model", MODEL, files)
    stand_in.stalls[WEIGHTS] = 7 << 19
    env = os.environ | {"HF_ENDPOINT": stand_in.endpoint, "HF_HOME": str(tmp_path / "hf")}
    command = [sys.executable, "-m", "verlbox.cli", "fetch", "model", "--out", str(tmp_path / "model")]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as fetching:
        partial = tmp_path / "model.partial"
        deadline = time.monotonic() + 20
        arrived = 0
        while arrived < 3 << 20 and time.monotonic() < deadline and fetching.poll() is None:
            time.sleep(0.05)
            arrived = sum(path.stat().st_size for path in partial.rglob("*.incomplete"))
        stand_in.release.set()
        _, stderr = fetching.communicate(timeout=60)
    assert arrived == 3 << 20, f"{arrived} bytes on disk while the link stalled after 3.5 MiB"
    assert fetching.returncode == 0, stderr
    assert (tmp_path / "model" / WEIGHTS).read_bytes() == files[WEIGHTS]


def test_progress_on_a_terminal_names_each_file(stand_in: StandInHub, tmp_path: Path) -> None:
    """The hub client's own bars showed a URL's last 40 characters: `(…)` and a cut commit hash."""
    files = fake_model(32)
    commit = stand_in.publish("model", MODEL, files)
    env = os.environ | {"HF_ENDPOINT": stand_in.endpoint, "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "200"}
    terminal, attached = pty.openpty()
    command = [sys.executable, "-m", "verlbox.cli", "fetch", "model", "--out", str(tmp_path / "model")]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=attached) as fetching:
        os.close(attached)
        shown = b""
        with contextlib.suppress(OSError):  # EIO: the fetch has ended and closed its side
            while chunk := os.read(terminal, 4096):
                shown += chunk
    os.close(terminal)
    assert fetching.returncode == 0, shown
    text = shown.decode()
    assert WEIGHTS in text and "config.json" in text
    assert "(…)" not in text and commit[-12:] not in text


def test_a_file_other_than_the_hub_lists_is_refused(stand_in: StandInHub, tmp_path: Path) -> None:
    stand_in.publish("model", MODEL, fake_model(7))
    stand_in.corrupt.add(WEIGHTS)
    with pytest.raises(FetchError) as caught:
        ensure_model(stand_in, tmp_path / "model")
    # the plain sentence, not wrapped as a failed download to be fetched elsewhere
    assert str(caught.value) == (
        f"{tmp_path / 'model.partial' / WEIGHTS} arrived different from what the hub lists: removed; "
        "start again to fetch it anew"
    )
    assert not (tmp_path / "model").exists()
    assert not (tmp_path / "model.partial" / WEIGHTS).exists()


def downloads(stand_in: StandInHub) -> list[str]:
    """The file requests (HEAD or GET) the stand-in answered, as opposed to listings."""
    return [url for _, url, _ in stand_in.requests if "/resolve/" in url]


@pytest.mark.parametrize("kind", ["parent", "absolute"])
def test_a_listed_name_outside_the_folder_is_refused_before_any_download(
    stand_in: StandInHub, tmp_path: Path, kind: str
) -> None:
    victim = tmp_path / "home" / "victim.txt"
    victim.parent.mkdir()
    victim.write_bytes(b"mine")
    name, why = {
        "parent": ("../escaped.txt", "a path with an empty, . or .. part"),
        "absolute": (str(victim), "not a relative /-separated path"),
    }[kind]
    stand_in.publish("model", MODEL, fake_model(12) | {name: b"evil"})
    out = tmp_path / "models" / "qwen"
    result = run_verlbox("fetch", "model", "--out", str(out), env={"HF_ENDPOINT": stand_in.endpoint})
    assert result.returncode == 1
    assert f"a file named {name!r}, {why}: nothing fetched" in one_line_error(result)
    assert victim.read_bytes() == b"mine"
    assert left_behind(tmp_path) == ["home"] and left_behind(tmp_path / "home") == ["victim.txt"]
    assert downloads(stand_in) == []


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("sub/../../x.txt", "a path with an empty, . or .. part"),
        ("./config2.json", "a path with an empty, . or .. part"),
        ("sub//x.txt", "a path with an empty, . or .. part"),
        ("sub\\x.txt", "not a relative /-separated path"),
        (RECORD, "the name of verlbox's own record"),
        (".cache/huggingface/x", "under .cache/"),
        ("link/x.txt", "a path that leads out of"),
    ],
)
def test_a_listing_with_a_name_verlbox_does_not_write_is_refused(
    stand_in: StandInHub, tmp_path: Path, name: str, why: str
) -> None:
    stand_in.publish("model", MODEL, fake_model(13) | {name: b"evil"})
    outside = tmp_path / "outside"
    outside.mkdir()
    # an earlier attempt's staging folder holding a link out of it (a name through it resolves outside)
    (tmp_path / "model.partial").mkdir()
    (tmp_path / "model.partial" / "link").symlink_to(outside)
    with pytest.raises(
        FetchError, match=f"lists for {MODEL} at .* a file named {re.escape(repr(name))}, {re.escape(why)}"
    ):
        ensure_model(stand_in, tmp_path / "model")
    assert downloads(stand_in) == [] and left_behind(outside) == []
    assert not (tmp_path / "model").exists()


def test_a_record_naming_a_file_outside_its_folder_is_refused(stand_in: StandInHub, tmp_path: Path) -> None:
    stand_in.publish("model", MODEL, fake_model(14))
    folder = tmp_path / "model"
    ensure_model(stand_in, folder)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine")
    record = json.loads((folder / RECORD).read_text())
    record["files"][0]["path"] = str(victim)
    (folder / RECORD).write_text(json.dumps(record))
    with pytest.raises(FetchError, match=f"names {re.escape(repr(str(victim)))}, not a relative /-separated path"):
        ensure_model(stand_in, folder)
    assert victim.read_bytes() == b"mine"


@pytest.mark.parametrize(
    ("name", "listed_as"),
    [("config.json", {"blobId": None}), (WEIGHTS, {"lfs": None, "blobId": None}), ("vocab.json", {"size": None})],
    ids=["no-blob-id", "no-lfs", "no-size"],
)
def test_a_file_listed_without_its_hash_or_size_is_refused(
    stand_in: StandInHub, tmp_path: Path, name: str, listed_as: dict[str, object]
) -> None:
    stand_in.publish("model", MODEL, fake_model(15))
    stand_in.relisted[name] = listed_as
    with pytest.raises(FetchError) as caught:
        ensure_model(stand_in, tmp_path / "model")
    assert f"{name} without its size or hash, so it cannot be verified: nothing fetched" in str(caught.value)
    assert downloads(stand_in) == [] and left_behind(tmp_path) == []


def test_only_the_checked_names_are_downloaded(stand_in: StandInHub, tmp_path: Path) -> None:
    """The client lists the commit again (without hashes): a name only that listing shows is not fetched."""
    files = fake_model(16)
    stand_in.publish("model", MODEL, files)
    stand_in.sneaked["sneaked.txt"] = b"unchecked"
    ensure_model(stand_in, tmp_path / "model")
    assert not any(url.endswith("/sneaked.txt") for url in downloads(stand_in))
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == sorted([*files, RECORD])


def test_credentials_in_hf_endpoint_are_never_shown_or_recorded(stand_in: StandInHub, tmp_path: Path) -> None:
    assert hub.redact("https://user:s3cret@mirror:8080/hf?token=s3cret#x") == "https://mirror:8080/hf"
    stand_in.publish("model", MODEL, fake_model(17))
    closed = closed_port_url()
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": closed.replace("://", "://user:s3cret@")}
    failed = run_verlbox("fetch", "model", "--out", str(tmp_path / "a"), env=env)
    assert failed.returncode == 1 and f"{closed} cannot be reached" in one_line_error(failed)
    env["HF_ENDPOINT"] = stand_in.endpoint.replace("://", "://user:s3cret@")
    fetched = run_verlbox("fetch", "model", "--out", str(tmp_path / "b"), env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert f"from {stand_in.endpoint} into" in fetched.stderr
    assert json.loads((tmp_path / "b" / RECORD).read_text())["endpoint"] == stand_in.endpoint
    for result in (failed, fetched):
        assert "s3cret" not in result.stdout + result.stderr
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and b"s3cret" in path.read_bytes()]


def test_out_dot_fills_the_current_folder(stand_in: StandInHub, tmp_path: Path) -> None:
    files = fake_model(18)
    stand_in.publish("model", MODEL, files)
    here = tmp_path / "qwen"
    here.mkdir()
    env = {"HF_ENDPOINT": stand_in.endpoint, "HF_HOME": str(tmp_path / "hf")}
    fetched = run_verlbox("fetch", "model", "--out", ".", cwd=here, env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert f"into {here} (recorded in its {RECORD})" in fetched.stdout
    assert sorted(p.name for p in here.iterdir()) == sorted([*files, RECORD])
    assert left_behind(tmp_path) == ["qwen"]  # the staging folder was qwen.partial beside it, now gone
    root = run_verlbox("fetch", "model", "--out", "/", env=env)
    assert root.returncode == UsageError.exit_code
    assert one_line_error(root) == "verlbox: error: cannot fetch into /: name a folder below it"


def test_the_cli_fetches_then_names_a_changed_file(stand_in: StandInHub, tmp_path: Path) -> None:
    commit = stand_in.publish("dataset", "openai/gsm8k", fake_gsm8k())
    out = tmp_path / "data" / "gsm8k-raw"
    env = {"HF_ENDPOINT": stand_in.endpoint, "HF_HUB_OFFLINE": "", "HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf")}
    env |= hide_modules(tmp_path, "pyarrow", "torch")  # a host with `pip install verlbox` only
    fetched = run_verlbox("fetch", "data", "--out", str(out), env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert f"fetched openai/gsm8k at {commit[:12]}, 3 files into {out}" in fetched.stdout
    assert pq.read_table(out / "main" / "train-00000-of-00001.parquet").to_pylist() == GSM8K_ROWS["train"]
    again = run_verlbox("fetch", "data", "--out", str(out), env=env)
    assert again.returncode == 0 and "matches its verlbox-fetch.json" in again.stdout
    (out / "README.md").write_bytes(b"# GSM8K\n")  # same size, other bytes
    changed = run_verlbox("fetch", "data", "--out", str(out), env=env)
    assert changed.returncode == 1
    assert f"{out / 'README.md'} does not match {out / RECORD} (its sha256 differs" in one_line_error(changed)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        ({"HF_ENDPOINT": "UNREACHABLE"}, "UNREACHABLE cannot be reached ([Errno 111] Connection refused)"),
    ],
    ids=["offline", "unreachable"],
)
def test_offline_or_unreachable_is_one_sentence_with_the_command(
    stand_in: StandInHub, tmp_path: Path, env: dict[str, str], why: str
) -> None:
    stand_in.publish("model", MODEL, fake_model(8))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = {"HF_ENDPOINT": stand_in.endpoint, "HF_HOME": str(tmp_path / "hf")} | env
    env = {key: closed if value == "UNREACHABLE" else value for key, value in env.items()}
    out = tmp_path / "models" / "qwen"
    result = run_verlbox("fetch", "model", "--out", str(out), "--revision", "v1", env=env)
    assert result.returncode == 1
    line = one_line_error(result)
    assert f"into {out}: {why.replace('UNREACHABLE', closed)}" in line
    # `verlbox fetch` is not told to run itself again: the reason alone
    assert "fill it on a connected machine" not in line and "`verlbox fetch" not in line
    assert left_behind(tmp_path / "models") == []
    assert stand_in.requests == []


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (
            ["--repo", "nobody/nothing"],
            "has no model nobody/nothing (check --repo or VERLBOX_MODEL_REPO; a private one needs HF_TOKEN)",
        ),
        (["--revision", "v9"], f"{MODEL} has no revision v9 (--revision or VERLBOX_MODEL_REVISION)"),
    ],
    ids=["repo", "revision"],
)
def test_an_unknown_repo_or_revision_is_one_sentence(
    stand_in: StandInHub, tmp_path: Path, args: list[str], why: str
) -> None:
    stand_in.publish("model", MODEL, fake_model(9))
    out = tmp_path / "model"
    result = run_verlbox("fetch", "model", "--out", str(out), *args, env={"HF_ENDPOINT": stand_in.endpoint})
    assert result.returncode == 1
    line = one_line_error(result)
    assert why in line and "`verlbox fetch" not in line  # a wrong name is fixed by the setting, not elsewhere
    assert args[0] != "--repo" or f"repository not found: {stand_in.endpoint} has no model" in line
    assert left_behind(tmp_path) == []


def test_a_bare_404_from_a_mirror_names_the_repo_and_revision_to_check(stand_in: StandInHub, tmp_path: Path) -> None:
    """Before: "... answered 404", with nothing to act on."""
    stand_in.publish("model", MODEL, fake_model(9))
    stand_in.bare_404 = True
    out = tmp_path / "model"
    result = run_verlbox(
        "fetch", "model", "--out", str(out), "--repo", MODEL[:-1], env={"HF_ENDPOINT": stand_in.endpoint}
    )
    assert result.returncode == 1
    line = one_line_error(result)
    assert (
        f"answered 404: no model {MODEL[:-1]} at revision main there (check --repo or VERLBOX_MODEL_REPO and "
        "--revision or VERLBOX_MODEL_REVISION; a private one needs HF_TOKEN)"
    ) in line, line
    assert left_behind(tmp_path) == []


def test_a_private_repo_needs_hf_token(stand_in: StandInHub, tmp_path: Path) -> None:
    stand_in.publish("model", "someone/private-qwen", fake_model(11))
    stand_in.tokens["someone/private-qwen"] = "hf_secret"
    source = Source("model", "someone/private-qwen", "main")
    with pytest.raises(FetchError, match=r"refused access \(401\): set HF_TOKEN"):
        hub.ensure(source, tmp_path / "model", model_hub(stand_in), print)
    with_token = Hub.from_environment({"HF_ENDPOINT": stand_in.endpoint, "HF_TOKEN": "hf_secret"})
    assert hub.ensure(source, tmp_path / "model", with_token, print).startswith("fetched someone/private-qwen")


def test_an_unreadable_record_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / RECORD).write_text('{"repo": "x"')
    with pytest.raises(FetchError, match=f"{tmp_path / 'model' / RECORD} is not a readable fetch record"):
        hub.ensure(Source("model", MODEL, "main"), tmp_path / "model", Hub("http://127.0.0.1:9", None, True), print)


def test_a_folder_filled_by_hand(stand_in: StandInHub, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    source = Source("model", MODEL, "main")
    assert "filled by hand" in hub.ensure(source, folder, model_hub(stand_in), print)
    refused = run_verlbox("fetch", "model", "--out", str(folder), env={"HF_ENDPOINT": stand_in.endpoint})
    assert refused.returncode == 2 and "already holds files but no verlbox-fetch.json" in one_line_error(refused)
    assert stand_in.requests == []


def test_train_fetches_the_model_and_data_on_first_start(stand_in: StandInHub, tmp_path: Path) -> None:
    model_commit = stand_in.publish("model", MODEL, fake_model(10))
    stand_in.publish("dataset", "openai/gsm8k", fake_gsm8k())
    model, data = tmp_path / "models" / "Qwen2.5-0.5B-Instruct", tmp_path / "data" / "gsm8k"
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'validation.parquet'}",
    ]
    environ = {
        "HF_ENDPOINT": stand_in.endpoint,
        "HF_HUB_OFFLINE": "",
        "HF_TOKEN": "",
        "VERLBOX_MODEL_REPO": "",
        "VERLBOX_MODEL_REVISION": "",
        "VERLBOX_GSM8K_SOURCE": str(tmp_path / "data" / "gsm8k-raw"),
    }
    log = io.StringIO()
    checks = train.prepare_inputs(overrides, environ, Console(file=log, width=400))
    assert [(check.name, check.ok) for check in checks] == [("model", True), ("data", True)], checks
    assert json.loads((model / RECORD).read_text())["commit"] == model_commit
    assert (tmp_path / "data" / "gsm8k-raw" / RECORD).is_file()
    assert pq.read_table(data / "train.parquet").num_rows == len(GSM8K_ROWS["train"])
    assert f"model: fetched {MODEL} at {model_commit[:12]}" in log.getvalue()
    # a later start: offline is fine, the model is checked against its record, a changed file is named
    offline = environ | {"HF_HUB_OFFLINE": "1"}
    assert (
        "matches its verlbox-fetch.json" in train.provide_model(overrides, offline, Console(file=io.StringIO())).detail
    )
    (model / "config.json").write_text("{}")
    changed = train.provide_model(overrides, offline, Console(file=io.StringIO()))
    assert not changed.ok and changed.detail.startswith(f"{model / 'config.json'} does not match {model / RECORD}")


def test_train_offline_on_first_start_names_the_run_folders_command(tmp_path: Path) -> None:
    overrides = [f"actor_rollout_ref.model.path={tmp_path / 'model'}", f"data.train_files={tmp_path / 'd' / 't.pq'}"]
    environ = {"HF_HUB_OFFLINE": "1", "VERLBOX_GSM8K_SOURCE": str(tmp_path / "raw"), "VERLBOX_DATA_REVISION": "v2"}
    model, data = train.prepare_inputs(overrides, environ, Console(file=io.StringIO()))
    assert not model.ok and f"`verlbox fetch model --out {tmp_path / 'model'}`" in model.detail
    assert not data.ok and f"`verlbox fetch data --out {tmp_path / 'raw'} --revision v2`" in data.detail
    assert left_behind(tmp_path) == []
    # in the container the command names the folder as the run folder on the host has it
    assert train.run_folder_path(Path("/models/Qwen2.5-0.5B-Instruct")) == "models/Qwen2.5-0.5B-Instruct"
    assert train.run_folder_path(Path("/data/gsm8k-raw")) == "data/gsm8k-raw"
    assert train.run_folder_path(tmp_path / "raw") == str(tmp_path / "raw")


@pytest.mark.parametrize(
    "gpus",
    [GpuFacts([], [], None, None), GpuFacts([GpuDevice("Tesla P40", "6.1", 22.4, 22.2)], ["sm_61"], "11.4", "470.1")],
    ids=["no-gpu", "old-driver"],
)
def test_train_fetches_nothing_before_the_gpu_checks_pass(
    stand_in: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: GpuFacts
) -> None:
    stand_in.publish("model", MODEL, fake_model(19))
    stand_in.publish("dataset", "openai/gsm8k", fake_gsm8k())
    monkeypatch.setattr(preflight, "probe_gpu", lambda: gpus)
    overrides = [f"actor_rollout_ref.model.path={tmp_path / 'model'}", f"data.train_files={tmp_path / 'd' / 't.pq'}"]
    environ = {"HF_ENDPOINT": stand_in.endpoint, "VERLBOX_GSM8K_SOURCE": str(tmp_path / "raw")}
    plan = TrainingPlan(load_recipe("p40-cu124").image_spec(), environ={}, topology=Topology(1, 1))
    checks = train.run_local_preflight(plan, overrides, environ, None, Console(file=io.StringIO()))
    failed = [check.name for check in checks if not check.ok]
    assert failed[:1] == ["GPU visible" if not gpus.devices else "driver"], checks
    assert "model" not in {check.name for check in checks}
    assert stand_in.requests == [] and left_behind(tmp_path) == []


def test_fetch_on_the_host_reads_the_run_folder_s_env_as_train_would(stand_in: StandInHub, tmp_path: Path) -> None:
    """A run folder's .env names the hub (HF_ENDPOINT): `verlbox fetch` there uses it, and says so."""
    stand_in.publish("model", MODEL, fake_model(12))
    (tmp_path / ".env").write_text(f"HF_ENDPOINT={stand_in.endpoint}\nHF_TOKEN=\nVERLBOX_MODEL_REPO=\n")
    result = run_verlbox("fetch", "model", "--out", "models/qwen", cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 0, result.stderr
    assert f"run folder {tmp_path} (its .env)" in result.stderr.splitlines()
    assert (tmp_path / "models" / "qwen" / hub.RECORD).is_file()


def test_fetch_without_out_fills_the_run_folder_s_own_folders(stand_in: StandInHub, tmp_path: Path) -> None:
    """No --out: the folder `train` will read, as the run folder's .env names it (models/NAME, data/gsm8k-raw),
    found from --run DIR as well as from the current folder; outside a run folder, one line asking for --out."""
    stand_in.publish("model", MODEL, fake_model(13))
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / ".env").write_text(
        f"HF_ENDPOINT={stand_in.endpoint}\nVERLBOX_MODELS=./weights\nVERLBOX_MODEL_NAME=small\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"HF_HOME": str(tmp_path / "hf")}
    result = run_verlbox("fetch", "model", "--run", str(run_folder), cwd=elsewhere, env=env)
    assert result.returncode == 0, result.stderr
    assert f"run folder {run_folder} (its .env)" in result.stderr.splitlines()
    assert (run_folder / "weights" / "small" / hub.RECORD).is_file() and list(elsewhere.iterdir()) == []
    again = run_verlbox("fetch", "model", cwd=run_folder, env=env)  # the current folder: the same target, checked
    assert again.returncode == 0 and "weights/small" in again.stdout, again.stderr
    outside = run_verlbox("fetch", "data", cwd=elsewhere, env=env)
    assert outside.returncode == 2 and outside.stderr.splitlines() == [
        "verlbox: error: fetch data: give --out DIR, or run it in a run folder (or with --run DIR) to fill that "
        "folder's data/gsm8k-raw"
    ]
    not_one = run_verlbox("fetch", "model", "--run", str(elsewhere), cwd=tmp_path, env=env)
    assert not_one.returncode == 2 and "not a run folder" in not_one.stderr and str(elsewhere) in not_one.stderr
