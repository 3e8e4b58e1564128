"""A bootstrapped base's identity: one sha256 over its files (path, kind, mode, owner, and the bytes of
each file or the target of each link), read from the base's `docker save` archive.

debootstrap gives the same files on any machine and any day for the same packages once bootstrap.py has
settled the few it writes from the clock or the host (logs, caches, /etc/hostname, /etc/resolv.conf,
the shadow file's change dates); file times are left out. One part is the bootstrapping user's own and
is left out too: the mirror's URI in apt's sources (its suites, components and options count). The image
ID cannot be the identity: `docker import` dates the image, and the URI is in a file.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

from verlbox.errors import UsageError
from verlbox.host.clients.engine import docker_output
from verlbox.runtime.steps.build_steps import mirrored

# apt's sources as the tree digest reads them: any mirror URI stands as this word
ANY_MIRROR = "MIRROR"
_APT_SOURCES = PurePosixPath("etc/apt")


def _apt_sources_kind(path: PurePosixPath) -> bool | None:
    """deb822 (True), one-line (False), or None when PATH is not one of apt's sources files."""
    if path == _APT_SOURCES / "sources.list":
        return False
    if path.parent == _APT_SOURCES / "sources.list.d" and path.suffix in (".list", ".sources"):
        return path.suffix == ".sources"
    return None


def _content_digest(path: PurePosixPath, handle: IO[bytes]) -> str:
    data = handle.read()
    if (deb822 := _apt_sources_kind(path)) is not None:
        data = mirrored(data.decode(errors="replace"), ANY_MIRROR, deb822).encode()
    return hashlib.sha256(data).hexdigest()


def layer_tree_digest(layer: tarfile.TarFile) -> str:
    """The digest of one filesystem layer's files, in path order (a whiteout is refused: one layer only)."""
    lines = []
    for member in layer.getmembers():
        path = PurePosixPath(member.name.removeprefix("./"))
        if path.name.startswith(".wh."):
            raise ValueError(f"{path}: a whiteout; a bootstrapped base is one layer")
        if member.isfile():
            handle = layer.extractfile(member)
            assert handle is not None
            what = f"file {_content_digest(path, handle)}"
        elif member.isdir():
            what = "dir"
        elif member.issym():
            what = f"symlink {member.linkname}"
        elif member.islnk():
            what = f"hardlink {member.linkname.removeprefix('./')}"
        else:
            what = f"device {member.type!r} {member.devmajor}:{member.devminor}"
        lines.append(f"{path}\t{what}\t{member.mode:o}\t{member.uid}:{member.gid}")
    lines.sort()
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


def saved_tree_digest(archive: tarfile.TarFile) -> str:
    """The tree digest of the one image in a `docker save` archive, whose one layer is the base."""
    images = json.load(member(archive, "manifest.json"))
    if len(images) != 1 or len(images[0]["Layers"]) != 1:
        raise ValueError("a bootstrapped base is one image of one layer")
    with tarfile.open(fileobj=member(archive, images[0]["Layers"][0])) as layer:
        return layer_tree_digest(layer)


def image_tree_digest(reference: str) -> str:
    """The tree digest of the base REFERENCE on this engine (saved to a scratch file, then read)."""
    with tempfile.TemporaryDirectory(prefix="verlbox-base-") as scratch:
        saved = Path(scratch) / "base.tar"
        docker_output("image", "save", "--output", str(saved), reference)
        with tarfile.open(saved) as archive:
            return saved_tree_digest(archive)


def require_locked_tree(reference: str, locked: str | None, lock_path: Path | None) -> None:
    """The engine's base REFERENCE has the files the lock pins (nothing to hold it to without a pin)."""
    if locked is None:
        return
    found = image_tree_digest(reference)
    if found != locked:
        raise UsageError(
            f"{reference}: its files (tree sha256 {found[:16]}...) are not the base {lock_path} pins "
            f"(base.tree {locked[:16]}...): remove it (docker image rm {reference}) and the build bootstraps "
            "the lock's base again; if that differs too, the mirror no longer serves the lock's packages"
        )


def member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    """An archive's member NAME as a file (KeyError when it is absent or not a file)."""
    handle = archive.extractfile(name)
    if handle is None:
        raise KeyError(name)
    return handle
