"""Locked files by name and sha256, with no installer and no shared cache in between (issue 46, findings 1, 3
and the query token of 6): a hostile index, a poisoned uv cache and a poisoned file cache, against the real
build_steps functions, the real uv and pip, and stand-in indexes on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from distributions import make_sdist, make_wheel
from standins import serve_files
from verlbox.runtime.steps import build_record, build_steps
from verlbox.runtime.steps.build_steps import Secrets, StepError


def _legacy_sdist(folder: Path, marker: Path) -> Path:
    """An sdist with only a setup.py (as antlr4-python3-runtime 4.9.3 and pylatexenc 2.10 are): preparing its
    metadata runs setup.py under whatever setuptools the installer finds, which writes MARKER."""
    files = {
        "setup.py": f"import pathlib\npathlib.Path({str(marker)!r}).write_text('setup.py ran')\n"
        "from setuptools import setup\nsetup(name='tinysdist', version='1.0')\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: tinysdist\nVersion: 1.0\n",
    }
    return make_sdist(folder, "tinysdist", "1.0", files)


def _index(files: list[Path], served: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """A PEP 503 index of FILES (SERVED replaces a file's bytes, as a hostile index would)."""
    pages: dict[str, list[str]] = {}
    for path in files:
        pages.setdefault(path.name.split("-")[0], []).append(path.name)
    index = {f"/files/{path.name}": (served or {}).get(path.name, path.read_bytes()) for path in files}
    for name, names in pages.items():
        links = "".join(f'<a href="../../files/{file}">{file}</a>' for file in names)  # relative, as many are
        index[f"/simple/{name}/"] = f"<html><body>{links}</body></html>".encode()
    return index


def _entry(path: Path) -> dict[str, str]:
    name, version = path.name.split("-")[:2]
    version = version.removesuffix(".tar.gz")
    return {
        "name": name,
        "version": version,
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """(marker, the folder of files, the lock's files): beside them the index serves a setuptools-99 whose .pth
    writes MARKER in any interpreter that starts where it is installed."""
    marker, files = tmp_path / "hostile-code-ran", tmp_path / "files"
    files.mkdir()
    pth = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('setuptools-99 ran')\n"
    make_wheel(files, "setuptools", "99.0.0", {"setuptools/__init__.py": "", "zz_hostile.pth": pth})
    locked = [make_wheel(files, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"}), _legacy_sdist(files, marker)]
    return marker, files, locked


def test_bundle_gets_each_locked_file_by_hash_and_runs_no_build_backend(
    tmp_path: Path, hostile: tuple[Path, Path, list[Path]]
) -> None:
    """Finding 1: `pip download` prepared the sdist's metadata in an isolated build whose setuptools came from
    the index, unhashed, and ran it. The bundle's files now come by name and sha256, nothing is built."""
    marker, files, locked = hostile
    tools, dest, cache = tmp_path / "tools", tmp_path / "bundle", tmp_path / "cache"
    (tools / "bundle" / "pip").mkdir(parents=True)
    (tools / "bundle" / "pip" / "deps.json").write_text(json.dumps([_entry(path) for path in locked]))
    with serve_files(_index(list(files.iterdir()))) as url:
        build_steps.bundle_wheels(dest, Secrets(pip_index_url=f"{url}/simple/"), tools, cache)
    assert sorted(path.name for path in dest.iterdir()) == sorted(path.name for path in locked)
    assert all((dest / path.name).read_bytes() == path.read_bytes() for path in locked)
    assert not marker.exists(), "a build backend ran while bundling"


def test_bytes_other_than_the_lock_s_are_refused_in_one_line_and_nothing_is_kept(
    tmp_path: Path, hostile: tuple[Path, Path, list[Path]]
) -> None:
    _, files, locked = hostile
    entries = [_entry(path) for path in locked]
    served = {locked[0].name: b"PK not the locked wheel"}
    cache = tmp_path / "cache"
    with serve_files(_index(list(files.iterdir()), served)) as url, pytest.raises(StepError) as refused:
        build_steps.fetch_locked(entries, cache, {"PIP_INDEX_URL": f"{url}/simple/"})
    assert str(refused.value).startswith(f"{locked[0].name}: served with sha256 ")
    assert entries[0]["sha256"] in str(refused.value)
    assert not any(path.is_file() and path.name.startswith("tinywheel") for path in cache.rglob("*"))


def _venv(folder: Path) -> Path:
    venv.create(folder, with_pip=False)
    return folder


def _locked_step(tools: Path, step: str, entries: list[dict[str, str]]) -> None:
    (tools / "lock").mkdir(parents=True, exist_ok=True)
    lines = build_record.requirement_lines(entries)
    (tools / "lock" / f"{step}.pip.txt").write_text("\n".join(lines) + "\n")
    (tools / "lock" / f"{step}.pip.json").write_text(json.dumps(entries))


def _python(target: Path, code: str) -> str:
    return subprocess.run(
        [str(target / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_poisoned_uv_cache_never_reaches_a_locked_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: uv accepts an unpacked cache entry by the hash it recorded and installs its files without
    hashing them again. An entry edited in the cache (a changed module, an added .pth), as anything that ran in
    an earlier RUN with that cache mounted could do, must not reach a locked step: it installs the lock's bytes,
    and the build record says what was installed."""
    marker, wheels, tools, records = tmp_path / "pth-ran", tmp_path / "wheels", tmp_path / "tools", tmp_path / "rec"
    wheels.mkdir()
    wheel = make_wheel(wheels, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = 'locked'\n"})
    uv_cache = tmp_path / "uv-cache"
    with serve_files(_index([wheel])) as url:
        index = f"{url}/simple/"
        first = {
            "PATH": os.environ["PATH"],
            "VIRTUAL_ENV": str(_venv(tmp_path / "first")),
            "UV_CACHE_DIR": str(uv_cache),
        }
        # an earlier locked install (by hash, as a locked step ran it before) is what fills uv's cache
        entries = [_entry(wheel)]
        _locked_step(tools, "deps", entries)
        locked = ["uv", "pip", "install", "--no-deps", "--require-hashes", "--index-url", index]
        subprocess.run(
            [*locked, "-r", str(tools / "lock" / "deps.pip.txt")], env=first, check=True, capture_output=True
        )
        modules = list(uv_cache.rglob("tinywheel.py"))
        assert modules, "uv kept no unpacked entry to poison"
        for module in modules:
            module.write_text("WHEEL = 'poisoned'\n")
            (module.parent / "zz_poison.pth").write_text(
                f"import pathlib; pathlib.Path({str(marker)!r}).write_text('x')\n"
            )
        target = _venv(tmp_path / "target")
        base = {"PATH": os.environ["PATH"], "VIRTUAL_ENV": str(target), "UV_CACHE_DIR": str(uv_cache)}
        env = build_steps.pip_environment(
            Secrets(pip_index_url=index), offline=False, index=None, extra_index=None, base=base
        )
        monkeypatch.setattr(build_steps, "LOCKED_FILES", tmp_path / "locked-files")
        monkeypatch.setattr(build_steps, "compile_bytecode", lambda names, epoch: None)  # the image's interpreter
        build_steps.install_python("deps", [], env, offline=False, tools=tools, records=records)
    assert _python(target, "import tinywheel; print(tinywheel.WHEEL)") == "locked"
    assert not marker.exists() and not list(target.rglob("zz_poison.pth"))
    (installed,) = json.loads((records / "installed" / "deps.json").read_text())
    (record,) = target.rglob("tinywheel-1.0.dist-info/RECORD")
    assert installed == {
        "name": "tinywheel",
        "version": "1.0",
        "record": hashlib.sha256(record.read_bytes()).hexdigest(),
    }


def test_a_poisoned_file_cache_entry_is_fetched_again_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The locked steps' own file cache is shared by every build on the builder too: an entry whose bytes are not
    the lock's is replaced by the index's (checked by the same sha256), never installed."""
    wheels, tools = tmp_path / "wheels", tmp_path / "tools"
    wheels.mkdir()
    wheel = make_wheel(wheels, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = 'locked'\n"})
    entry = _entry(wheel)
    cache = tmp_path / "locked-files"
    poisoned = cache / entry["sha256"] / wheel.name
    make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = 'poisoned'\n"}).rename(tmp_path / "p.whl")
    poisoned.parent.mkdir(parents=True)
    (tmp_path / "p.whl").rename(poisoned)
    _locked_step(tools, "deps", [entry])
    target = _venv(tmp_path / "target")
    monkeypatch.setattr(build_steps, "LOCKED_FILES", cache)
    monkeypatch.setattr(build_steps, "compile_bytecode", lambda names, epoch: None)
    with serve_files(_index([wheel])) as url:
        base = {"PATH": os.environ["PATH"], "VIRTUAL_ENV": str(target), "UV_CACHE_DIR": str(tmp_path / "uv")}
        env = build_steps.pip_environment(
            Secrets(pip_index_url=f"{url}/simple/"), offline=False, index=None, extra_index=None, base=base
        )
        build_steps.install_python("deps", [], env, offline=False, tools=tools, records=tmp_path / "records")
    assert _python(target, "import tinywheel; print(tinywheel.WHEEL)") == "locked"
    assert poisoned.read_bytes() == wheel.read_bytes()


def test_a_token_in_an_index_query_or_login_is_never_printed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Finding 6: pip prints `Looking in indexes: URL` with the URL's query (where a token may ride); every tool a
    build step runs has its output passed through with the index URLs' secret parts replaced."""
    wheel = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    with serve_files(_index([wheel])) as url:
        index = f"{url.replace('://', '://ci:pass%2Fword@')}/simple/?token=qu3ry-T0KEN"
        env = {"PATH": os.environ["PATH"], "PIP_INDEX_URL": index, "PIP_NO_CACHE_DIR": "1"}
        command = [os.path.realpath(os.sys.executable), "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "d")]
        with pytest.raises(StepError):  # the stand-in index does not take the login: what is printed is the point
            build_steps.run([*command, "tinywheel==1.0"], env=env)
    printed = capfd.readouterr()
    output = printed.out + printed.err
    assert "Looking in indexes:" in output and "***" in output
    for secret in ("qu3ry-T0KEN", "pass%2Fword", "pass/word"):
        assert secret not in output


def test_the_build_record_says_what_is_installed_not_what_was_asked(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    info = site / "tinywheel-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: TinyWheel\nVersion: 1.0\n")
    (info / "RECORD").write_text("tinywheel.py,sha256=abc,3\n")
    build_record.write_installed("deps", ["tinywheel"], [str(site)], tmp_path / "records")
    digest = hashlib.sha256(b"tinywheel.py,sha256=abc,3\n").hexdigest()
    written = json.loads((tmp_path / "records" / "installed" / "deps.json").read_text())
    assert written == [{"name": "tinywheel", "version": "1.0", "record": digest}]
    with pytest.raises(LookupError, match=r"^absent installed, but not found in "):
        build_record.write_installed("deps", ["absent"], [str(site)], tmp_path / "records")


RAW_SLASH = "https://ci:ab/cd-s3cret@mirror.invalid/simple/"  # a password's raw '/': RFC 3986 ends the host there


def test_a_url_with_a_raw_slash_in_its_password_is_refused_wherever_it_enters(tmp_path: Path) -> None:
    """One URL rule everywhere: the build's options, the hub endpoint, the mirror inside a build step and the index
    URLs a step's output is scrubbed of: each refuses (or hides whole) in one line, never the secret."""
    from verlbox.errors import UsageError
    from verlbox.host.building.sources import BuildSources
    from verlbox.runtime.training.hub import Hub

    for option in ("pip_index_url", "torch_index_url", "apt_mirror", "archives_url"):
        with pytest.raises(UsageError, match="percent-encode '/' in a password as %2F") as refused:
            BuildSources.from_options(
                **{"ca_bundle": None, "pip_index_url": None, "torch_index_url": None, option: RAW_SLASH}
            )
        assert "s3cret" not in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UsageError, match=r"^HF_ENDPOINT: .*%2F") as refused:
        Hub.from_environment({"HF_ENDPOINT": RAW_SLASH})
    assert "s3cret" not in str(refused.value)
    with pytest.raises(StepError, match=r"^the build's apt mirror: ") as stopped:
        build_steps.bare_url(RAW_SLASH)
    assert "s3cret" not in str(stopped.value)
    assert build_steps.secret_parts({"PIP_INDEX_URL": RAW_SLASH}) == [(RAW_SLASH.encode(), b"***")]
    with pytest.raises(StepError, match=r"^an index URL of this build: ") as stopped:
        build_steps.Fetcher({"PIP_INDEX_URL": RAW_SLASH})
    assert "s3cret" not in str(stopped.value)


def test_a_wheel_url_s_sha256_is_checked_by_pip_and_rendered_from_the_recipe(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """vllm.wheel_sha256 reaches pip as the URL's #sha256=, which pip holds the download to: an unlocked build
    of a recipe that pins it installs that file or fails (the shipped p40 pins none: no source of that hash
    could be reached, and --check says so)."""
    from verlbox.host.building.plan import BuildPlan
    from verlbox.host.building.render import render_dockerfile
    from verlbox.host.recipes.recipe import load_recipe

    (tmp_path / "pinned.yaml").write_text(f"extends: p40\nvllm:\n  wheel_sha256: '{'ab' * 32}'\n")
    rendered = render_dockerfile(BuildPlan(load_recipe(tmp_path / "pinned.yaml")))
    assert f"cu118-cp38-abi3-manylinux1_x86_64.whl#sha256={'ab' * 32}" in rendered
    assert "#sha256=" not in render_dockerfile(BuildPlan(load_recipe("p40")))
    served = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    good = hashlib.sha256(served.read_bytes()).hexdigest()
    with serve_files({f"/{served.name}": served.read_bytes()}) as url:
        for sha256, works in ((good, True), ("0" * 64, False)):
            target = _venv(tmp_path / f"env-{works}")
            env = {"PATH": os.environ["PATH"], "VIRTUAL_ENV": str(target), "PIP_NO_CACHE_DIR": "1"}
            install = [os.sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install"]
            command = [*install, "--no-deps", f"{url}/{served.name}#sha256={sha256}"]
            if works:
                build_steps.run(command, env=env)
            else:
                with pytest.raises(StepError):
                    build_steps.run(command, env=env)
                assert "THESE PACKAGES DO NOT MATCH THE HASHES" in capfd.readouterr().err
    assert _python(tmp_path / "env-True", "import tinywheel; print(tinywheel.WHEEL)") == "True"
    assert not list((tmp_path / "env-False").rglob("tinywheel.py"))


@contextmanager
def _recording_index(pages: dict[str, bytes], seen: list[tuple[str, str | None]], status: int = 200) -> Iterator[str]:
    """An index on 127.0.0.1 that records each path asked with the Authorization it came with."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            body = pages.get(self.path)
            if body is None or status != 200:
                self.send_error(404 if body is None else status)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_index_login_goes_only_to_its_own_scheme_host_and_port(tmp_path: Path) -> None:
    """The index's login goes with its own pages and files, never to another host a page links to, and never
    over plain http to a host whose index was given as https (a TLS terminator's http links, say); a page of
    a remote index cannot make the build read a local file."""
    served = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    entry = _entry(served)
    secret = tmp_path / "secret.whl"
    secret.write_bytes(b"a local file")
    seen: list[tuple[str, str | None]] = []
    with _recording_index({}, seen) as other:
        page = (
            f'<a href="file://{secret}">{served.name}</a>'  # a local file: never read
            f'<a href="http://{other}/elsewhere/{served.name}">{served.name}</a>'
        )
        pages = {"/simple/tinywheel/": page.encode(), f"/files/{served.name}": served.read_bytes()}
        with _recording_index(pages, seen) as own:
            fetcher = build_steps.Fetcher({"PIP_INDEX_URL": f"http://ci:T0KEN@{own}/simple/"})
            assert fetcher.where(entry) == f"http://{other}/elsewhere/{served.name}"
            with pytest.raises(StepError):  # the other host has no such file
                fetcher.download(entry, tmp_path / served.name)
            # given as https, the login is for https alone: a page's http link to that host goes without it
            https = build_steps.Fetcher({"PIP_INDEX_URL": f"https://ci:T0KEN@{own}/simple/"})
            assert list(https.logins) == [("https", own)]
    login = "Basic " + base64.b64encode(b"ci:T0KEN").decode()
    assert ("/simple/tinywheel/", login) in seen
    assert all(auth is None for path, auth in seen if path.startswith("/elsewhere/"))


def test_a_planted_cache_entry_and_a_broken_index_are_one_line_each(tmp_path: Path) -> None:
    """What another build left where a locked file goes (a link, a file) is removed, never followed; an index
    that answers 401 is named with its answer, not as 'no index lists it'."""
    served = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    entry = _entry(served)
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    cache.mkdir()
    (cache / entry["sha256"]).symlink_to(outside, target_is_directory=True)
    with serve_files(_index([served])) as url:
        (path,) = build_steps.fetch_locked([entry], cache, {"PIP_INDEX_URL": f"{url}/simple/"})
    assert path.read_bytes() == served.read_bytes() and not path.parent.is_symlink() and not list(outside.iterdir())
    (cache / entry["sha256"] / served.name).unlink()
    (cache / entry["sha256"]).rmdir()
    (cache / entry["sha256"]).write_text("planted")
    with serve_files(_index([served])) as url:
        (path,) = build_steps.fetch_locked([entry], cache, {"PIP_INDEX_URL": f"{url}/simple/"})
    assert path.read_bytes() == served.read_bytes()
    seen: list[tuple[str, str | None]] = []
    with _recording_index({"/simple/tinywheel/": b""}, seen, status=401) as own, pytest.raises(StepError) as refused:
        build_steps.fetch_locked([entry], tmp_path / "empty", {"PIP_INDEX_URL": f"http://{own}/simple/"})
    assert "no index of this build lists it" in str(refused.value) and "Unauthorized" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_check_never_shows_an_index_s_login_or_query_from_uv_s_errors() -> None:
    """uv names the index URL in its errors (here the stand-in answers with a type uv refuses): --check's
    finding shows where, never the login, the index's path or the token in the query."""
    from verlbox.host.building.sources import BuildSources
    from verlbox.host.trust import pins

    with serve_files({"/simple/tinywheel/": b"<html></html>"}) as url:
        index = f"{url.replace('://', '://ci:pw0rd@')}/simple/?token=qu3ry-T0KEN"
        finding = pins.check_resolution(["tinywheel==1.0"], "3.11", index, None, BuildSources(), 5)
    assert not finding.served and f"{url.removeprefix('http://')}/***/tinywheel/?***" in finding.answer
    assert "qu3ry-T0KEN" not in finding.answer and "pw0rd" not in finding.answer


def test_a_token_in_an_index_s_path_is_in_no_message(tmp_path: Path) -> None:
    """Issue 52: an index may take its token in its path (`https://host/TOKEN/simple/`); a locked fetch's failure
    names the page or file with that path as `***` (its last part kept), and a tool's output loses it too."""
    served = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    entry, token = _entry(served), "pa7h-T0KEN"
    # the page links a file the index does not serve, beside the index's path, as some indexes do
    pages = {f"/{token}/simple/tinywheel/": f'<a href="../../files/{served.name}">{served.name}</a>'.encode()}
    seen: list[tuple[str, str | None]] = []
    with _recording_index(pages, seen) as own, pytest.raises(StepError) as missing:
        build_steps.fetch_locked([entry], tmp_path / "a", {"PIP_INDEX_URL": f"http://{own}/{token}/simple/"})
    assert str(missing.value) == f"http://{own}/***/{served.name}: Not Found"
    with _recording_index(pages, seen, status=401) as own, pytest.raises(StepError) as refused:
        build_steps.fetch_locked([entry], tmp_path / "b", {"PIP_INDEX_URL": f"http://{own}/{token}/simple/"})
    assert str(refused.value).endswith(f"; http://{own}/***/tinywheel/: Unauthorized"), refused.value
    assert (f"/{token}/files/{served.name}", None) in seen  # the file was asked where the page said
    index = f"https://mirror.invalid/{token}/simple/"
    hidden = dict(build_steps.secret_parts({"PIP_INDEX_URL": index}))
    assert hidden == {f"mirror.invalid/{token}/simple".encode(): b"mirror.invalid/***"}


def test_an_index_with_its_token_in_the_query_serves_a_locked_build(tmp_path: Path) -> None:
    """Issue 52: `https://host/simple/?token=X` was asked `.../simple/?token=X/tinywheel/`; now the project's page
    is asked with the query after it, and the token goes with the page's file links on the index's own host (a
    relative link loses the page's query) and with no other host's; no message shows it."""
    served = make_wheel(tmp_path, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"})
    entry, token = _entry(served), "qu3ry-T0KEN"
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            path, _, query = self.path.partition("?")
            body = {"/simple/tinywheel/": page, f"/files/{served.name}": served.read_bytes()}.get(path)
            if query != f"token={token}" or body is None:  # a wrong token is refused before any name is looked up
                self.send_error(403 if query != f"token={token}" else 404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    page = f'<a href="../../files/{served.name}#sha256={entry["sha256"]}">{served.name}</a>'.encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    own = f"127.0.0.1:{server.server_address[1]}"
    try:
        (path,) = build_steps.fetch_locked(
            [entry], tmp_path / "cache", {"PIP_INDEX_URL": f"http://{own}/simple/?token={token}"}
        )
        assert path.read_bytes() == served.read_bytes()
        assert seen == [f"/simple/tinywheel/?token={token}", f"/files/{served.name}?token={token}"]
        missing = {**entry, "name": "other", "file": "other-1.0-py3-none-any.whl"}
        with pytest.raises(StepError) as refused:
            build_steps.fetch_locked(
                [missing], tmp_path / "cache", {"PIP_INDEX_URL": f"http://{own}/simple/?token=wrong"}
            )
    finally:
        server.shutdown()
        server.server_close()
    assert str(refused.value).endswith(f"; http://{own}/***/other/: Forbidden") and "wrong" not in str(refused.value)
