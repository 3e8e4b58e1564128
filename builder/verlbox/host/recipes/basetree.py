"""A bootstrapped base's identity and its one form: the canonical layer.

A debootstrapped tree becomes an image through `write_canonical_layer`: its files only (path, kind, mode, owner,
the bytes of each file, the target of each link or the numbers of each device), in path order, every time
zero, no owner names, no extended attributes, hard links as files. verlbox writes that layer itself and
loads it with a fixed config (`load_canonical_base`), so the same files give the same image ID, and Docker
never reads a base layer that verlbox did not write: a bundle's base.tar is read by Python, refused if it
holds anything the canonical form cannot say (an extended attribute, a name with a control character, a
path with `..`, a name twice), rewritten, and only the rewrite is loaded. Two readers of one archive (Python
here, Go in Docker) can then never see two different trees.

`tree_digest` is the sha256 of the canonical entries, with one part left out: the mirror's URI in
etc/apt/sources.list (the bootstrapping user's own; its suites, components and options count). The lock
pins it as base.tree; debootstrap gives the same tree on any machine and day once bootstrap.py has
settled what it writes from the clock or the host.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.clients.engine import docker_output, require_cli, require_image
from verlbox.runtime.steps.apex_build import file_sha256

# what a pax header may say about a member of a base layer: where it is, whose, how large, when
_PAX_KEYS = {"path", "linkpath", "size", "uid", "gid", "uname", "gname", "mtime", "atime", "ctime"}
_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.LNKTYPE: "file",  # a hard link becomes a copy: one entry per path, in any order
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.CHRTYPE: "char",
    tarfile.BLKTYPE: "block",
    tarfile.FIFOTYPE: "fifo",
}
_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "char": tarfile.CHRTYPE,
    "block": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
_SOURCES_LIST = "etc/apt/sources.list"
_DEB_LINE = re.compile(r"(deb(?:-src)?\s+(?:\[[^\]\s]*(?:\s[^\]\s]+)*\]\s+)?)((?:https?|file)://[^\s\[\]\"']+)(\s.*)")
_CHUNK = 1 << 20
# names as bytes, whatever this host's locale: a layer's names read and written the same way everywhere
NAMES = {"encoding": "utf-8", "errors": "surrogateescape"}


@dataclass(frozen=True)
class Entry:
    """One path of a base layer in canonical form; `member` is where its bytes are in the source archive."""

    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    target: str = ""  # a symlink's target
    device: tuple[int, int] = (0, 0)
    size: int = 0
    member: tarfile.TarInfo | None = None


def _normal_path(name: str, where: str) -> str:
    if _UNSAFE.search(name):
        raise ValueError(f"{where}: {name!r} holds a control character")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{where}: {name!r} leaves the layer")
    return path.as_posix() if path.parts else ""


def canonical_entries(layer: tarfile.TarFile, where: str) -> list[Entry]:
    """LAYER's members as canonical entries in path order; ValueError naming WHERE for anything else."""
    entries: dict[str, Entry] = {}
    for member in layer.getmembers():
        path = _normal_path(member.name, where)
        if unknown := sorted(set(member.pax_headers) - _PAX_KEYS):
            raise ValueError(f"{where}: {path} carries {', '.join(unknown)} (a base layer has none)")
        if member.type not in _KINDS:
            raise ValueError(f"{where}: {path} is a tar member of type {member.type!r}")
        if path.startswith(".wh.") or "/.wh." in path:
            raise ValueError(f"{where}: {path} is a whiteout; a base is one layer")
        if path == "":  # the root folder itself: Docker keeps its own
            continue
        if path in entries:
            raise ValueError(f"{where}: {path} is in the layer twice")
        kind = _KINDS[member.type]
        if kind == "symlink" and _UNSAFE.search(member.linkname):
            raise ValueError(f"{where}: {path} links to {member.linkname!r}, which holds a control character")
        entries[path] = Entry(
            path,
            kind,
            member.mode & 0o7777,
            member.uid,
            member.gid,
            target=member.linkname if kind == "symlink" else "",
            device=(member.devmajor, member.devminor) if kind in ("char", "block") else (0, 0),
            size=member.size,
            member=member,
        )
    for path, entry in entries.items():
        parent = PurePosixPath(path).parent.as_posix()
        if parent != "." and (parent not in entries or entries[parent].kind != "dir"):
            # Docker would follow a link there (etc -> /tmp puts etc/passwd in /tmp): a folder comes first
            raise ValueError(f"{where}: {path} is not inside a folder of the layer ({parent} is not one)")
        if entry.member is not None and entry.member.islnk():  # a copy of its target, which must be a file here
            target = entries.get(_normal_path(entry.member.linkname, where))
            if target is None or target.member is None or not target.member.isreg():
                raise ValueError(f"{where}: {path} is a hard link to {entry.member.linkname}, not a file of the layer")
            entries[path] = replace(entry, size=target.size)
    return [entries[path] for path in sorted(entries)]


def _content(layer: tarfile.TarFile, entry: Entry, where: str) -> IO[bytes]:
    try:
        handle = layer.extractfile(entry.member) if entry.member is not None else None  # a hard link: its target's
    except KeyError:  # a hard link to a file that comes after it
        handle = None
    if handle is None:
        raise ValueError(f"{where}: {entry.path}: its bytes cannot be read from the layer")
    return handle


def _file_digest(layer: tarfile.TarFile, entry: Entry, where: str) -> str:
    handle, digest = _content(layer, entry, where), hashlib.sha256()
    if entry.path == _SOURCES_LIST:  # small; any mirror URI counts as one
        digest.update(_any_mirror(handle.read()))
    else:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _any_mirror(data: bytes) -> bytes:
    """etc/apt/sources.list with each `deb` line's URI as MIRROR; any other line, and any line whose URI is
    not a plain http(s) or file URL, exactly as it is."""
    lines = []
    for line in data.split(b"\n"):
        text = line.decode("ascii", errors="strict") if line.isascii() else None
        match = _DEB_LINE.fullmatch(text) if text is not None else None
        lines.append(f"{match.group(1)}MIRROR{match.group(3)}".encode() if match else line)
    return b"\n".join(lines)


def tree_digest(layer: tarfile.TarFile, where: str) -> str:
    """The sha256 of LAYER's canonical entries, one JSON record per path (no text can stand for two)."""
    digest = hashlib.sha256()
    for entry in canonical_entries(layer, where):
        what = _file_digest(layer, entry, where) if entry.kind == "file" else entry.target or list(entry.device)
        record = [entry.path, entry.kind, entry.mode, entry.uid, entry.gid, what]
        digest.update(json.dumps(record).encode() + b"\n")
    return digest.hexdigest()


def write_canonical_layer(layer: tarfile.TarFile, where: str, out: Path) -> None:
    """LAYER's canonical entries written to OUT as a tar: the bytes are a function of the tree alone."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT, **NAMES) as canonical:
        for entry in canonical_entries(layer, where):
            info = tarfile.TarInfo(entry.path)
            info.type, info.mode, info.uid, info.gid = _TYPES[entry.kind], entry.mode, entry.uid, entry.gid
            info.linkname, (info.devmajor, info.devminor) = entry.target, entry.device
            info.mtime, info.uname, info.gname = 0, "", ""
            if entry.kind == "file":
                info.size = entry.size
                canonical.addfile(info, _content(layer, entry, where))
            else:
                canonical.addfile(info)


@contextmanager
def saved_layer(archive: tarfile.TarFile, where: str) -> Iterator[tarfile.TarFile]:
    """The one layer of the one image in a `docker save` archive."""
    images = json.load(member(archive, "manifest.json"))
    if len(images) != 1 or len(images[0]["Layers"]) != 1:
        raise ValueError(f"{where}: a bootstrapped base is one image of one layer")
    with tarfile.open(fileobj=member(archive, images[0]["Layers"][0]), **NAMES) as layer:
        yield layer


def image_tree_digest(reference: str) -> str:
    """The tree digest of the base REFERENCE on this engine (saved to a scratch file, then read)."""
    try:
        with engine_layer(reference) as layer:
            return tree_digest(layer, reference)
    except (ValueError, KeyError, tarfile.TarError) as exc:
        raise VerlboxError(f"{reference}: not a base verlbox can read ({exc})") from None


@contextmanager
def engine_layer(reference: str) -> Iterator[tarfile.TarFile]:
    """The one layer of the engine's image REFERENCE, saved to a scratch file that goes when done."""
    with tempfile.TemporaryDirectory(prefix="verlbox-base-") as scratch:
        saved = Path(scratch) / "base.tar"
        docker_output("image", "save", "--output", str(saved), reference)
        with tarfile.open(saved) as archive, saved_layer(archive, reference) as layer:
            yield layer


def engine_base_hint(reference: str) -> str:
    return (
        f"remove it (docker image rm {reference}) and `verlbox build --bootstrap-base` makes the lock's base "
        "again; if that differs too, the Debian mirror no longer serves the lock's packages"
    )


def refuse_other_tree(where: str, found: str, locked: str, hint: str) -> None:
    if found != locked:
        raise UsageError(
            f"{where}: its files (tree sha256 {found[:16]}...) are not the lock's base "
            f"(base.tree {locked[:16]}...): {hint}"
        )


def canonical_engine_base(reference: str, locked: str | None, lock_path: Path | None) -> None:
    """The engine's base REFERENCE held to the tree LOCKED (from LOCK_PATH) and written again in canonical
    form under its name: whatever config it had (an ONBUILD, an ENTRYPOINT) is gone, and a base that was
    canonical already loads as itself. Nothing to do without a pin (a registry base)."""
    if locked is None:
        return
    hint = engine_base_hint(reference)
    require_image(reference, f"the lock {lock_path} was made on this bootstrapped base: build with --bootstrap-base")
    try:
        with engine_layer(reference) as layer:
            load_canonical_base(layer, reference, reference, locked, hint)
    except (ValueError, KeyError, tarfile.TarError) as exc:
        raise UsageError(f"{reference}: not a base verlbox can read ({exc}); {hint}") from None


def load_canonical_base(
    layer: tarfile.TarFile, where: str, reference: str, locked: str | None = None, hint: str = ""
) -> str:
    """LAYER rewritten in canonical form and loaded as REFERENCE with a fixed config (architecture from
    this host, time zero, no command): the same files give the same image ID. With LOCKED, the rewrite
    itself (the bytes Docker will read, not an earlier read of WHERE) must have that tree. Returns the ID."""
    architecture = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    with tempfile.TemporaryDirectory(prefix="verlbox-base-") as scratch:
        folder = Path(scratch)
        write_canonical_layer(layer, where, folder / "layer.tar")
        if locked is not None:
            with tarfile.open(folder / "layer.tar", **NAMES) as written:
                refuse_other_tree(where, tree_digest(written, where), locked, hint)
        diff_id = f"sha256:{file_sha256(folder / 'layer.tar')}"
        config = {
            "architecture": architecture,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "verlbox: a debootstrapped base"}],
        }
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        image_id = hashlib.sha256(config_bytes).hexdigest()
        (folder / f"{image_id}.json").write_bytes(config_bytes)
        manifest = [{"Config": f"{image_id}.json", "RepoTags": [reference], "Layers": ["layer.tar"]}]
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with tarfile.open(folder / "image.tar", "w") as image:
            for name in ("manifest.json", f"{image_id}.json", "layer.tar"):
                image.add(folder / name, arcname=name)
        (folder / "layer.tar").unlink()
        result = subprocess.run(
            [require_cli(), "image", "load", "--quiet", "--input", str(folder / "image.tar")],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise VerlboxError(f"docker load of {reference} failed: {(result.stdout + result.stderr).strip()[-500:]}")
    return f"sha256:{image_id}"


def member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    """An archive's member NAME as a file (KeyError when it is absent or not a file)."""
    handle = archive.extractfile(name)
    if handle is None:
        raise KeyError(name)
    return handle
