"""Issue 46: a stranger's package index, recipe or lock may make a command fail, never make it run their code or
read (and quote) a file they chose. Each case is refused in one line, or checked without running anything."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import stat
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_verlbox
from standins import serve_files
from verlbox.errors import BAD_INPUT, UsageError
from verlbox.host.building.sources import BuildSources
from verlbox.host.clients.upstream import Http
from verlbox.host.recipes.lock import read_lock
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust import pins

SHIPPED = REPO / "recipes"

# ---- `build --check`'s resolution: an index's sdists are named, never built ------------------------------


def _wheel(name: str, version: str, files: dict[str, str]) -> tuple[str, bytes]:
    """A wheel of FILES with its dist-info (METADATA, WHEEL, RECORD with each file's hash)."""
    info = f"{name}-{version}.dist-info"
    files = files | {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: verlbox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {
        path: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        for path, text in files.items()
    }
    record = [f"{path},sha256={digest[path].decode()},{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


def _sdist(name: str, version: str, files: dict[str, str]) -> tuple[str, bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, text in (files | {"PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}).items():
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    return f"{name}-{version}.tar.gz", buffer.getvalue()


def _simple_index(files: list[tuple[str, tuple[str, bytes]]]) -> dict[str, bytes]:
    """PEP 503 pages /simple/PROJECT/ for (project, (file name, bytes)), and the files under /files/."""
    served, pages = {}, {}
    for project, (name, data) in files:
        served[f"/files/{name}"] = data
        link = f'<a href="/files/{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>'
        pages.setdefault(project, []).append(link)
    for project, links in pages.items():
        served[f"/simple/{project}/"] = f"<html><body>{''.join(links)}</body></html>".encode()
    return served


def _hostile_index(marker: Path) -> dict[str, bytes]:
    """An sdist whose in-tree PEP 517 backend (needing nothing) and setup.py both run code, an sdist with only a
    setup.py (its build would take the index's setuptools), that setuptools with a .pth that runs in any
    interpreter it is installed for, and one plain wheel."""
    hostile = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    tree = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "tree_backend"\nbackend-path = ["."]\n',
        "tree_backend.py": hostile,
        "setup.py": hostile,
    }
    return _simple_index(
        [
            ("treesdist", _sdist("treesdist", "1.0", tree)),
            ("legacysdist", _sdist("legacysdist", "2.0", {"setup.py": hostile})),
            ("setuptools", _wheel("setuptools", "99.0.0", {"setuptools/__init__.py": hostile, "zz.pth": hostile})),
            ("tinywheel", _wheel("tinywheel", "1.0", {"tinywheel.py": ""})),
        ]
    )


def test_check_resolves_a_hostile_index_without_building_or_fetching_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46: `build --check` asked uv to resolve with builds allowed, so an index's sdist (and the setuptools
    it serves) ran on the user's host. Now nothing runs; the sdists are named in the finding as not built."""
    marker, log = tmp_path / "hostile-code-ran", tmp_path / "uv-calls"
    # the real uv, each call's arguments and its setting for Python downloads written down first
    wrapper = tmp_path / "uv"
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$* UV_PYTHON_DOWNLOADS=$UV_PYTHON_DOWNLOADS" >> {str(log)!r}\n'
        f'exec {pins.uv_binary()!r} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(pins, "uv_binary", lambda: str(wrapper))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # no build of an earlier run is reused
    with serve_files(_hostile_index(marker)) as index:
        finding = pins.check_resolution(
            ["treesdist==1.0", "legacysdist==2.0", "tinywheel==1.0"],
            "3.10",
            f"{index}/simple",
            None,
            BuildSources(),
            30,
        )
    assert not marker.exists(), "code from the index ran on the host"
    assert finding.served, finding.answer
    assert "not built" in finding.answer and finding.answer.endswith("legacysdist 2.0, treesdist 1.0"), finding.answer
    calls = log.read_text().splitlines()
    assert calls and all(
        "--no-build" in call and "--no-python-downloads" in call and call.endswith("UV_PYTHON_DOWNLOADS=never")
        for call in calls
    ), calls


def test_an_sdist_uv_names_without_a_version_fails_the_finding_naming_it() -> None:
    """Two versions of an sdist-only package and nothing pinning one: no stub can stand in, and nothing is built."""
    files = _simple_index(
        [
            ("onlysdist", _sdist("onlysdist", "1.0", {"setup.py": "raise SystemExit(1)\n"})),
            ("onlysdist", _sdist("onlysdist", "1.1", {"setup.py": "raise SystemExit(1)\n"})),
        ]
    )
    with serve_files(files) as index:
        finding = pins.check_resolution(["onlysdist"], "3.10", f"{index}/simple", None, BuildSources(), 30)
    assert not finding.served and finding.answer.startswith("onlysdist: only sdists"), finding.answer


# ---- a URL whose host refuses HEAD ------------------------------------------------------------------------

WHEEL_SIZE = 300 * 2**20


@contextmanager
def _refusing_head(honour_range: bool) -> Iterator[tuple[str, list[str]]]:
    """A host that answers HEAD 403 (as GitHub's signed release downloads have), and a GET with one byte when
    HONOUR_RANGE, else with a 300 MiB body it sends only the start of. Yields its URL and the requests seen."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            seen.append("HEAD")
            self.send_error(403)

        def do_GET(self) -> None:
            seen.append(f"GET {self.headers.get('Range')}")
            if honour_range and self.headers.get("Range") == "bytes=0-0":
                self.send_response(206)
                self.send_header("Content-Range", f"bytes 0-0/{WHEEL_SIZE}")
                self.send_header("Content-Length", "1")
                self.end_headers()
                self.wfile.write(b"P")
                return
            self.send_response(200)
            self.send_header("Content-Length", str(WHEEL_SIZE))
            self.end_headers()
            self.wfile.write(b"PK" * 1024)
            time.sleep(5)  # the rest never comes: a client that reads the body waits out its time limit

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/vllm.whl", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("honour_range", [True, False], ids=["ranged", "range-ignored"])
def test_a_host_that_refuses_head_is_asked_one_byte_and_no_body_is_read(honour_range: bool) -> None:
    with _refusing_head(honour_range) as (url, seen):
        started = time.monotonic()
        finding = pins.asked("vllm", url, lambda: pins.check_url(Http(None, 2), "vllm==0.8.5.post1", url))
        took = time.monotonic() - started
    assert finding.served and finding.answer == "served (300 MiB)", finding.answer
    assert seen == ["HEAD", "GET bytes=0-0"] and took < 2


# ---- `extends:` reads shipped recipes and files beside the recipe, nothing else ---------------------------

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYFAKEKEY"


def _stranger(tmp_path: Path, extends: str) -> Path:
    folder = tmp_path / "stranger"
    folder.mkdir(exist_ok=True)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"extends": extends, "description": "looks harmless"}))
    return recipe


def _credentials(tmp_path: Path) -> Path:
    path = tmp_path / "home" / ".aws" / "credentials"
    path.parent.mkdir(parents=True)
    path.write_text(f"[default]\naws_secret_access_key = {SECRET}\n")
    return path


def _assert_refused_extends(recipe: Path, problem: str) -> None:
    result = run_verlbox("render", str(recipe), "-o", str(recipe.parent / "Dockerfile"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == BAD_INPUT and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"verlbox: error: {recipe}: extends: ") and problem in lines[0], lines[0]
    assert SECRET not in result.stderr + result.stdout and not (recipe.parent / "Dockerfile").exists()


def test_extends_never_reads_a_file_by_absolute_path(tmp_path: Path) -> None:
    """Issue 46: `extends: /home/u/.aws/credentials` read the file, and the YAML error quoted its secret."""
    credentials = _credentials(tmp_path)
    _assert_refused_extends(_stranger(tmp_path, str(credentials)), "leads out of")


def test_extends_never_climbs_out_of_the_recipe_s_folder(tmp_path: Path) -> None:
    (tmp_path / "outside.yaml").write_text(f"aws_secret_access_key: {SECRET}\n[x\n")
    _assert_refused_extends(_stranger(tmp_path, "../outside.yaml"), "(no folder, no '..')")


@pytest.mark.parametrize("extends", ["base", "base.yaml"])
def test_extends_never_follows_a_link_out_of_the_recipe_s_folder(tmp_path: Path, extends: str) -> None:
    credentials = _credentials(tmp_path)
    recipe = _stranger(tmp_path, extends)
    (recipe.parent / "base.yaml").symlink_to(credentials)
    _assert_refused_extends(recipe, "leads out of")
    # a link that stays in the folder is read
    (recipe.parent / "base.yaml").unlink()
    (recipe.parent / "parent.yaml").write_text(yaml.safe_dump({"extends": str(SHIPPED / "p40-cu124.yaml")}))
    (recipe.parent / "base.yaml").symlink_to(recipe.parent / "parent.yaml")
    assert load_recipe(recipe).description == "looks harmless"


def test_a_yaml_error_names_line_and_column_and_quotes_nothing(tmp_path: Path) -> None:
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(f"description: fine\n[token]\nsecret = {SECRET}\n")
    result = run_verlbox("render", str(recipe))
    assert result.returncode == BAD_INPUT and SECRET not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        f"verlbox: error: {recipe}: not valid YAML: could not find expected ':' (line 3, column 1)"
    )


# ---- a lock names its recipe's base, never another image's name --------------------------------------------


def _locked_child(folder: Path, reference: str | None) -> tuple[Path, Path]:
    """A recipe of the user's (p40-cu124 under another name) with the shipped lock made for it, its base renamed
    to REFERENCE as a stranger's lock would (a bundle's base is loaded and tagged under that name)."""
    recipe = folder / "mine.yaml"
    recipe.write_text(yaml.safe_dump({"extends": str(SHIPPED / "p40-cu124.yaml")}))
    lock = json.loads((SHIPPED / "p40-cu124.lock.json").read_text())
    lock["recipe"], lock["recipe_hash"] = "mine", load_recipe(recipe).content_hash
    if reference is not None:
        lock["base"]["reference"] = reference
    (folder / "mine.lock.json").write_text(json.dumps(lock))
    return recipe, folder / "mine.lock.json"


@pytest.mark.parametrize("reference", ["debian:bookworm", "verlbox-base/debian:trixie-minbase", "ubuntu:22.04"])
def test_a_lock_naming_another_base_is_refused_naming_the_expected_one(tmp_path: Path, reference: str) -> None:
    recipe_path, lock_path = _locked_child(tmp_path, reference)
    recipe = load_recipe(recipe_path)
    with pytest.raises(UsageError) as refused:
        read_lock(lock_path, recipe)
    assert str(refused.value) == (
        f"{lock_path}: base.reference: expected debian:bookworm-slim or verlbox-base/debian:bookworm-minbase "
        f"(recipe mine's base), got {reference}"
    )


def test_the_shipped_lock_names_its_recipe_s_bootstrapped_base(tmp_path: Path) -> None:
    recipe_path, lock_path = _locked_child(tmp_path, None)
    recipe = load_recipe(recipe_path)
    assert read_lock(lock_path, recipe).base.reference == "verlbox-base/debian:bookworm-minbase"
    assert recipe.base.bootstrap is not None  # the name a lock may give is the one --bootstrap-base tags


def test_uv_s_own_warnings_are_not_given_as_the_reason_a_resolution_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: uv's managed-Python warning led the failure line of `build --check`."""
    wrapper = tmp_path / "uv"
    wrapper.write_text(
        "#!/bin/sh\necho 'warning: A managed Python download is available for Python 3.10, but Python downloads "
        f'are set to never\' >&2\nexec {pins.uv_binary()!r} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(pins, "uv_binary", lambda: str(wrapper))
    with serve_files(_simple_index([])) as index:
        finding = pins.check_resolution(["absentpkg==1.0"], "3.10", f"{index}/simple", None, BuildSources(), 30)
    assert not finding.served
    assert finding.answer.startswith("Because absentpkg was not found in the package registry"), finding.answer
    assert "warning" not in finding.answer


def test_a_lock_of_the_registry_base_without_its_digest_is_refused(tmp_path: Path) -> None:
    """Issue 52: a stranger's lock naming the recipe's registry base with no digest held a bundle's base.tar
    only to the lock's own image ID; one with a digest other than the recipe's pin is refused too."""
    recipe_path, lock_path = _locked_child(tmp_path, "debian:bookworm-slim")
    recipe = load_recipe(recipe_path)
    with pytest.raises(UsageError) as refused:
        read_lock(lock_path, recipe)
    assert str(refused.value) == (
        f"{lock_path}: base.digest: a registry base (debian:bookworm-slim) needs its repository digest: "
        "run `verlbox lock` on an image built from the registry's base"
    )
    lock = json.loads(lock_path.read_text())
    lock["base"] |= {"digest": "debian@sha256:" + "1" * 64}
    lock_path.write_text(json.dumps(lock))
    assert read_lock(lock_path, recipe).base.digest == "debian@sha256:" + "1" * 64
    (tmp_path / "pinned.yaml").write_text(
        yaml.safe_dump({"extends": str(SHIPPED / "p40-cu124.yaml"), "base": {"digest": "sha256:" + "2" * 64}})
    )
    pinned = load_recipe(tmp_path / "pinned.yaml")
    lock["recipe"], lock["base"]["reference"] = "pinned", pinned.base.pinned_reference
    (tmp_path / "pinned.lock.json").write_text(json.dumps(lock))
    with pytest.raises(UsageError, match=r"base\.digest: debian@sha256:1{64}, but the recipe pins sha256:2{64}$"):
        read_lock(tmp_path / "pinned.lock.json", pinned)
