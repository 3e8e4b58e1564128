"""build_steps.py, the in-image build steps, on the host: apt's sources and credentials, pip's and uv's
settings, records, bundle indexes. The commands that call apt, pip or uv are faked where noted; the image
builds in test_image.py and test_offline.py run them for real."""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from verlbox import paths
from verlbox.runtime.steps import build_steps
from verlbox.runtime.steps.build_steps import Secrets, StepError

MIRROR = "https://ci:s3cr%40t@mirror.invalid:8443/deb&ian|c\\d"


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """A base's /etc/apt: one-line and deb822 sources, as debian:bookworm-slim and Ubuntu bases have them."""
    folder = tmp_path / "etc-apt"
    (folder / "sources.list.d").mkdir(parents=True)
    (folder / "sources.list").write_text(
        "# a comment stays\ndeb http://archive.invalid/debian bookworm main\n"
        "deb-src [arch=amd64 signed-by=/k.gpg] http://archive.invalid/debian bookworm main\n"
    )
    (folder / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://archive.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    (folder / "sources.list.d" / "notes.txt").write_text("not a source\n")
    (folder / "sources.list.d" / "cuda.list").write_text("deb [signed-by=/c.gpg] https://developer.invalid/cuda /\n")
    (tmp_path / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n')
    return folder


def os_release(etc: Path) -> Path:
    """The fixture base's /etc/os-release (not this machine's)."""
    return etc.parent / "os-release"


def option_values(options: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for flag, value in itertools.pairwise(options) if flag == "-o")


def test_the_mirror_replaces_each_archive_uri_in_copies_and_its_login_goes_to_auth_conf(etc: Path) -> None:
    before = {path: path.read_text() for path in etc.rglob("*") if path.is_file()}
    with build_steps.apt_options(Secrets(apt_mirror=MIRROR), etc=etc, os_release=os_release(etc)) as options:
        values = option_values(options)
        source_list = Path(values["Dir::Etc::SourceList"])
        parts = Path(values["Dir::Etc::SourceParts"])
        bare = "https://mirror.invalid:8443/deb&ian|c\\d"
        assert source_list.read_text().splitlines() == [
            "# a comment stays",
            f"deb {bare} bookworm main",
            f"deb-src [arch=amd64 signed-by=/k.gpg] {bare} bookworm main",
        ]
        assert f"URIs: {bare}\nSuites: bookworm bookworm-updates" in (parts / "debian.sources").read_text()
        assert sorted(path.name for path in parts.iterdir()) == ["cuda.list", "debian.sources"]
        # another repository's list (NVIDIA's on an Ubuntu base) is not on a Debian mirror: kept as it is
        assert (parts / "cuda.list").read_text() == (etc / "sources.list.d" / "cuda.list").read_text()
        auth = Path(values["Dir::Etc::netrc"])
        assert auth.read_text() == "machine https://mirror.invalid:8443/deb&ian|c\\d login ci password s3cr@t\n"
        assert auth.stat().st_mode & 0o077 == 0
        copies = source_list.read_text() + (parts / "debian.sources").read_text()
        assert "s3cr" not in " ".join(options) + copies
    assert not source_list.parent.exists(), "the step's copies and its auth.conf are gone after the step"
    assert {path: path.read_text() for path in etc.rglob("*") if path.is_file()} == before


def test_without_a_mirror_apt_reads_the_base_s_own_sources(etc: Path) -> None:
    with build_steps.apt_options(Secrets(ca_bundle=Path("/run/secrets/ca_bundle")), etc=etc) as options:
        assert option_values(options) == {
            "Acquire::Languages": "none",
            "Acquire::https::CAInfo": "/run/secrets/ca_bundle",
        }


def test_offline_apt_reads_only_the_bundle_repository_and_ignores_valid_until(etc: Path, tmp_path: Path) -> None:
    offline_list = tmp_path / "offline.list"
    with build_steps.apt_options(Secrets(apt_mirror=MIRROR), offline_list=offline_list, etc=etc) as options:
        values = option_values(options)
        assert values["Dir::Etc::SourceList"] == str(offline_list)
        assert list(Path(values["Dir::Etc::SourceParts"]).iterdir()) == []
        assert values["Acquire::Check-Valid-Until"] == "false" and "Dir::Etc::netrc" not in values


@pytest.mark.parametrize(
    "mirror",
    [
        "ftp://t0ken@mirror.invalid/debian",
        "https://u:t0ken@mirror.invalid/deb ian",
        "t0ken",
        "https://mirror.invalid/debian?t0ken",
        "https://t0ken@mirror.invalid/debian",  # a login with no password: apt's auth.conf needs both
    ],
)
def test_a_mirror_that_is_not_a_plain_url_stops_the_step_without_echoing_it(etc: Path, mirror: str) -> None:
    with (
        pytest.raises(StepError) as caught,
        build_steps.apt_options(Secrets(apt_mirror=mirror), etc=etc, os_release=os_release(etc)),
    ):
        pass
    assert "t0ken" not in str(caught.value) and "apt mirror" in str(caught.value)


def test_the_toolkit_suite_comes_from_the_base_s_first_archive(etc: Path) -> None:
    assert build_steps.first_archive(etc) == "http://archive.invalid/debian"
    (etc / "sources.list.d" / "debian.sources").unlink()
    assert build_steps.first_archive(etc) == "http://archive.invalid/debian"
    (etc / "sources.list").write_text("# nothing\n")
    assert build_steps.first_archive(etc) is None


def test_pip_and_uv_get_the_build_s_index_and_ca_and_offline_only_the_bundle() -> None:
    secrets = Secrets(ca_bundle=Path("/ca.pem"), pip_index_url="https://t:k@pypi.invalid/simple")
    secrets = Secrets(**{**secrets.__dict__, "torch_index_url": "https://torch.invalid/cu124"})
    env = build_steps.pip_environment(secrets, offline=False, index=None, extra_index="torch", base={"PATH": "/bin"})
    from_image = build_steps.pip_environment(Secrets(), offline=False, index=None, extra_index=None, base=env)
    assert from_image["UV_INDEX_URL"] == env["PIP_INDEX_URL"]  # uv follows an index the image's ENV gives pip
    assert env["PIP_INDEX_URL"] == env["UV_INDEX_URL"] == "https://t:k@pypi.invalid/simple"
    assert env["PIP_EXTRA_INDEX_URL"] == env["UV_EXTRA_INDEX_URL"] == "https://torch.invalid/cu124"
    assert env["PIP_CERT"] == env["SSL_CERT_FILE"] == "/ca.pem"
    torch = build_steps.pip_environment(secrets, offline=False, index="torch", extra_index=None, base={})
    assert torch["UV_INDEX_URL"] == "https://torch.invalid/cu124" and "UV_EXTRA_INDEX_URL" not in torch
    offline = build_steps.pip_environment(secrets, offline=True, index=None, extra_index="torch", base=env)
    assert not {"PIP_INDEX_URL", "UV_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL"} & set(offline)
    assert offline["UV_OFFLINE"] == offline["PIP_NO_INDEX"] == "1" and offline["UV_FIND_LINKS"] == "/tmp/verlbox/wheels"
    with pytest.raises(StepError, match="torch index has no URL"):
        build_steps.pip_environment(Secrets(), offline=False, index="torch", extra_index=None, base={})


def test_a_locked_step_installs_its_slice_by_hash_and_records_the_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv and the compile are faked: the command and the record are what is checked."""
    tools, records = tmp_path / "tools", tmp_path / "records"
    (tools / "lock").mkdir(parents=True)
    entries = [{"name": "six", "version": "1.16.0", "file": "six-1.16.0-py2.py3-none-any.whl", "sha256": "a" * 64}]
    (tools / "lock" / "six.pip.txt").write_text("six==1.16.0 --hash=sha256:" + "a" * 64 + "\n")
    (tools / "lock" / "six.pip.json").write_text(json.dumps(entries))
    commands: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(build_steps.shutil, "which", lambda name: "/usr/bin/uv")
    monkeypatch.setattr(build_steps, "run", lambda command, env=None, cwd=None: commands.append((command, env or {})))
    compiled: list[tuple[list[str], int]] = []
    monkeypatch.setattr(build_steps, "compile_bytecode", lambda names, epoch: compiled.append((names, epoch)))
    installed: list[list[str]] = []
    monkeypatch.setattr(build_steps, "record_installed", lambda step, names, env, records: installed.append(names))
    build_steps.install_python(
        "six", ["six"], {"SOURCE_DATE_EPOCH": "1700000000"}, offline=True, tools=tools, records=records
    )
    ((command, env),) = commands
    assert command[:6] == ["uv", "pip", "install", "--no-deps", "--require-hashes", "--no-build"]
    assert "six" not in command
    assert env["UV_LINK_MODE"] == "copy" and compiled == [(["six"], 1700000000)] and installed == [["six"]]
    assert json.loads((records / "six.pip.json").read_text()) == entries
    with pytest.raises(StepError, match="the lock has no Python files for step other"):
        build_steps.install_python("other", ["x"], {}, offline=True, tools=tools, records=records)


def test_uv_s_marker_is_dated_and_its_record_line_follows(tmp_path: Path) -> None:
    info = tmp_path / "six-1.16.0.dist-info"
    info.mkdir()
    (info / "uv_cache.json").write_text('{"timestamp":{"secs_since_epoch":1999999999,"nanos_since_epoch":5}}')
    (info / "RECORD").write_text("six.py,sha256=x,1\nsix-1.16.0.dist-info/uv_cache.json,sha256=old,70\n")
    build_steps.redate_uv_marker(info, 1700000000)
    text = (info / "uv_cache.json").read_bytes()
    assert json.loads(text)["timestamp"] == {"secs_since_epoch": 1700000000, "nanos_since_epoch": 0}
    line = (info / "RECORD").read_text().splitlines()[1]
    digest = build_steps.base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    assert line == f"six-1.16.0.dist-info/uv_cache.json,sha256={digest},{len(text)}"


def test_the_lock_decides_an_apt_step_s_packages(tmp_path: Path) -> None:
    (tmp_path / "lock").mkdir()
    (tmp_path / "lock" / "python.apt.txt").write_text("python3=3.11.2-1+b1\nlibc6=2.36-9\n")
    assert build_steps.locked_packages("python", ["python3"], tmp_path) == ["python3=3.11.2-1+b1", "libc6=2.36-9"]
    assert build_steps.locked_packages("other", ["g++"], tmp_path) == ["g++"]


def test_offline_debs_go_where_the_host_s_pool_list_says(tmp_path: Path) -> None:
    tools, repository = tmp_path / "tools", tmp_path / "repo"
    (tools / "debian" / "dists" / "bookworm").mkdir(parents=True)
    (tools / "debian" / "dists" / "bookworm" / "InRelease").write_text("signed")
    (tools / "debs").mkdir()
    (tools / "debs" / "python3_3.11.2-1+b1_amd64.deb").write_bytes(b"deb")
    (tools / "pool.txt").write_text("python3_3.11.2-1+b1_amd64.deb pool/main/p/python3-defaults/python3.deb\n")
    build_steps.place_offline_debs(tools, repository)
    assert (repository / "pool/main/p/python3-defaults/python3.deb").read_bytes() == b"deb"
    assert (repository / "dists/bookworm/InRelease").read_text() == "signed"


def test_apt_s_lists_become_a_repository_s_dists_and_flat_repositories_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyring = tmp_path / "debian-archive-keyring.gpg"
    keyring.write_bytes(b"keys")
    monkeypatch.setattr(build_steps, "DEBIAN_KEYRING", str(keyring))
    lists = tmp_path / "lists"
    lists.mkdir()
    for name in ("InRelease", "main_binary-amd64_Packages", "main_i18n_Translation-en"):
        (lists / f"mirror.invalid_debian_dists_bookworm_{name}").write_text(name)
    build_steps.copy_indexes(lists, tmp_path / "out")
    found = sorted(str(path.relative_to(tmp_path / "out")) for path in (tmp_path / "out").rglob("*") if path.is_file())
    assert found == ["dists/bookworm/InRelease", "dists/bookworm/main/binary-amd64/Packages"]
    (lists / "developer.invalid_compute_cuda_repos_x86_64_Packages").write_text("flat")
    with pytest.raises(StepError, match="flat repository"):
        build_steps.copy_indexes(lists, tmp_path / "again")
    keyring.unlink()
    with pytest.raises(StepError, match="no Debian archive keyring"):
        build_steps.copy_indexes(lists, tmp_path / "again")


def test_a_release_file_gives_each_index_s_sha256() -> None:
    release = "Origin: Debian\nMD5Sum:\n 0 1 main/x\nSHA256:\n " + "b" * 64 + " 9 main/binary-amd64/Packages.xz\n"
    release += " " + "c" * 64 + " 7 main/binary-amd64/Packages\nAcquire-By-Hash: yes\n"
    assert build_steps.release_sha256(release, "main/binary-amd64/Packages.xz") == "b" * 64
    assert build_steps.release_sha256(release, "main/binary-all/Packages.xz") is None


def test_a_failing_step_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """Run as the build runs it: the file alone, beside build_record.py, before verlbox is installed."""
    script = paths.PACKAGE_DIR / "runtime" / "steps" / "build_steps.py"
    result = subprocess.run(
        [sys.executable, "-S", str(script), "--offline", "pip", "nothing-locked", "six"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "verlbox: the lock has no Python files for step nothing-locked: an offline build installs only the lock"
    ]


def test_a_venv_whose_pip_has_no_report_records_the_python_step_as_a_newer_pip_does(tmp_path: Path) -> None:
    """The p40 base's rehearsal: Ubuntu 22.04's `python3 -m venv` gives pip 22.0.2, older than --report.
    The real python step, run by that venv's interpreter with the host's package index, installs the
    recipe's pip pin first and records pip and uv as a venv with a newer pip records them."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "pip==22.0.2"], check=True)
    version = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("pip 22.0.2 ")
    script = paths.PACKAGE_DIR / "runtime" / "steps" / "build_steps.py"
    records = tmp_path / "records"
    driver = (
        "import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import build_steps; "
        "build_steps.install_python('python', sys.argv[3:], dict(os.environ), offline=False, records=Path(sys.argv[2]))"
    )
    subprocess.run([python, "-c", driver, str(script.parent), str(records), "pip==25.1.1", "uv==0.9.5"], check=True)
    recorded = {entry["name"]: entry["version"] for entry in json.loads((records / "python.pip.json").read_text())}
    assert recorded == {"pip": "25.1.1", "uv": "0.9.5"}
    after = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=True).stdout
    assert after.startswith("pip 25.1.1 ")


def test_an_old_pip_with_no_pip_pin_in_its_step_stops_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_steps.metadata, "version", lambda name: "22.0.2")
    with pytest.raises(StepError, match=r"pip 22.0.2 here has no --report .* pins no pip"):
        build_steps.pip_with_report(["six==1.16.0"], {})
    monkeypatch.setattr(build_steps.metadata, "version", lambda name: "23.0.1")
    assert build_steps.pip_with_report(["six==1.16.0"], {}) == []


@pytest.fixture
def jammy(tmp_path: Path) -> tuple[Path, Path]:
    """p40's base as apt sees it: Ubuntu 22.04's one-line sources.list, NVIDIA's flat CUDA repository beside it."""
    folder = tmp_path / "jammy-apt"
    (folder / "sources.list.d").mkdir(parents=True)
    (folder / "sources.list").write_text(
        "deb http://archive.ubuntu.invalid/ubuntu/ jammy main restricted\n"
        "deb http://security.ubuntu.invalid/ubuntu/ jammy-security main restricted\n"
    )
    (folder / "sources.list.d" / "cuda.list").write_text(
        "deb [signed-by=/usr/share/keyrings/cuda.gpg] https://developer.invalid/cuda/repos/ubuntu2204/x86_64 /\n"
    )
    ubuntu = tmp_path / "ubuntu-os-release"
    ubuntu.write_text(
        'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'
    )
    return folder, ubuntu


def test_an_ubuntu_base_keeps_its_own_sources_and_refuses_a_debian_mirror_in_one_line(jammy: tuple[Path, Path]) -> None:
    etc, ubuntu = jammy
    assert build_steps.distribution(ubuntu) == "ubuntu"
    with build_steps.apt_options(Secrets(), etc=etc, os_release=ubuntu) as options:
        assert "Dir::Etc::SourceList" not in option_values(options)  # the base's own files, as they are
    with (
        pytest.raises(StepError) as refused,
        build_steps.apt_options(Secrets(apt_mirror="http://deb.invalid/debian"), etc=etc, os_release=ubuntu),
    ):
        pass
    assert str(refused.value) == (
        "the build's apt mirror is a Debian archive, and this base is ubuntu: build without --apt-mirror"
    )
    debian = ubuntu.with_name("debian-os-release")
    debian.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_CODENAME=bookworm\n')
    with build_steps.apt_options(
        Secrets(apt_mirror="http://deb.invalid/debian"), etc=etc, os_release=debian
    ) as options:
        assert "Dir::Etc::SourceList" in option_values(options)
