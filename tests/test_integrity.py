"""verify checks bytes: installed files against their RECORD, site-packages against what RECORDs own (bytecode
against its source), each RECORD against the build's record, Debian's files by dpkg --verify."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import docker, run_verlbox
from verlbox.runtime.checks import integrity
from verlbox.runtime.steps import apex_build, build_record, placed

MODULE = b"def answer():\n    return 42\n"


def record_line(site: Path, relative: str) -> str:
    data = (site / relative).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(data)}"


def install(site: Path, name: str = "demo", version: str = "1.0", files: dict[str, bytes] | None = None) -> Path:
    """A distribution as an installer leaves it: its files, METADATA and a RECORD listing them (itself unhashed)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    files = {f"{name}/__init__.py": b"", f"{name}/core.py": MODULE} | (files or {})
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [record_line(site, relative) for relative in [*files, info.name + "/METADATA"]]
    (info / "RECORD").write_text("\n".join([*lines, f"{info.name}/RECORD,,"]) + "\n")
    return info


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site-packages"
    install(folder)
    return folder


def check(site: Path, placed_file: Path | None = None) -> list[str]:
    return integrity.python_differences(site, placed_file or site.parent / "no-placed.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_intact_distribution_has_no_difference(site: Path) -> None:
    assert check(site) == []


def test_a_changed_module_is_named_with_both_hashes(site: Path) -> None:
    module = site / "demo" / "core.py"
    recorded = sha256(module)
    module.write_bytes(MODULE.replace(b"42", b"43"))  # same size: only the hash can tell
    assert check(site) == [
        f"python demo: demo/core.py differs from its RECORD (sha256 {sha256(module)[:12]}, RECORD {recorded[:12]})"
    ]


def test_a_module_of_another_size_is_named_by_its_size(site: Path) -> None:
    with (site / "demo" / "core.py").open("ab") as module:
        module.write(b"#")
    assert check(site) == [
        f"python demo: demo/core.py differs from its RECORD (size {len(MODULE) + 1}, RECORD {len(MODULE)})"
    ]


def test_a_missing_file_is_named(site: Path) -> None:
    (site / "demo" / "core.py").unlink()
    assert check(site) == ["python demo: demo/core.py is in its RECORD but missing"]


def test_an_added_pth_is_named(site: Path) -> None:
    (site / "zz-hook.pth").write_text("import os\n")
    assert check(site) == ["site-packages zz-hook.pth: a .pth in no distribution's RECORD (run at every start)"]


def test_a_file_no_record_lists_is_named(site: Path) -> None:
    (site / "demo" / "extra.py").write_bytes(b"print('hello')\n")
    assert check(site) == ["site-packages demo/extra.py: in no distribution's RECORD"]


def test_a_record_hashed_with_md5_is_refused(site: Path) -> None:
    record = site / "demo-1.0.dist-info" / "RECORD"
    digest = base64.urlsafe_b64encode(hashlib.md5(MODULE).digest()).rstrip(b"=").decode()
    lines = [
        f"demo/core.py,md5={digest},{len(MODULE)}" if line.startswith("demo/core.py,") else line
        for line in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")
    assert check(site) == ["python demo: demo/core.py is hashed with md5 in its RECORD, not sha256 or stronger"]


@pytest.mark.parametrize(
    "mode",
    [
        py_compile.PycInvalidationMode.CHECKED_HASH,
        py_compile.PycInvalidationMode.UNCHECKED_HASH,
        py_compile.PycInvalidationMode.TIMESTAMP,
    ],
    ids=lambda mode: mode.name,
)
def test_bytecode_of_an_owned_source_is_accepted(site: Path, mode: py_compile.PycInvalidationMode) -> None:
    py_compile.compile(str(site / "demo" / "core.py"), doraise=True, invalidation_mode=mode)
    assert list((site / "demo" / "__pycache__").glob("core.*.pyc"))
    assert check(site) == []


def test_bytecode_a_wheel_ships_may_be_rewritten_by_the_build_s_compile(tmp_path: Path) -> None:
    """numpy 1.26.4's wheel lists a .pyc in its RECORD; the build compiles every module again, so its bytes change."""
    site = tmp_path / "site-packages"
    source = site / "demo" / "core.py"
    pyc = Path(importlib.util.cache_from_source(str(source)))
    install(site, files={os.path.relpath(pyc, site): b"stale bytecode from the wheel"})
    py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert check(site) == []
    source.write_bytes(MODULE.replace(b"42", b"43"))  # the bytecode now belongs to no installed source
    assert check(site) == [
        f"python demo: demo/core.py differs from its RECORD (sha256 {sha256(source)[:12]}, RECORD "
        f"{hashlib.sha256(MODULE).hexdigest()[:12]})",
        f"python demo: {os.path.relpath(pyc, site)} differs from its RECORD (size {pyc.stat().st_size}, RECORD 29)",
    ]


def stale_bytecode(site: Path, mode: py_compile.PycInvalidationMode) -> str:
    """Bytecode of other code than demo/core.py's, written where Python looks for core.py's; its path in SITE."""
    source = site / "demo" / "core.py"
    stat = source.stat()
    source.write_bytes(MODULE.replace(b"42", b"43"))
    py_compile.compile(str(source), doraise=True, invalidation_mode=mode)
    source.write_bytes(MODULE)  # the source is the installed one again (its RECORD holds)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))
    return os.path.relpath(importlib.util.cache_from_source(str(source)), site)


def test_stale_hash_based_bytecode_is_refused(site: Path) -> None:
    pyc = stale_bytecode(site, py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert check(site) == [f"site-packages {pyc}: bytecode whose source hash is not core.py's"]


def test_stale_timestamp_bytecode_is_refused(site: Path) -> None:
    pyc = stale_bytecode(site, py_compile.PycInvalidationMode.TIMESTAMP)
    assert check(site) == [f"site-packages {pyc}: bytecode whose source time and size are not core.py's"]


def test_bytecode_without_an_owned_source_is_refused(site: Path) -> None:
    source = site / "demo" / "gone.py"
    source.write_bytes(MODULE)
    py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    source.unlink()
    pyc = os.path.relpath(importlib.util.cache_from_source(str(source)), site)
    assert check(site) == [f"site-packages {pyc}: bytecode of no installed source"]


def test_a_file_verlbox_patched_is_held_to_what_the_build_placed(site: Path, tmp_path: Path) -> None:
    module = site / "demo" / "core.py"
    module.write_bytes(MODULE + b"# patched\n")
    placed_file = tmp_path / "placed.json"
    placed_file.write_text(json.dumps({"demo/demo/core.py": sha256(module)}))
    assert check(site, placed_file) == []
    module.write_bytes(MODULE + b"# swapped\n")  # what the build placed no longer vouches for it
    assert check(site, placed_file) == [
        f"python demo: demo/core.py differs from its RECORD (size {len(MODULE) + 10}, RECORD {len(MODULE)})"
    ]


def write_build_record(folder: Path, entries: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "verl-deps.json").write_text(json.dumps(entries))
    return folder


def test_a_record_other_than_the_build_recorded_is_named(site: Path, tmp_path: Path) -> None:
    record = site / "demo-1.0.dist-info" / "RECORD"
    built = sha256(record)
    folder = write_build_record(tmp_path / "installed", [{"name": "demo", "version": "1.0", "record": built}])
    assert integrity.build_record_differences(site, folder) == integrity.Findings()
    # a forger who edits a module and rewrites its RECORD line to match passes the RECORD check, not this one
    (site / "demo" / "core.py").write_bytes(MODULE.replace(b"42", b"43"))
    lines = [
        record_line(site, "demo/core.py") if line.startswith("demo/core.py,") else line
        for line in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")
    assert check(site) == []
    assert integrity.build_record_differences(site, folder) == integrity.Findings(
        differences=[f"python demo: RECORD sha256 {sha256(record)[:12]}, the build recorded {built[:12]}"]
    )


def test_another_version_than_the_build_recorded_is_named(site: Path, tmp_path: Path) -> None:
    folder = write_build_record(tmp_path / "installed", [{"name": "Demo", "version": "0.9", "record": "0" * 64}])
    assert integrity.build_record_differences(site, folder).differences == [
        "python demo: 1.0 installed, the build recorded 0.9"
    ]


def test_an_image_without_the_build_s_record_gets_a_note_not_a_difference(site: Path, tmp_path: Path) -> None:
    folder = tmp_path / "installed"
    assert integrity.build_record_differences(site, folder) == integrity.Findings(
        notes=[f"no record of the installed RECORD files ({folder}): built by an older verlbox"]
    )


def test_a_malformed_build_record_is_a_difference(site: Path, tmp_path: Path) -> None:
    folder = write_build_record(tmp_path / "installed", [{"name": "demo"}])
    assert integrity.build_record_differences(site, folder).differences == [
        f"build record {folder / 'verl-deps.json'}: not a list of {{name, version, record}}"
    ]


# the first line is every built image's (apt's lists emptied by each apt step); the rest are changes
DPKG_VERIFY = """\
missing     /var/lib/apt/lists/partial
??5?????? c /etc/bash.bashrc
??5??????   /usr/bin/python3.11
missing     /usr/lib/x86_64-linux-gnu/libssl.so.3 (No such file or directory)
"""


def test_dpkg_verify_lines_name_changed_binaries_and_libraries() -> None:
    assert integrity.debian_differences(DPKG_VERIFY) == [
        "debian /etc/bash.bashrc: changed since installed (dpkg --verify ??5??????) (a conffile)",
        "debian /usr/bin/python3.11: changed since installed (dpkg --verify ??5??????)",
        "debian /usr/lib/x86_64-linux-gnu/libssl.so.3: missing",
    ]


def test_the_checker_s_paths_are_the_build_s() -> None:
    """integrity.py imports nothing of verlbox (verify runs its text in the image before site): its copies agree."""
    assert integrity.PLACED == placed.PLACED
    assert integrity.INSTALLED == build_record.RECORD_DIR / "installed"
    assert ("apex", apex_build.SOURCE_RECORD) in integrity.BUILD_ADDED
    assert not [
        line
        for line in Path(integrity.__file__).read_text().splitlines()
        if "import verlbox" in line or "from verlbox" in line
    ]


# In a derived image: a module of DIST edited as a forger would, its bytecode and its RECORD line made to match.
FORGE_RECORD = """
import base64, hashlib, importlib.metadata as metadata, py_compile, sys
from pathlib import Path
dist = metadata.distribution(sys.argv[1])
module = Path(dist.locate_file(sys.argv[2]))
module.write_bytes(module.read_bytes() + b"# forged\\n")
py_compile.compile(str(module), doraise=True)
data = module.read_bytes()
digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = Path(dist._path) / "RECORD"
lines = [f"{sys.argv[2]},sha256={digest},{len(data)}" if line.startswith(sys.argv[2] + ",") else line
         for line in record.read_text().splitlines()]
record.write_text("\\n".join(lines) + "\\n")
"""


@pytest.mark.docker
@pytest.mark.slow
def test_verify_names_an_added_pth_an_edited_module_and_a_rewritten_record(image: str, tmp_path: Path) -> None:
    intact = run_verlbox("verify", image)
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "site-packages" not in intact.stdout and "RECORD" not in intact.stdout
    site = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
    tampered = "verlbox-test/p40-cu124-integrity-tampered:ci"
    context = tmp_path / "context"
    context.mkdir()
    (context / "forge.py").write_text(FORGE_RECORD)
    (context / "Dockerfile").write_text(
        f"FROM {image}\n"
        "COPY forge.py /tmp/forge.py\n"
        f"RUN site={site} && echo 'import os' > \"$site/zz-verlbox-test.pth\" "
        "&& printf '#' >> \"$site/codetiming/_timer.py\" && python /tmp/forge.py dill dill/__info__.py\n"
    )
    docker("buildx", "build", "--load", "--progress", "plain", "--tag", tampered, str(context))
    try:
        result = run_verlbox("verify", tampered)
    finally:
        docker("image", "rm", tampered, check=False)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "site-packages zz-verlbox-test.pth: a .pth in no distribution's RECORD (run at every start)" in lines
    changed = "python codetiming: codetiming/_timer.py differs from its RECORD (size "
    stale = "site-packages codetiming/__pycache__/_timer.cpython-311.pyc: bytecode whose source time and size"
    assert any(line.startswith(changed) for line in lines) and any(line.startswith(stale) for line in lines), lines
    # the forged module passes its RECORD, which is no longer the one the build recorded
    assert [line for line in lines if line.startswith("python dill:")] == [
        next(line for line in lines if line.startswith("python dill: RECORD sha256 ") and "the build recorded" in line)
    ]


def test_the_checker_finds_the_venv_s_site_packages_without_site() -> None:
    """verify runs the checker under `python -I -S`, where sys.prefix is still the base interpreter's."""
    probe = f"exec({Path(integrity.__file__).read_text()!r}); print(site_packages())"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == sysconfig.get_paths()["purelib"]
