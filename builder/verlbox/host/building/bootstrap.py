"""A base image made locally with debootstrap, for hosts that reach no registry: settled (what debootstrap
writes from the clock or the host removed) and loaded as verlbox's canonical layer (recipes/basetree.py).

The Debian mirror is the user's: --apt-mirror, else $VERLBOX_APT_MIRROR, else the first Debian
archive in the host's own apt sources. verlbox names no mirror of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from rich.console import Console

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.sources import shown_url
from verlbox.host.clients.engine import image_exists
from verlbox.host.recipes.basetree import NAMES, load_canonical_base
from verlbox.host.recipes.recipe import Bootstrap
from verlbox.runtime.steps.urls import redact

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
_ONE_LINE = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)")


def _source_files(locations: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for location in locations:
        if location.is_dir():
            files += sorted(p for p in location.iterdir() if p.suffix in (".list", ".sources"))
        elif location.is_file():
            files.append(location)
    return files


def mirror_from_apt_sources(locations: Iterable[Path] = APT_SOURCES) -> str | None:
    """The first archive URI of a Debian release suite (not -security, not -updates) in apt's sources."""
    for path in _source_files(locations):
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, flags=re.MULTILINE))
                suites = fields.get("Suites", "").split()
                if fields.get("Enabled", "yes") != "no" and any("-" not in suite for suite in suites):
                    uris = fields.get("URIs", "").split()
                    if uris:
                        return uris[0]
        else:
            for line in text.splitlines():
                if (match := _ONE_LINE.match(line.strip())) and "-" not in match.group(2):
                    return match.group(1)
    return None


def choose_mirror(option: str | None, environ: Mapping[str, str] = os.environ) -> str:
    mirror = option or environ.get("VERLBOX_APT_MIRROR") or mirror_from_apt_sources()
    if not mirror:
        raise UsageError("--bootstrap-base needs a Debian mirror: give --apt-mirror URL or set VERLBOX_APT_MIRROR")
    if not re.fullmatch(r"(https?|file)://\S+", mirror):
        raise UsageError(f"--apt-mirror {shown_url(mirror)!r}: expected an http(s):// or file:// URL")
    return mirror


def without_credentials(mirror: str, home: Path) -> str:
    """MIRROR without its user:password@, which go into HOME/.netrc for debootstrap's wget instead: never
    onto a command line (`ps` shows it) nor into the base's /etc/apt/sources.list (every image's layer)."""
    parts = urlsplit(mirror)
    if parts.username is None:
        return mirror
    netrc = home / ".netrc"
    netrc.touch(mode=0o600)
    netrc.write_text(
        f"machine {parts.hostname} login {unquote(parts.username)} password {unquote(parts.password or '')}\n"
    )
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _scrubbed(text: str, mirror: str) -> str:
    """TEXT with MIRROR's password removed, wherever a tool echoed it."""
    password = urlsplit(mirror).password
    return text.replace(password, "***") if password else text


# what debootstrap writes from the clock or the host, not from the packages: emptied or removed, so the
# same packages give the same files anywhere (the lock pins them: recipes/basetree.py)
_FILES_EMPTIED_UNDER = ("var/log",)  # truncated: packages own some of these files (wtmp, lastlog)
_FILES_REMOVED_UNDER = ("var/lib/apt/lists",)  # apt's lists would be a later layer's whiteout
_FILES_REMOVED = (
    "var/cache/ldconfig/aux-cache",
    "var/cache/apt/pkgcache.bin",
    "var/cache/apt/srcpkgcache.bin",
    # the host's own, copied with the host's mode; Docker and BuildKit mount their own at run and build time
    "etc/hostname",
    "etc/resolv.conf",
)
_SHADOW_FILES = ("etc/shadow", "etc/shadow-")


def settle_rootfs(root: Path) -> None:
    """ROOT (a debootstrapped tree) without the parts that differ by machine or day (file times aside:
    the canonical layer sets them all to zero)."""
    for folder in _FILES_EMPTIED_UNDER:
        for path in (root / folder).rglob("*"):
            if path.is_file() and not path.is_symlink():
                path.write_bytes(b"")
    for folder in _FILES_REMOVED_UNDER:
        for path in (root / folder).rglob("*"):
            if path.is_file() or path.is_symlink():
                path.unlink()
    for name in _FILES_REMOVED:
        (root / name).unlink(missing_ok=True)
    for name in _SHADOW_FILES:
        if (root / name).is_file():
            (root / name).write_text(undated_shadow((root / name).read_text()))


def undated_shadow(text: str) -> str:
    """/etc/shadow with each account's last-change day (field 3, the day debootstrap ran) left empty:
    "password aging off" for accounts whose password is locked anyway."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3:
            fields[2] = ""
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n" if lines else ""


def bootstrapped_reference(bootstrap: Bootstrap) -> str:
    return f"verlbox-base/debian:{bootstrap.suite}-{bootstrap.variant}"


def ensure_bootstrapped_base(engine: Any, bootstrap: Bootstrap, mirror: str, console: Console) -> str:
    reference = bootstrapped_reference(bootstrap)
    if image_exists(engine, reference):
        return reference
    if shutil.which("debootstrap") is None:
        raise VerlboxError("--bootstrap-base needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise VerlboxError("--bootstrap-base runs debootstrap, which needs root")
    with (
        tempfile.TemporaryDirectory(prefix="verlbox-rootfs-") as workdir,
        console.status(f"debootstrap {bootstrap.suite} ({bootstrap.variant}) -> {reference}"),
    ):
        root, archive = Path(workdir) / "root", Path(workdir) / "root.tar"
        bare = without_credentials(mirror, Path(workdir))
        debootstrap = ["debootstrap", f"--variant={bootstrap.variant}", bootstrap.suite, str(root), bare]
        # a file, not a pipe: if a step dies, nothing is left writing into a pipe nobody reads
        archive_it = ["tar", "-C", str(root), "-cf", str(archive), "."]
        for step in (debootstrap, archive_it):
            # debootstrap's wget reads the credentials from $HOME/.netrc
            environment = os.environ | {"HOME": workdir} if step is debootstrap else None
            result = subprocess.run(step, capture_output=True, text=True, check=False, env=environment)
            if result.returncode != 0:
                said = (result.stdout + result.stderr).strip()[-2000:]
                raise VerlboxError(f"{step[0]} failed while making {reference}: {_scrubbed(said, mirror)}")
            if step is debootstrap:
                settle_rootfs(root)
        try:
            with tarfile.open(archive, **NAMES) as layer:
                load_canonical_base(layer, reference, reference)
        except (ValueError, tarfile.TarError) as exc:
            raise VerlboxError(f"debootstrap's tree for {reference} cannot be a base: {exc}") from None
    console.print(f"made base image {reference} with debootstrap from {redact(mirror)}")
    return reference
