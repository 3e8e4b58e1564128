"""Build NVIDIA Apex into a wheel from a hashed source archive, and read the machine code it holds.

Standard library only: the same file runs in an image's Apex build stage (before verlbox is
installed there, copied into the build context on its own so that no other change to verlbox
invalidates the cached compile), on a GPU machine without Docker, and inside images for smoke.

    python3 apex_build.py PLAN.json ARCHIVE OUT_DIR [WORK_DIR]

PLAN.json is what verlbox's Apex component renders: the commit, the archive's sha256, the target
architectures, how extensions are requested, the declared build patches (each replaces an exact
text a counted number of times, and only for the nvcc versions it names), and what makes the compile
repeatable: the fixed folder it compiles in and the environment it adds (nvcc's flags).

The same plan, archive and toolchain give the same wheel, byte for byte: nvcc hashes a source file's
absolute path into the names of its anonymous namespaces (so the folder is fixed), names its
intermediates after its PID unless told to keep them beside the object (`-objtemp`), and with
`-lineinfo` (amp_C asks for it) records the modification time of every header in the device code's
line table: torch's headers carry the time pip installed them, so their times are set to the commit's
first (apt's and the toolkit's headers keep their packages' times). The wheel's zip entries carry
SOURCE_DATE_EPOCH, the commit's time too (which `git archive` gives every entry).

With WORK_DIR the source is unpacked there instead and kept, so that an interrupted compile resumes
where it stopped (ninja), and torch's header times are left alone (a machine's own torch): a wheel
compiled so is not the one the image's build stage gives.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

SOURCE_RECORD = "verlbox-source.json"
_FATBIN_MAGIC = 0xBA55ED50
_ELF_CUBIN, _PTX = 2, 1


class ApexBuildError(Exception):
    pass


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def archive_commit(archive: Path) -> str:
    """`git archive` writes the commit it was made from into the tar's pax header."""
    with tarfile.open(archive) as tar:
        return tar.pax_headers.get("comment", "")


def archive_epoch(archive: Path) -> int:
    """The commit's time: `git archive` gives it to every entry (the newest entry's, for any other tar)."""
    with tarfile.open(archive) as tar:
        return max(int(member.mtime) for member in tar.getmembers())


def _section(data: bytes, wanted: str) -> bytes:
    """One named section of an ELF64 little-endian file (empty when absent)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ApexBuildError("not a 64-bit ELF file")
    section_offset = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    for header in headers:
        start = names + header[0]
        if data[start : data.index(b"\0", start)].decode() == wanted:
            return data[header[4] : header[4] + header[5]]
    return b""


def fatbin_architectures(shared_object: Path) -> dict[str, list[str]]:
    """The CUDA code in a .so's .nv_fatbin section: machine code (sm_XY) and PTX (compute_XY).

    The fatbin is a sequence of blobs (magic, version, header size, payload size), each holding
    entries whose header gives the kind (2: ELF cubin, 1: PTX) and the architecture number.
    """
    blob = _section(shared_object.read_bytes(), ".nv_fatbin")
    found: dict[str, set[str]] = {"sass": set(), "ptx": set()}
    offset = 0
    while offset + 16 <= len(blob):
        magic, _, header_size, payload = struct.unpack_from("<IHHQ", blob, offset)
        if magic != _FATBIN_MAGIC:
            offset += 8  # blobs are 8-byte aligned
            continue
        entry, end = offset + header_size, offset + header_size + payload
        while entry + 32 <= end:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", blob, entry)
            arch = struct.unpack_from("<I", blob, entry + 28)[0]
            if kind == _ELF_CUBIN:
                found["sass"].add(f"sm_{arch}")
            elif kind == _PTX:
                found["ptx"].add(f"compute_{arch}")
            entry += entry_header + entry_size
        offset = end
    return {kind: sorted(archs, key=lambda a: int(a.split("_")[1])) for kind, archs in found.items()}


def nvcc_version() -> str:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    output = subprocess.run([str(nvcc) if nvcc.exists() else "nvcc", "--version"], capture_output=True, text=True)
    match = re.search(r"release (\d+\.\d+)", output.stdout)
    if not match:
        raise ApexBuildError(f"nvcc --version said nothing usable: {output.stdout}{output.stderr}")
    return match.group(1)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def apply_build_patches(source: Path, patches: list[dict], cuda: str) -> list[str]:
    """Apply each declared patch whose nvcc range includes `cuda`; each must match exactly `count` times."""
    applied = []
    for patch in patches:
        if _version_tuple(cuda) < _version_tuple(patch.get("min_cuda", "0")):
            continue
        path = source / patch["file"]
        text = path.read_text()
        found = text.count(patch["find"])
        if found != patch["count"]:
            raise ApexBuildError(
                f"build patch {patch['id']}: expected {patch['count']} places in {patch['file']}, found {found}"
            )
        path.write_text(text.replace(patch["find"], patch["replace"]))
        applied.append(patch["id"])
    return applied


def default_max_jobs() -> int:
    """Parallel compiles: one per core, but each nvcc job wants ~2 GiB of memory."""
    try:
        available_kib = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemAvailable")
        )
    except (OSError, StopIteration):
        available_kib = 4 << 20
    return max(1, min(os.cpu_count() or 1, available_kib // (2 << 20)))


def _prepared_source(archive: Path, workdir: Path, patches: list[dict], cuda: str) -> tuple[Path, list[str]]:
    """Unpack and patch once; a second call with the same WORK_DIR finds it ready (and its objects built)."""
    marker = workdir / "verlbox-prepared.json"
    if marker.is_file():
        prepared = json.loads(marker.read_text())
        return Path(prepared["source"]), prepared["build_patches"]
    with tarfile.open(archive) as tar:
        # the archive's hash is checked; the filter is one more guard where this Python has it
        tar.extractall(workdir, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (source,) = [path for path in workdir.iterdir() if path.is_dir()]
    applied = apply_build_patches(source, patches, cuda)
    marker.write_text(json.dumps({"source": str(source), "build_patches": applied}))
    return source, applied


def clamp_header_times(epoch: int) -> int:
    """Set the times of torch's installed headers to EPOCH (nvcc records them); how many files."""
    spec = importlib.util.find_spec("torch")  # found, not imported: this script needs no torch itself
    if spec is None or not spec.submodule_search_locations:
        raise ApexBuildError("torch is not installed here: Apex builds against it")
    clamped = 0
    for root, _, files in os.walk(Path(spec.submodule_search_locations[0]) / "include"):
        for name in files:
            os.utime(Path(root) / name, (epoch, epoch), follow_symlinks=False)
            clamped += 1
    return clamped


def compile_wheel(source: Path, out: Path, plan: dict, source_date_epoch: int) -> None:
    """`pip wheel` of the unpacked SOURCE into OUT, for the plan's architectures, with its environment."""
    settings = {
        "TORCH_CUDA_ARCH_LIST": plan["arch_list"],
        "MAX_JOBS": str(plan.get("max_jobs") or default_max_jobs()),
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
    }
    env = os.environ | plan["environment"] | settings
    command = [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(out)]
    if plan["build_style"] == "env":
        env |= {"APEX_CPP_EXT": "1", "APEX_CUDA_EXT": "1"}
    else:
        command += [
            "--config-settings",
            "--build-option=--cpp_ext",
            "--config-settings",
            "--build-option=--cuda_ext",
        ]
    subprocess.run([*command, str(source)], env=env, check=True)


def build(plan: dict, archive: Path, out: Path, workdir: Path | None = None) -> dict:
    sha256 = file_sha256(archive)
    if sha256 != plan["archive_sha256"]:
        raise ApexBuildError(f"{archive.name}: sha256 {sha256}, but the recipe pins {plan['archive_sha256']}")
    commit = archive_commit(archive)
    if commit != plan["commit"]:
        raise ApexBuildError(f"{archive.name} was made from commit {commit or '(none recorded)'}, not {plan['commit']}")
    cuda = nvcc_version()
    folder = workdir or Path(plan["build_folder"])
    if workdir is None:  # a fresh compile: nothing left from another one may reach this wheel
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    epoch = archive_epoch(archive)
    if workdir is None:  # in the image's build stage: its torch is the stage's own
        clamp_header_times(epoch)
    try:
        source, applied = _prepared_source(archive, folder, plan["build_patches"], cuda)
        compile_wheel(source, out, plan, epoch)
    finally:
        if workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    record = {
        "commit": commit,
        "archive_sha256": sha256,
        "nvcc": cuda,
        "arch_list": plan["arch_list"],
        "build_patches": applied,
    }
    (out / SOURCE_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    plan, archive, out = json.loads(Path(argv[0]).read_text()), Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    try:
        record = build(plan, archive, out, Path(argv[3]) if len(argv) == 4 else None)
    except ApexBuildError as exc:
        print(f"apex build: {exc}", file=sys.stderr)
        return 1
    print(f"apex build: {json.dumps(record, sort_keys=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
