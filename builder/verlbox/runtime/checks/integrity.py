"""The bytes an image installed, held to what vouches for them: every Python distribution's files to its RECORD,
every file of site-packages to some RECORD (bytecode to its source), each RECORD to the one the build recorded,
and Debian's files to dpkg's checksums. Versions alone cannot see a wheel whose modules were edited, or an added
`.pth`, both of which a poisoned package cache can bring.

Standard library only, importing nothing of verlbox: `verlbox verify` sends this file's text into the image and
runs it under `python -I -S`, before `site` runs any `.pth` (one could otherwise hide itself from the walk), and
without trusting the image's own copy of this checker.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# what the build writes (standalone copies, held equal to placed.PLACED and build_record.RECORD_DIR by the tests)
PLACED = Path("/opt/verlbox/placed.json")
INSTALLED = Path("/opt/verlbox/build-record/installed")
# written into Apex's dist-info by the build after pip installed it (apex_build.SOURCE_RECORD): its commit is
# compared with the recipe's by verify and smoke
BUILD_ADDED = {("apex", "verlbox-source.json")}
# the wheel spec forbids md5 and sha1 in a RECORD: a collision there would make a forged file look installed
STRONG_HASHES = {"sha256", "sha384", "sha512"}
CHUNK = 1 << 20

# The one `dpkg --verify` line of a built image (p40-cu124), and why it is no change: every apt step empties
# /var/lib/apt/lists (a layer keeps no index, and two builds the same bytes), apt's own `partial` folder with it;
# apt makes it again at its next update. Not listed, because dpkg owns none of them: the logs the build truncates
# (/var/log), the caches and /etc/hostname it removes. A changed or missing binary, library or conffile is a line.
EXPECTED_DEBIAN = {("missing", "/var/lib/apt/lists/partial")}


@dataclass
class Findings:
    """DIFFERENCES fail a verify; NOTES say what could not be checked (an image built by an older verlbox)."""

    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages() -> Path:
    """The running venv's site-packages (the image's, /opt/venv: purelib and platlib are one folder). Found from the
    interpreter's path: under -S, `site` never set sys.prefix to the venv, so sysconfig alone names the base's."""
    venv = Path(sys.executable).parent.parent
    if not (venv / "pyvenv.cfg").is_file():
        return Path(sysconfig.get_paths()["purelib"])
    # Debian's default scheme puts a prefix's packages under local/ and dist-packages: a venv has its own (3.11+)
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
    return Path(sysconfig.get_paths(scheme, vars={"base": str(venv), "platbase": str(venv)})["purelib"])


def file_hash(path: Path, algorithm: str = "sha256") -> bytes:
    digest = hashlib.new(algorithm)
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)  # releases the GIL: python_differences' threads hash in parallel
    return digest.digest()


@dataclass(frozen=True)
class _Entry:
    name: str  # the distribution's canonical name
    entry: str  # the path as its RECORD lists it
    path: Path
    algorithm: str
    digest: str  # urlsafe base64, unpadded, as RECORD writes it
    size: int | None


def _recorded_entries(site: Path) -> tuple[list[_Entry], set[str], list[str]]:
    """Every hashed RECORD line under SITE, the paths RECORDs list (normalised), and the distributions without one."""
    entries, owned, found = [], set(), []
    for distribution in metadata.distributions(path=[str(site)]):
        name = canonical(distribution.metadata["Name"] or "?")
        try:
            files = distribution.files
        except ValueError:  # a size that is not a number
            files = None
        if files is None:
            found.append(f"python {name}: no readable RECORD in {distribution._path.name}")  # type: ignore[attr-defined]
            continue
        for file in files:
            path = Path(os.path.normpath(distribution.locate_file(file)))
            owned.add(str(path))  # a line without a hash still owns its path: the spec allows one (RECORD's own)
            if file.hash is not None:
                entries.append(_Entry(name, str(file), path, file.hash.mode, file.hash.value, file.size))
    return entries, owned, found


def _entry_difference(entry: _Entry, placed: dict[str, str], owned: set[str]) -> str | None:
    where = f"python {entry.name}: {entry.entry}"
    if entry.algorithm not in STRONG_HASHES:
        return f"{where} is hashed with {entry.algorithm} in its RECORD, not sha256 or stronger"
    try:
        size = entry.path.stat().st_size
    except FileNotFoundError:
        return f"{where} is in its RECORD but missing"
    try:
        return _content_difference(entry, where, size, placed, owned)
    except OSError as exc:  # a folder or an unreadable file where RECORD names a file: named, not a crash
        return f"{where} cannot be read ({exc.strerror or exc})"


def _content_difference(entry: _Entry, where: str, size: int, placed: dict[str, str], owned: set[str]) -> str | None:
    recorded = base64.urlsafe_b64decode(entry.digest + "=" * (-len(entry.digest) % 4))
    if entry.size is not None and size != entry.size:
        now = None
    else:
        now = file_hash(entry.path, entry.algorithm)
        if now == recorded:
            return None
    # verlbox patches verl over its wheel: such a file is held to what the build placed (placed.py) instead
    built = placed.get(f"{entry.name}/{entry.entry}")
    if built is not None and built == file_hash(entry.path).hex():
        return None
    # a wheel that ships bytecode (numpy 1.26.4 has one .pyc) has it rewritten by the build's own compile: bytecode
    # is held to its source, as the bytecode no RECORD lists is
    if entry.path.parent.name == "__pycache__" and _bytecode_difference(entry.path, owned) is None:
        return None
    if now is None:
        return f"{where} differs from its RECORD (size {size}, RECORD {entry.size})"
    return f"{where} differs from its RECORD ({entry.algorithm} {now.hex()[:12]}, RECORD {recorded.hex()[:12]})"


def _bytecode_difference(pyc: Path, owned: set[str]) -> str | None:
    """Why PYC, in a __pycache__, is not the bytecode of a source some RECORD lists, as it is now (None if it is)."""
    try:
        source = Path(importlib.util.source_from_cache(str(pyc)))
    except ValueError:
        return "in no distribution's RECORD"
    if str(source) not in owned or not source.is_file():
        return "bytecode of no installed source"
    with pyc.open("rb") as stream:
        header = stream.read(16)
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return "not this Python's bytecode"
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:  # PEP 552: hash-based, checked or not (an unchecked one is run whatever the source says)
        if header[8:16] != importlib.util.source_hash(source.read_bytes()):
            return f"bytecode whose source hash is not {source.name}'s"
        return None
    if flags:
        return f"bytecode with unknown flags {flags}"
    stat = source.stat()
    mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
    if (mtime, size) != (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF):
        return f"bytecode whose source time and size are not {source.name}'s"
    return None


def unowned_differences(site: Path, owned: set[str]) -> list[str]:
    """Every file of SITE that no RECORD lists and that is not the matching bytecode of a file one does."""
    found = []
    build_added = {str(path) for path in _build_added(site)}
    for folder, folders, files in os.walk(site):
        folders.sort()
        for name in sorted(files) + sorted(f for f in folders if os.path.islink(os.path.join(folder, f))):
            path = os.path.join(folder, name)
            if path in owned or path in build_added:
                continue
            relative = os.path.relpath(path, site)
            if name.endswith(".pth"):
                found.append(f"site-packages {relative}: a .pth in no distribution's RECORD (run at every start)")
            elif os.path.basename(folder) == "__pycache__" and name.endswith(".pyc"):
                if why := _bytecode_difference(Path(path), owned):
                    found.append(f"site-packages {relative}: {why}")
            else:
                found.append(f"site-packages {relative}: in no distribution's RECORD")
    return found


def _build_added(site: Path) -> Iterable[Path]:
    for distribution in metadata.distributions(path=[str(site)]):
        for name, file in BUILD_ADDED:
            if canonical(distribution.metadata["Name"] or "") == name:
                yield Path(distribution._path) / file  # type: ignore[attr-defined]  # its dist-info folder


def python_differences(site: Path, placed: Path = PLACED) -> list[str]:
    """Each distribution's files against its RECORD, then SITE's files that no RECORD owns."""
    entries, owned, found = _recorded_entries(site)
    placed_hashes: dict[str, str] = json.loads(placed.read_text()) if placed.is_file() else {}
    # a large image's hashing (torch alone is gigabytes) is spread over threads: hashlib works without the GIL
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) * 2)) as pool:
        lines = pool.map(lambda entry: _entry_difference(entry, placed_hashes, owned), entries)
        found += [line for line in lines if line]
    return found + unowned_differences(site, owned)


def read_installed_records(folder: Path) -> dict[tuple[str, str], set[str]]:
    """(canonical name, version) -> the sha256 of each dist-info/RECORD the build's pip steps installed under it
    (folder/STEP.json: a list of {"name", "version", "record"}). A name installed by two steps has two."""
    recorded: dict[tuple[str, str], set[str]] = {}
    for path in sorted(folder.glob("*.json")):
        entries = json.loads(path.read_text())
        if not isinstance(entries, list) or not all(
            isinstance(entry, dict) and {"name", "version", "record"} <= set(entry) for entry in entries
        ):
            raise ValueError(f"{path}: not a list of {{name, version, record}}")
        for entry in entries:
            recorded.setdefault((canonical(entry["name"]), entry["version"]), set()).add(entry["record"])
    return recorded


def build_record_differences(site: Path, folder: Path = INSTALLED) -> Findings:
    """Each distribution's RECORD against the digest the build recorded when it installed it: a RECORD rewritten
    to match edited files is caught here. Distributions no pip step installed (verlbox, Apex) are not judged."""
    if not folder.is_dir():
        return Findings(notes=[f"no record of the installed RECORD files ({folder}): built by an older verlbox"])
    try:
        recorded = read_installed_records(folder)
    except (ValueError, OSError) as exc:
        return Findings(differences=[f"build record {exc}"])
    versions: dict[str, set[str]] = {}
    for name, version in recorded:
        versions.setdefault(name, set()).add(version)
    found = []
    for distribution in metadata.distributions(path=[str(site)]):
        name, version = canonical(distribution.metadata["Name"] or "?"), distribution.version
        if name not in versions:
            continue
        if (name, version) not in recorded:
            found.append(f"python {name}: {version} installed, the build recorded {', '.join(sorted(versions[name]))}")
            continue
        record = Path(distribution._path) / "RECORD"  # type: ignore[attr-defined]
        digest = file_hash(record).hex() if record.is_file() else "absent"
        if digest not in recorded[(name, version)]:
            built = ", ".join(sorted(value[:12] for value in recorded[(name, version)]))
            found.append(f"python {name}: RECORD sha256 {digest[:12]}, the build recorded {built}")
    return Findings(differences=found)


def debian_differences(output: str) -> list[str]:
    """The lines of `dpkg --verify` (`??5?????? c /path`, `missing     /path (error)`) that are not expected."""
    found = []
    for line in output.splitlines():
        match = re.fullmatch(r"(.{9}) (.) (/.*?)(?: \(.*\))?", line)
        if not match:
            found.append(f"debian: unreadable dpkg --verify line {line!r}")
            continue
        checks, kind, path = match.group(1).strip(), match.group(2), match.group(3)
        if (checks, path) in EXPECTED_DEBIAN:
            continue
        conffile = " (a conffile)" if kind == "c" else ""
        what = "missing" if checks == "missing" else f"changed since installed (dpkg --verify {checks})"
        found.append(f"debian {path}: {what}{conffile}")
    return found


def dpkg_verify() -> list[str]:
    # its status is 1 when it lists a difference: the lines say which
    run = subprocess.run(["dpkg", "--verify"], capture_output=True, text=True, check=False)
    if run.returncode not in (0, 1):
        return [f"debian: dpkg --verify failed (exit {run.returncode}): {run.stderr.strip()[-300:]}"]
    return debian_differences(run.stdout)


def check(site: Path | None = None, placed: Path = PLACED, installed: Path = INSTALLED) -> Findings:
    """Everything above for the running image: one line per difference."""
    site = site or site_packages()
    record = build_record_differences(site, installed)
    differences = python_differences(site, placed) + record.differences + dpkg_verify()
    return Findings(differences=differences, notes=record.notes)
