"""An image's files read from outside (host/trust/image_files.py): layers in order, whiteouts applied, nothing of
the image run; one line per path that differs from a build's record."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

import tiny_images
from conftest import docker
from verlbox.host.trust.image_files import ImageFiles, apply, file_differences, image_files, read_layer


def _layer(*members: tuple[str, bytes | str | None]) -> io.BytesIO:
    """A layer tar: (path, bytes) a file, (path, None) a folder, (path, "->target") a symlink, (path, "=target")
    a hard link."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(what, str):
                info.type = tarfile.SYMTYPE if what.startswith("->") else tarfile.LNKTYPE
                info.linkname = what[2:] if what.startswith("->") else what[1:]
                tar.addfile(info)
            else:
                info.size, info.mode = len(what), 0o644
                tar.addfile(info, io.BytesIO(what))
    out.seek(0)
    return out


def _file(data: bytes) -> str:
    return f"file 0644 0:0 sha256:{hashlib.sha256(data).hexdigest()}"


def test_whiteouts_opaque_folders_and_hard_links_are_applied_as_the_engine_mounts_them() -> None:
    image = ImageFiles()
    files = image.lines
    apply(image, read_layer(_layer(("opt", None), ("opt/a.py", b"a"), ("opt/b.py", b"b"), ("etc/keep", b"k"))))
    apply(image, read_layer(_layer(("etc", None), ("etc/old", b"o"), ("lib", None), ("lib/x.so", b"x"))))
    upper = _layer(
        ("opt/.wh.a.py", b""),  # a.py removed
        ("lib/.wh..wh..opq", b""),  # lib's earlier contents hidden; what this layer writes there stays
        ("lib/y.so", b"y"),
        ("lib/link", "->y.so"),
        ("opt/hard", "=lib/y.so"),  # a hard link: its target's bytes
    )
    apply(image, read_layer(upper))
    assert files == {
        "opt": "dir 0755 0:0",
        "opt/b.py": _file(b"b"),
        "opt/hard": _file(b"y"),
        "etc": "dir 0755 0:0",
        "etc/keep": _file(b"k"),
        "etc/old": _file(b"o"),
        "lib": "dir 0755 0:0",
        "lib/y.so": _file(b"y"),
        "lib/link": "symlink -> y.so",
    }
    apply(image, read_layer(_layer(("etc", b"now a file"))))  # a folder replaced by a file takes its contents
    assert "etc/keep" not in files and files["etc"] == _file(b"now a file")


def test_each_changed_added_or_removed_file_is_one_line() -> None:
    built = {"opt/venv/x.py": _file(b"x"), "opt/venv/y.pyc": _file(b"y"), "usr/bin/tool": _file(b"t")}
    now = {"opt/venv/x.py": _file(b"edited"), "usr/bin/tool": _file(b"t"), "opt/venv/zz.pth": _file(b"import os")}
    short = {name: hashlib.sha256(data).hexdigest()[:12] for name, data in (("x", b"x"), ("y", b"y"), ("e", b"edited"))}
    pth = hashlib.sha256(b"import os").hexdigest()[:12]
    assert file_differences(built, now) == [
        f"file /opt/venv/x.py: changed since the build (file 0644 0:0 sha256 {short['e']}, "
        f"built file 0644 0:0 sha256 {short['x']})",
        f"file /opt/venv/y.pyc: removed since the build (was file 0644 0:0 sha256 {short['y']})",
        f"file /opt/venv/zz.pth: added since the build (file 0644 0:0 sha256 {pth})",
    ]
    assert file_differences(built, dict(built)) == []


@pytest.mark.docker
def test_an_engine_image_is_read_from_its_saved_layers(tmp_path: Path) -> None:
    """Two layers FROM scratch (nothing in the image could run): the upper one's file wins."""
    folder = tmp_path / "context"
    folder.mkdir()
    (folder / "first").write_bytes(b"first")
    (folder / "second").write_bytes(b"second")
    tag = f"verlbox-test/image-files:{tiny_images.token()}"
    tiny_images.build(folder, "FROM scratch\nCOPY first /opt/x\nCOPY second /opt/x\nCOPY first /opt/y\n", tag)
    try:
        files = image_files(tag).lines
    finally:
        docker("image", "rm", tag, check=False)
    assert files["opt/x"].endswith(hashlib.sha256(b"second").hexdigest())
    assert files["opt/y"].endswith(hashlib.sha256(b"first").hexdigest())
    assert {path for path in files if not files[path].startswith("dir ")} == {"opt/x", "opt/y"}


def test_the_bytes_of_named_files_are_kept_as_the_top_layer_left_them() -> None:
    """What verify reads versions from is the file the lines hash: an upper layer's copy, gone with a whiteout."""
    image = ImageFiles()

    def keep(path: str) -> bool:
        return path.endswith("status")

    apply(image, read_layer(_layer(("a/status", b"old"), ("b/status", b"b"), ("c/status", b"c"), ("d", b"d")), keep))
    apply(image, read_layer(_layer(("a/status", b"new"), ("b/.wh.status", b""), ("c/status", "->d")), keep))
    assert image.kept == {"a/status": b"new"}
    assert image.lines["a/status"] == _file(b"new")


def test_an_extended_attribute_is_part_of_the_line() -> None:
    """A file capability added to a program (setcap) changes what it may do, not its bytes or mode."""
    plain, capable = io.BytesIO(), io.BytesIO()
    for out, headers in ((plain, {}), (capable, {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"})):
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("usr/bin/python3")
            info.size, info.mode, info.pax_headers = 3, 0o755, headers
            tar.addfile(info, io.BytesIO(b"elf"))
        out.seek(0)
    was, now = (read_layer(out).entries["usr/bin/python3"] for out in (plain, capable))
    assert was == f"file 0755 0:0 sha256:{hashlib.sha256(b'elf').hexdigest()}"
    value = hashlib.sha256(b"\x01\x00\x00\x02").hexdigest()[:16]
    short = hashlib.sha256(b"elf").hexdigest()[:12]
    assert now == f"file 0755 0:0 xattr:security.capability={value} sha256:{hashlib.sha256(b'elf').hexdigest()}"
    assert file_differences({"usr/bin/python3": was}, {"usr/bin/python3": now}) == [
        f"file /usr/bin/python3: changed since the build (file 0755 0:0 xattr:security.capability={value} sha256 "
        f"{short}, built file 0755 0:0 sha256 {short})"
    ]
