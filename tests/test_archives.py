"""Pinned source archives: fetched when missing, accepted by the file's hash or its tar stream's, nothing else.

The stand-in server plays GitHub's archive endpoint (or a mirror). `verlbox build` runs as a user
runs it, against an engine that is not there (DOCKER_HOST points nowhere): the archive step comes
before the engine is needed, so what it left in the sources cache is what is checked.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from conftest import run_verlbox
from standins import closed_port_url, serve_files
from verlbox.errors import UsageError
from verlbox.host.building.archives import check_archive
from verlbox.host.building.sources import TORCH_INDEXES, BuildSources
from verlbox.host.recipes.archive import ArchivePin
from verlbox.host.recipes.recipe import load_recipe

PIN = load_recipe("p40-cu124").apex.archive_pin()
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent.sock"}


@pytest.fixture(scope="module")
def pinned_archive(sources_dir: Path) -> bytes:
    return (sources_dir / PIN.name).read_bytes()


def recompressed(archive: bytes, level: int) -> bytes:
    return gzip.compress(gzip.decompress(archive), compresslevel=level, mtime=0)


def build_with_mirror(url: str, cache: Path) -> tuple[int, str]:
    result = run_verlbox("build", "p40-cu124", "--sources", str(cache), "--sources-url", url, env=NO_ENGINE)
    assert "Traceback" not in result.stderr
    return result.returncode, result.stderr


def test_the_recipe_pins_the_tar_stream_of_the_archive(pinned_archive: bytes) -> None:
    import hashlib

    assert hashlib.sha256(pinned_archive).hexdigest() == PIN.sha256
    assert hashlib.sha256(gzip.decompress(pinned_archive)).hexdigest() == PIN.tar_sha256
    assert PIN.upstream_url == f"https://github.com/NVIDIA/apex/archive/{load_recipe('p40').apex.commit}.tar.gz"


def test_a_missing_archive_recompressed_elsewhere_is_fetched_and_accepted(
    pinned_archive: bytes, tmp_path: Path
) -> None:
    other_gzip = recompressed(pinned_archive, 1)
    assert other_gzip != pinned_archive
    with serve_files({f"/{PIN.name}": other_gzip}) as url:
        code, stderr = build_with_mirror(url, tmp_path)
    assert f"fetched {PIN.name}" in stderr
    assert (tmp_path / PIN.name).read_bytes() == other_gzip
    assert sorted(p.name for p in tmp_path.iterdir()) == [PIN.name]  # no temporary file left
    # the build went on to the engine, which is not there: the archive step passed
    assert code == 1 and "Docker" in stderr


def test_an_archive_with_one_altered_byte_is_refused_and_nothing_is_kept(pinned_archive: bytes, tmp_path: Path) -> None:
    tar = bytearray(gzip.decompress(pinned_archive))
    tar[len(tar) // 2] ^= 0x01
    with serve_files({f"/{PIN.name}": gzip.compress(bytes(tar), mtime=0)}) as url:
        code, stderr = build_with_mirror(url, tmp_path)
    assert code == 2 and "served other bytes than the recipe pins" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_failed_fetch_says_what_to_download_and_where_in_one_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for url in (closed_port_url(), "http://127.0.0.1:1"):
        code, stderr = build_with_mirror(url, cache)
        assert code == 1 and len(stderr.strip().splitlines()) == 1
        assert f"could not fetch {PIN.name}" in stderr and PIN.upstream_url in stderr
        assert f"put it in {cache}" in stderr and "git archive" in stderr
    with serve_files({}) as url:  # a mirror without the file: 404
        code, stderr = build_with_mirror(url, cache)
    assert code == 1 and "Not Found" in stderr
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_mirror_with_a_password_gets_it_as_basic_auth_and_it_is_never_printed(
    pinned_archive: bytes, tmp_path: Path
) -> None:
    with serve_files({f"/{PIN.name}": pinned_archive}, basic_auth="verlbox:s3cr3t") as url:
        mirror = url.replace("http://", "http://verlbox:s3cr3t@") + "/?token=t0ken"
        code, stderr = build_with_mirror(mirror, tmp_path / "with")
        refused, refused_stderr = build_with_mirror(url, tmp_path / "without")
    assert code == 1 and f"fetched {PIN.name} from {url}/{PIN.name}" in stderr  # then the missing engine
    assert (tmp_path / "with" / PIN.name).read_bytes() == pinned_archive
    assert refused == 1 and "Unauthorized" in refused_stderr
    assert not any(secret in stderr + refused_stderr for secret in ("s3cr3t", "t0ken"))


@pytest.mark.parametrize("fault", ["truncated", "garbage"])
def test_a_broken_answer_is_a_failed_fetch_in_one_line(pinned_archive: bytes, tmp_path: Path, fault: str) -> None:
    with serve_files({f"/{PIN.name}": pinned_archive}, fault=fault) as url:
        code, stderr = build_with_mirror(url, tmp_path)
    assert code == 1 and f"could not fetch {PIN.name}" in one_line(stderr) and "internal error" not in stderr
    assert list(tmp_path.iterdir()) == []


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_local_archive_is_checked_and_never_fetched(pinned_archive: bytes, tmp_path: Path) -> None:
    (tmp_path / PIN.name).write_bytes(recompressed(pinned_archive, 9))
    code, stderr = build_with_mirror(closed_port_url(), tmp_path)  # fetching would fail
    assert code == 1 and "could not fetch" not in stderr and "fetched" not in stderr  # it failed later, at the engine
    (tmp_path / PIN.name).write_bytes(b"not gzip at all")
    code, stderr = build_with_mirror(closed_port_url(), tmp_path)
    assert code == 2 and "not gzip" in stderr and "refusing other source bytes" in stderr
    assert "delete it to fetch it again" in stderr


def test_check_archive_without_a_tar_pin_takes_the_exact_file_only(pinned_archive: bytes, tmp_path: Path) -> None:
    exact = ArchivePin(PIN.name, PIN.sha256, None, PIN.upstream_url, PIN.how_to_make)
    path = tmp_path / PIN.name
    path.write_bytes(pinned_archive)
    assert check_archive(path, exact).sha256 == PIN.sha256
    path.write_bytes(recompressed(pinned_archive, 1))
    with pytest.raises(UsageError, match="refusing other source bytes"):
        check_archive(path, exact)
    assert check_archive(path, PIN).sha256 != PIN.sha256  # the tar pin accepts it, under its own file hash


def test_the_torch_index_a_recipe_names_has_a_default_and_a_mirror_overrides_it() -> None:
    default = BuildSources.from_options(None, None, None, environ={}).with_torch_index("p40", "pytorch-cu118")
    assert default.torch_index_url == TORCH_INDEXES["pytorch-cu118"] == "https://download.pytorch.org/whl/cu118"
    mirror = "https://mirror.example/whl/cu118"
    from_env = BuildSources.from_options(None, None, None, environ={"VERLBOX_TORCH_INDEX_URL": mirror})
    assert from_env.with_torch_index("p40", "pytorch-cu118").torch_index_url == mirror
    option = BuildSources.from_options(None, None, mirror, environ={"VERLBOX_TORCH_INDEX_URL": "file:///x"})
    assert option.with_torch_index("p40", "pytorch-cu118").torch_index_url == mirror
    with pytest.raises(UsageError, match="'pytorch-rocm' wheel index, which verlbox does not know"):
        BuildSources.from_options(None, None, None, environ={}).with_torch_index("mine", "pytorch-rocm")
    # a recipe without a torch index uses none
    assert BuildSources.from_options(None, None, None, environ={}).with_torch_index("x", None).torch_index_url is None


def test_the_default_torch_index_reaches_pip_as_a_build_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default URL travels as a secret, never in the Dockerfile; pip in the build reads it from there."""
    import subprocess
    import sys

    from verlbox.host.building.plan import BuildPlan
    from verlbox.host.building.render import render_dockerfile

    wheel = tmp_path / "wheels" / "verlbox_probe-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    make_wheel(wheel)
    index = {
        "/verlbox-probe/": f'<a href="/{wheel.name}">{wheel.name}</a>'.encode(),
        f"/{wheel.name}": wheel.read_bytes(),
    }
    with serve_files(index) as url:
        monkeypatch.setitem(TORCH_INDEXES, "pytorch-cu118", url)
        sources = BuildSources.from_options(None, None, None, environ={}).with_torch_index("p40", "pytorch-cu118")
        _, environment = sources.secret_arguments()
        assert environment == {"VERLBOX_SECRET_TORCH_INDEX_URL": url}
        download = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp_path / "got")),
                *("--index-url", environment["VERLBOX_SECRET_TORCH_INDEX_URL"], "verlbox-probe==1.0"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    assert download.returncode == 0, download.stderr
    assert (tmp_path / "got" / wheel.name).is_file()
    assert "download.pytorch.org" not in render_dockerfile(BuildPlan(load_recipe("p40")))


def make_wheel(path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("verlbox_probe/__init__.py", "")
        wheel.writestr(
            "verlbox_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: verlbox-probe\nVersion: 1.0\n"
        )
        wheel.writestr(
            "verlbox_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr("verlbox_probe-1.0.dist-info/RECORD", "")
