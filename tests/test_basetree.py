"""A bootstrapped base's identity: the digest of its files, blind to file times and the mirror's URI only."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from verlbox.host.building.bootstrap import settle_rootfs, undated_shadow
from verlbox.host.recipes.basetree import layer_tree_digest

Entry = tuple[str, bytes | str | None]  # (name, bytes: a file / str: a symlink's target / None: a folder)


def layer(entries: list[Entry], *, mtime: int = 0, mode: int = 0o644, uid: int = 0) -> tarfile.TarFile:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid = mtime, uid
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
    data.seek(0)
    return tarfile.open(fileobj=data)


BASE: list[Entry] = [
    ("./etc", None),
    ("./etc/apt/sources.list", b"deb http://mirror.example/debian bookworm main\n"),
    ("./usr/bin/python3", b"\x7fELF"),
    ("./bin", "usr/bin"),
]


def digest(entries: list[Entry] = BASE, **options: int) -> str:
    return layer_tree_digest(layer(entries, **options))


def replaced(name: str, content: bytes | str | None) -> list[Entry]:
    return [(entry, content if entry == name else old) for entry, old in BASE]


def test_file_times_order_and_the_mirror_uri_do_not_count() -> None:
    assert digest(mtime=1) == digest(mtime=1_800_000_000) == digest(list(reversed(BASE)))
    other_mirror = replaced("./etc/apt/sources.list", b"deb https://other.example/debian/ bookworm main\n")
    assert digest(other_mirror) == digest()


@pytest.mark.parametrize(
    "changed",
    [
        replaced("./usr/bin/python3", b"\x7fELF, an attacker's"),
        replaced("./bin", "tmp"),
        replaced("./etc/apt/sources.list", b"deb http://mirror.example/debian bookworm main contrib\n"),
        [*BASE, ("./usr/share/keyrings/extra.gpg", b"key")],
        BASE[:-1],
    ],
    ids=["a file's bytes", "a link's target", "a suite's components", "one file more", "one entry less"],
)
def test_any_change_to_the_files_counts(changed: list[Entry]) -> None:
    assert digest(changed) != digest()


def test_mode_and_owner_count() -> None:
    assert digest(mode=0o4755) != digest() != digest(uid=1000)


def test_a_whiteout_is_refused() -> None:
    with pytest.raises(ValueError, match="whiteout"):
        digest([*BASE, ("./etc/.wh.passwd", b"")])


def test_settling_removes_what_the_clock_and_the_host_wrote(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = {
        "var/log/dpkg.log": "2026-12-03 10:29:00 install",
        "var/log/apt/history.log": "Start-Date: 2026-12-03",
        "var/lib/apt/lists/index_Packages": "Package: x",
        "var/cache/ldconfig/aux-cache": "inodes",
        "etc/hostname": "builder-7\n",
        "etc/resolv.conf": "nameserver 10.0.0.1\n",
        "etc/shadow": "root:*:20790:0:99999:7:::\ndaemon:*:20790:0:99999:7:::\n",
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    settle_rootfs(root)
    left = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert left == {"etc/hostname", "etc/resolv.conf", "etc/shadow", "etc/passwd"}
    assert (root / "var/log/apt").is_dir()  # folders stay: packages own them
    assert (root / "etc/hostname").read_text() == (root / "etc/resolv.conf").read_text() == ""
    assert (root / "etc/shadow").read_text() == "root:*::0:99999:7:::\ndaemon:*::0:99999:7:::\n"
    assert (root / "etc/passwd").read_text() == files["etc/passwd"]


def test_an_empty_shadow_stays_empty() -> None:
    assert undated_shadow("") == ""
