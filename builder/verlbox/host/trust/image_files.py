"""An image's files read from outside, with nothing of the image run: `docker image save` streamed, each layer's
tar read by this verlbox's Python and its whiteouts applied in layer order, as the engine would mount them.

Each path (relative to /) maps to one line that says what a file can do when it runs or is read: its kind, mode,
owner and extended attributes, and the sha256 of a file's bytes, a link's target or a device's numbers. File times
are left out: an online build dates every file it writes, and a time changes nothing a file does. A hard link is
its target's line (the same bytes). Two images whose lines are equal hold the same files, whatever their layers.
The bytes of a few small files a caller names (KEEP) are kept too: what verify reads versions from (dpkg's status,
each distribution's METADATA), taken from the same stream as their lines, so that what is read is what is hashed.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import subprocess
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

from verlbox.errors import VerlboxError
from verlbox.host.clients.engine import require_cli

# a member of `docker image save` this small is kept in memory until manifest.json says what it is (a config,
# an index, or a layer of a few files); a larger one is a layer, read as it streams by
SMALL = 1 << 20
CHUNK = 1 << 20
NAMES = {"encoding": "utf-8", "errors": "surrogateescape"}
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
XATTR = "SCHILY.xattr."  # how a pax header carries an extended attribute (Docker's layers use it)
STEP_WIDTH = 100  # a layer's step as a message shows it


@dataclass
class Layer:
    """What one layer does to the layers below it: paths it removes (with all under them), folders whose earlier
    contents it hides (opaque), and the entries it writes."""

    removed: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    entries: dict[str, str] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)  # the bytes of the files KEEP named


@dataclass
class ImageFiles:
    """Every path's line, and the bytes of the files KEEP named (as the top layer holding each left it)."""

    lines: dict[str, str] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)  # what made each layer, lowest first (the config's history)


def _keep_nothing(path: str) -> bool:
    return False


def _path(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


def _xattrs(member: tarfile.TarInfo) -> str:
    """MEMBER's extended attributes, each by name and the sha256 of its value: a file capability
    (security.capability) gives a program privileges its mode does not show."""
    found = sorted(
        (key[len(XATTR) :], hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16])
        for key, value in member.pax_headers.items()
        if key.startswith(XATTR)
    )
    return "".join(f" xattr:{name}={digest}" for name, digest in found)


def _line(member: tarfile.TarInfo, stream: IO[bytes] | None, kept: list[bytes] | None = None) -> str:
    """MEMBER's line; a file's bytes are appended to KEPT where it is given."""
    owner = f"{member.mode & 0o7777:04o} {member.uid}:{member.gid}{_xattrs(member)}"
    if member.isreg():
        assert stream is not None
        digest = hashlib.sha256()
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            if kept is not None:
                kept.append(chunk)
        return f"file {owner} sha256:{digest.hexdigest()}"
    if member.isdir():
        return f"dir {owner}"
    if member.issym():
        return f"symlink{_xattrs(member)} -> {member.linkname}"
    if member.ischr() or member.isblk():
        return f"{'char' if member.ischr() else 'block'} {owner} {member.devmajor},{member.devminor}"
    return f"fifo {owner}"


def read_layer(stream: IO[bytes], keep: Callable[[str], bool] = _keep_nothing) -> Layer:
    """One layer's tar, read once from STREAM (it may be a pipe); the bytes of each file KEEP names kept."""
    layer = Layer()
    with tarfile.open(fileobj=stream, mode="r|", **NAMES) as tar:  # type: ignore[call-overload]
        for member in tar:
            path = _path(member.name)
            folder, base = posixpath.split(path)
            if base == OPAQUE:
                layer.opaque.append(folder)
            elif base.startswith(WHITEOUT):
                layer.removed.append(posixpath.join(folder, base[len(WHITEOUT) :]))
            elif member.islnk():  # a hard link names an earlier member of the same layer: the same bytes
                target = layer.entries.get(_path(member.linkname))
                if target is None:
                    raise ValueError(f"{path}: a hard link to {member.linkname}, which the layer does not hold")
                layer.entries[path] = target
                if _path(member.linkname) in layer.kept:
                    layer.kept[path] = layer.kept[_path(member.linkname)]
            elif path:
                chunks: list[bytes] | None = [] if member.isreg() and keep(path) else None
                layer.entries[path] = _line(member, tar.extractfile(member) if member.isreg() else None, chunks)
                if chunks is not None:
                    layer.kept[path] = b"".join(chunks)
    return layer


def _remove_under(files: ImageFiles, folder: str, itself: bool) -> None:
    prefix = folder + "/" if folder else ""
    for path in [path for path in files.lines if path.startswith(prefix) or (itself and path == folder)]:
        del files.lines[path]
        files.kept.pop(path, None)


def apply(files: ImageFiles, layer: Layer) -> None:
    """LAYER mounted over FILES (the layers below it), in place."""
    for folder in layer.opaque:
        _remove_under(files, folder, itself=False)
    for path in layer.removed:
        _remove_under(files, path, itself=True)
    for path, line in layer.entries.items():
        if not line.startswith("dir ") and files.lines.get(path, "").startswith("dir "):
            _remove_under(files, path, itself=False)  # a folder replaced by a file or link takes its contents
        files.lines[path] = line
        if path in layer.kept:
            files.kept[path] = layer.kept[path]
        else:  # a kept file replaced by one of another kind
            files.kept.pop(path, None)


def read_saved(stream: IO[bytes], keep: Callable[[str], bool] = _keep_nothing) -> tuple[list[str], ImageFiles]:
    """(the layers in order, by their name in the archive; every path's line and the bytes KEEP names) of the one
    image in a `docker image save` archive read once from STREAM."""
    layers: dict[str, Layer] = {}
    small: dict[str, bytes] = {}
    with tarfile.open(fileobj=stream, mode="r|", **NAMES) as outer:  # type: ignore[call-overload]
        for member in outer:
            handle = outer.extractfile(member) if member.isreg() else None
            if handle is None:
                continue
            if member.size <= SMALL:
                small[member.name] = handle.read()
            else:
                layers[member.name] = read_layer(handle, keep)
    images = json.loads(small["manifest.json"])
    if len(images) != 1:
        raise ValueError(f"the archive holds {len(images)} images, not one")
    names: list[str] = images[0]["Layers"]
    config = small.get(images[0]["Config"])  # a config over SMALL is no reason to refuse the image: no steps
    files = ImageFiles(steps=layer_steps(json.loads(config) if config else {}, len(names)))
    for name in names:
        apply(files, layers[name] if name in layers else read_layer(io.BytesIO(small[name]), keep))
    return names, files


def layer_steps(config: object, layers: int) -> list[str]:
    """What made each of an image's LAYERS, from its CONFIG's history (entries that made no layer left out), as a
    reader knows it: `RUN steps.sh pip torch ...` without BuildKit's build arguments, shell or comment."""
    history = config.get("history") if isinstance(config, dict) else None
    entries = history if isinstance(history, list) and all(isinstance(entry, dict) for entry in history) else []
    made = [entry for entry in entries if not entry.get("empty_layer")]
    if len(made) != layers:  # an image whose history does not say: its layers go by number alone
        return [""] * layers
    return [_short_step(str(entry.get("created_by", ""))) for entry in made]


def _short_step(created_by: str) -> str:
    step = re.sub(r"^RUN \|\d+ (\S+=\S* )*", "RUN ", created_by)
    step = step.replace("/bin/bash -o pipefail -c ", "").replace("/bin/sh -c ", "").removesuffix(" # buildkit")
    step = " ".join(step.split())
    return step if len(step) <= STEP_WIDTH else step[: STEP_WIDTH - 3] + "..."


def image_files(reference: str, keep: Callable[[str], bool] = _keep_nothing) -> ImageFiles:
    """Every path of the engine's image REFERENCE with its line, and the bytes of the files KEEP names, read from
    `docker image save` as it streams."""
    with subprocess.Popen(
        [require_cli(), "image", "save", reference], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as saving:
        assert saving.stdout is not None and saving.stderr is not None
        try:
            _, files = read_saved(saving.stdout, keep)
        except (ValueError, KeyError, tarfile.TarError) as exc:
            saving.kill()
            problem: str | None = f"{reference}: its saved layers cannot be read ({exc})"
        else:
            problem = None
            while saving.stdout.read(CHUNK):  # the archive's end padding: docker fails on a pipe closed early
                pass
        error = saving.stderr.read().decode(errors="replace").strip()
    if saving.returncode != 0:
        raise VerlboxError(f"docker image save {reference} failed: {error[-500:]}")
    if problem:
        raise VerlboxError(problem)
    return files


def file_differences(built: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """One line per path whose line differs between BUILT (the record of the build) and NOW (the image)."""
    found = []
    for path in sorted(built.keys() | now.keys()):
        was, has = built.get(path), now.get(path)
        if was == has:
            continue
        if has is None:
            found.append(f"file /{path}: removed since the build (was {_short(was)})")
        elif was is None:
            found.append(f"file /{path}: added since the build ({_short(has)})")
        else:
            found.append(f"file /{path}: changed since the build ({_short(has)}, built {_short(was)})")
    return found


def _short(line: str | None) -> str:
    """A line as a message shows it: a sha256 cut to 12 hex digits."""
    assert line is not None
    kind, _, rest = line.partition(" ")
    head, _, digest = rest.rpartition(" sha256:")
    return f"{kind} {head} sha256 {digest[:12]}" if digest else line
