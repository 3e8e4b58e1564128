"""Clamp the file times of an image's own layers to SOURCE_DATE_EPOCH, so equal builds give one image ID.

BuildKit's `rewrite-timestamp` does this, but this engine's docker exporter accepts it and ignores
it (checked, docs/benchmarks.md). Inside a RUN, clamping cannot reach what BuildKit does after the command
ends: removing the mount points it made touches /etc, /tmp and /run, and a whiteout is dated when
the file was deleted. So verlbox does it after the build: `docker save`, every tar header of the
layers above the base with a time later than the epoch set to the epoch (file contents untouched,
headers rewritten in place), then `docker load` under a new config whose diff IDs match.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from typing import IO

from verlbox.errors import BuildError
from verlbox.host.clients.engine import docker_output, require_cli

BLOCK = 512
COPY_CHUNK = 1 << 20
_TIME_FIELD = slice(136, 148)
_SIZE_FIELD = slice(124, 136)
_CHECKSUM_FIELD = slice(148, 156)
_PAX_TIMES = (b"mtime", b"atime", b"ctime")


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256, for values too large for octal
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").strip()
    return int(text, 8) if text else 0


def _with_time(header: bytes, value: int) -> bytes:
    header = header[: _TIME_FIELD.start] + f"{value:011o}".encode() + b"\0" + header[_TIME_FIELD.stop :]
    checksum = sum(header[: _CHECKSUM_FIELD.start]) + 8 * 32 + sum(header[_CHECKSUM_FIELD.stop :])
    return header[: _CHECKSUM_FIELD.start] + f"{checksum:06o}".encode() + b"\0 " + header[_CHECKSUM_FIELD.stop :]


def _clamped_pax(records: bytes, epoch: int) -> bytes:
    """PAX records (`LEN key=value\\n`) with any time after the epoch set to it, at the same length.

    A later time has at least the epoch's digits, so the epoch padded with fraction zeros fits its
    place exactly: the layer keeps its size, and can stream from `docker save` into `docker load`.
    """
    out, position = [], 0
    while position < len(records) and records[position : position + 1] != b"\0":
        length = int(records[position : records.index(b" ", position)])
        record = records[position : position + length]
        key, _, value = record[record.index(b" ") + 1 : -1].partition(b"=")
        if key in _PAX_TIMES and float(value) > epoch:
            clamped = str(epoch).encode()
            if len(value) > len(clamped):
                clamped = (clamped + b".").ljust(len(value), b"0")
            record = record[: record.index(b"=") + 1] + clamped + b"\n"
        out.append(record)
        position += length
    return b"".join(out) + records[position:]


def _pax_size(records: bytes) -> int | None:
    """The `size` a PAX header gives its file (a file of 8 GiB or more, whose ustar size field cannot)."""
    for line in records.rstrip(b"\0").split(b"\n"):
        key, _, value = line.partition(b" ")[2].partition(b"=")
        if key == b"size":
            return int(value)
    return None


def clamped_layer(source: IO[bytes], epoch: int) -> Iterator[bytes]:
    """One layer tar with every header time after EPOCH set to it; contents and size unchanged."""
    pax_size: int | None = None  # what the last PAX header says the next file's size is
    while header := source.read(BLOCK):
        if len(header) != BLOCK or header == bytes(BLOCK):  # end of archive: the rest is padding
            yield header + source.read()
            return
        size = _number(header[_SIZE_FIELD])
        kind = header[156:157]
        if kind not in (b"x", b"g") and pax_size is not None:
            size, pax_size = pax_size, None
        data_size = -(-size // BLOCK) * BLOCK
        if _number(header[_TIME_FIELD]) > epoch:
            header = _with_time(header, epoch)
        yield header
        if kind in (b"x", b"g"):
            records = _read(source, data_size)
            if kind == b"x":
                pax_size = _pax_size(records)
            yield _clamped_pax(records, epoch)
            continue
        remaining = data_size
        while remaining:
            chunk = _read(source, min(remaining, COPY_CHUNK))
            yield chunk
            remaining -= len(chunk)


class _HashingReader:
    """A file object over the clamped bytes, for tarfile.addfile, hashing as it is read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buffer, self.offset, self.digest = chunks, b"", 0, hashlib.sha256()

    def read(self, size: int) -> bytes:
        while len(self.buffer) - self.offset < size and (chunk := next(self.chunks, None)) is not None:
            self.buffer = self.buffer[self.offset :] + chunk
            self.offset = 0
        data = self.buffer[self.offset : self.offset + size]
        self.offset += len(data)
        self.digest.update(data)
        return data


def _read(source: IO[bytes], size: int) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise BuildError(f"a layer of the saved image ends early ({len(data)} of {size} bytes)")
    return data


def _inspect(reference: str) -> dict:
    return json.loads(docker_output("image", "inspect", reference))[0]


def clamp_image(image: str, base: str, epoch: int, tag: str) -> str:
    """Load IMAGE's clamped copy as TAG; returns its image ID. The base's own layers are left as they are.

    One pass, with no copy of verlbox's own (this engine's save and load each make one): `docker save`
    streams in, each layer is clamped as it passes, and `docker load` reads the manifest and config
    only after the layers, when their new digests are known.
    """
    inspected = _inspect(image)
    layers: list[str] = inspected["RootFS"]["Layers"]
    base_layers: list[str] = _inspect(base)["RootFS"]["Layers"]
    kept = len(base_layers)
    if layers[:kept] != base_layers:
        raise BuildError(f"{image} does not start with the layers of its base {base}")
    blobs = ["blobs/sha256/" + layer.split(":", 1)[1] for layer in layers]
    config_blob = "blobs/sha256/" + inspected["Id"].split(":", 1)[1]
    docker_cli = require_cli()
    new_ids: dict[str, str] = {}
    config: dict | None = None
    with (
        subprocess.Popen([docker_cli, "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as save,
        subprocess.Popen(
            [docker_cli, "load", "--quiet"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        ) as load,
    ):
        assert save.stdout is not None and load.stdin is not None
        try:
            with (
                tarfile.open(fileobj=save.stdout, mode="r|") as saved,
                tarfile.open(fileobj=load.stdin, mode="w|") as loading,
            ):
                loading.copybufsize = COPY_CHUNK
                for member in saved:
                    source = saved.extractfile(member) if member.isfile() else None
                    if source is None:
                        continue
                    if member.name == config_blob:
                        config = json.load(source)
                    elif member.name in blobs[kept:] and member.name not in new_ids:
                        reader = _HashingReader(clamped_layer(source, epoch))
                        info = tarfile.TarInfo(f"{member.name}.tar")
                        info.size = member.size
                        loading.addfile(info, reader)
                        new_ids[member.name] = "sha256:" + reader.digest.hexdigest()
                if config is None or set(new_ids) != set(blobs[kept:]):
                    raise BuildError(f"docker save {image} did not give the image's config and layers")
                config["rootfs"]["diff_ids"] = layers[:kept] + [new_ids[blob] for blob in blobs[kept:]]
                config_bytes = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
                # the base's layers are in the engine already: `docker load` opens a layer file only for a new chain
                manifest = [{"Config": "config.json", "RepoTags": [tag], "Layers": [f"{blob}.tar" for blob in blobs]}]
                _add_bytes(loading, "config.json", config_bytes)
                _add_bytes(loading, "manifest.json", json.dumps(manifest).encode())
        except (tarfile.TarError, OSError) as exc:
            save.kill()
            load.kill()
            problems = b"".join(p.stderr.read() for p in (save, load) if p.stderr).decode(errors="replace")
            raise BuildError(f"clamping {image} failed ({exc}): {problems.strip()[-1000:]}") from None
        load.stdin.close()
        errors = load.stderr.read().decode(errors="replace") if load.stderr else ""
    if save.returncode != 0 or load.returncode != 0:
        raise BuildError(f"clamping {image}: docker save or load failed: {errors.strip()[-1000:]}")
    return "sha256:" + hashlib.sha256(config_bytes).hexdigest()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, fileobj=io.BytesIO(data))
