"""A bootstrapped base's identity and canonical form: the digest of its files, blind to file times and the
mirror's URI only; anything the canonical form cannot say is refused, and the form itself says nothing more."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from verlbox.host.building.bootstrap import settle_rootfs, undated_shadow
from verlbox.host.recipes.basetree import tree_digest, write_canonical_layer

Entry = tuple[str, bytes | str | None]  # (name, bytes: a file / str: a symlink's target / None: a folder)


def layer(
    entries: list[Entry], *, mtime: int = 0, mode: int = 0o644, uid: int = 0, pax: dict[str, str] | None = None
) -> tarfile.TarFile:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.uname, info.pax_headers = mtime, uid, f"user{uid}", pax or {}
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
    ("./etc/apt", None),
    ("./etc/apt/sources.list", b"deb http://mirror.example/debian bookworm main\n"),
    ("./usr", None),
    ("./usr/bin", None),
    ("./usr/bin/python3", b"\x7fELF"),
    ("./bin", "usr/bin"),
]


def digest(entries: list[Entry] = BASE, **options: object) -> str:
    return tree_digest(layer(entries, **options), "base.tar")  # type: ignore[arg-type]


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
        [*BASE, ("./usr/extra.gpg", b"key")],
        BASE[:-1],
    ],
    ids=["a file's bytes", "a link's target", "a suite's components", "one file more", "one entry less"],
)
def test_any_change_to_the_files_counts(changed: list[Entry]) -> None:
    assert digest(changed) != digest()


def test_mode_and_owner_count() -> None:
    assert digest(mode=0o4755) != digest() != digest(uid=1000)


@pytest.mark.parametrize(
    ("changed", "problem"),
    [
        ([*BASE, ("./etc/.wh.passwd", b"")], "whiteout"),
        ([*BASE, ("./etc/a\tfile 00\t644\t0:0\netc/b", b"")], "control character"),
        ([*BASE, ("./usr/bin/../../etc/passwd", b"")], "leaves the layer"),
        ([*BASE, ("./usr/bin/python3", b"again")], "twice"),
        ([*BASE, ("./lib", "usr/lib\nx")], "control character"),
        ([*BASE, ("./bin/sh", b"through the link")], "not inside a folder"),
        ([*BASE, ("./opt/tool", b"no folder for it")], "not inside a folder"),
    ],
    ids=[
        "a whiteout",
        "a name that would forge a record",
        "a path with ..",
        "a path twice",
        "a link with a newline",
        "a file under a link",
        "a file without its folder",
    ],
)
def test_what_the_canonical_form_cannot_say_is_refused(changed: list[Entry], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        digest(changed)


def test_an_extended_attribute_is_refused() -> None:
    """Docker applies a pax SCHILY.xattr (a file capability, say) that no digest of paths and bytes shows."""
    with pytest.raises(ValueError, match=r"SCHILY\.xattr\.security\.capability"):
        digest(pax={"SCHILY.xattr.security.capability": "x"})


def test_the_canonical_layer_is_a_function_of_the_tree(tmp_path: Path) -> None:
    """Other times, owner names and order give the same bytes; what is loaded reads back as the same tree."""
    first, second = tmp_path / "first.tar", tmp_path / "second.tar"
    write_canonical_layer(layer(BASE, mtime=1), "a", first)
    write_canonical_layer(layer(list(reversed(BASE)), mtime=1_800_000_000), "b", second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as canonical:
        assert tree_digest(canonical, "canonical") == digest()
        assert {m.mtime for m in canonical} == {0} and {m.uname for m in canonical} == {""}
        assert all(not m.pax_headers for m in canonical)


def test_a_hard_link_becomes_a_copy_of_its_target(tmp_path: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for folder in ("./usr", "./usr/bin"):
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        target = tarfile.TarInfo("./usr/bin/perl5.36.0")
        target.size = 4
        tar.addfile(target, io.BytesIO(b"perl"))
        link = tarfile.TarInfo("./usr/bin/perl")
        link.type, link.linkname = tarfile.LNKTYPE, "./usr/bin/perl5.36.0"
        tar.addfile(link)
    data.seek(0)
    out = tmp_path / "canonical.tar"
    with tarfile.open(fileobj=data) as source:
        write_canonical_layer(source, "base.tar", out)
    with tarfile.open(out) as canonical:
        perl = canonical.getmember("usr/bin/perl")
        assert perl.isreg() and canonical.extractfile(perl).read() == b"perl"  # type: ignore[union-attr]


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
    assert left == {"etc/shadow", "etc/passwd", "var/log/dpkg.log", "var/log/apt/history.log"}
    assert (root / "var/log/dpkg.log").read_text() == (root / "var/log/apt/history.log").read_text() == ""
    assert (root / "etc/shadow").read_text() == "root:*::0:99999:7:::\ndaemon:*::0:99999:7:::\n"
    assert (root / "etc/passwd").read_text() == files["etc/passwd"]


def test_an_empty_shadow_stays_empty() -> None:
    assert undated_shadow("") == ""
