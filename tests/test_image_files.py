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
from verlbox.host.trust.image_files import apply, file_differences, image_files, read_layer


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
    files: dict[str, str] = {}
    apply(files, read_layer(_layer(("opt", None), ("opt/a.py", b"a"), ("opt/b.py", b"b"), ("etc/keep", b"k"))))
    apply(files, read_layer(_layer(("etc", None), ("etc/old", b"o"), ("lib", None), ("lib/x.so", b"x"))))
    upper = _layer(
        ("opt/.wh.a.py", b""),  # a.py removed
        ("lib/.wh..wh..opq", b""),  # lib's earlier contents hidden; what this layer writes there stays
        ("lib/y.so", b"y"),
        ("lib/link", "->y.so"),
        ("opt/hard", "=lib/y.so"),  # a hard link: its target's bytes
    )
    apply(files, read_layer(upper))
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
    apply(files, read_layer(_layer(("etc", b"now a file"))))  # a folder replaced by a file takes its contents
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
        files = image_files(tag)
    finally:
        docker("image", "rm", tag, check=False)
    assert files["opt/x"].endswith(hashlib.sha256(b"second").hexdigest())
    assert files["opt/y"].endswith(hashlib.sha256(b"first").hexdigest())
    assert {path for path in files if not files[path].startswith("dir ")} == {"opt/x", "opt/y"}
