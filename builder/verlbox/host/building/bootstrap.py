"""A base image made locally with debootstrap, for hosts that reach no registry: settled (what debootstrap
writes from the clock or the host removed) and loaded as verlbox's canonical layer (recipes/basetree.py).

The Debian mirror is the user's: --apt-mirror, else $VERLBOX_APT_MIRROR, else the first Debian
archive in the host's own apt sources. verlbox names no mirror of its own, and trusts none: debootstrap
checks the mirror's Release file against the host's Debian archive keyring and refuses what it cannot check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.building.sources import shown_url
from verlbox.host.clients.engine import image_exists
from verlbox.host.recipes.basetree import NAMES, load_canonical_base
from verlbox.host.recipes.recipe import Bootstrap
from verlbox.runtime.steps.urls import login, redact, split_userinfo

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# given to debootstrap with --force-check-gpg: without a keyring of its own, debootstrap only warns that it
# cannot check the Release file's signature and goes on to install whatever the mirror serves
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
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
    try:
        userinfo = split_userinfo(mirror)[1]
    except ValueError as error:  # its message names no part of the URL
        raise UsageError(f"--apt-mirror {shown_url(mirror)!r}: {error}") from None
    if userinfo is not None:
        user, password = login(userinfo)
        if not user or re.search(r"\s", user + password):  # .netrc's fields are words: anything else shifts them
            raise UsageError(
                f"--apt-mirror {shown_url(mirror)!r}: debootstrap's wget reads the login from .netrc, which needs "
                "a user and no whitespace in the user or password"
            )
    return mirror


def without_credentials(mirror: str, home: Path) -> str:
    """MIRROR without its user:password@ (urls.py's rule), which go into HOME/.netrc for debootstrap's wget
    instead: never onto a command line (`ps` shows it) nor into the base's /etc/apt/sources.list (every
    image's layer)."""
    bare, userinfo = split_userinfo(mirror)
    if userinfo is None:
        return mirror
    user, password = login(userinfo)  # words, as choose_mirror checked
    netrc = home / ".netrc"
    netrc.touch(mode=0o600)
    # wget matches a .netrc machine by host name alone, port aside
    netrc.write_text(f"machine {urlsplit(bare).hostname} login {user} password {password}\n")
    return bare


def _scrubbed(text: str, mirror: str) -> str:
    """TEXT without MIRROR's password, as written in the URL or percent-decoded, wherever a tool echoed it."""
    userinfo = split_userinfo(mirror)[1]
    if userinfo is None:
        return text
    for secret in sorted({userinfo.partition(":")[2], login(userinfo)[1]} - {""}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


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


def _run(step: list[str], reference: str, mirror: str, environment: Mapping[str, str] | None) -> str:
    """STEP's output; VerlboxError with its last lines when it fails. Scrubbed whole before it is cut, so no
    piece of a password is left at the cut."""
    result = subprocess.run(step, capture_output=True, text=True, check=False, env=environment)
    said = _scrubbed(result.stdout + result.stderr, mirror)
    if result.returncode != 0:
        raise VerlboxError(f"{step[0]} failed while making {reference}: {said.strip()[-2000:]}")
    return said


def ensure_bootstrapped_base(engine: Any, bootstrap: Bootstrap, mirror: str, console: Console) -> str:
    reference = bootstrap.reference
    if image_exists(engine, reference):
        return reference
    if shutil.which("debootstrap") is None:
        raise VerlboxError("--bootstrap-base needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise VerlboxError("--bootstrap-base runs debootstrap, which needs root")
    if not DEBIAN_KEYRING.is_file() or DEBIAN_KEYRING.stat().st_size == 0:
        raise VerlboxError(
            f"--bootstrap-base checks the mirror's signatures against {DEBIAN_KEYRING}, which this host lacks "
            "(apt-get install debian-archive-keyring)"
        )
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="verlbox-rootfs-") as workdir,
        console.status(f"debootstrap {bootstrap.suite} ({bootstrap.variant}) -> {reference}"),
    ):
        root, archive = Path(workdir) / "root", Path(workdir) / "root.tar"
        bare = without_credentials(mirror, Path(workdir))
        debootstrap = ["debootstrap", f"--variant={bootstrap.variant}", f"--keyring={DEBIAN_KEYRING}"]
        debootstrap += ["--force-check-gpg", bootstrap.suite, str(root), bare]
        # debootstrap's wget reads the credentials from $HOME/.netrc
        said = _run(debootstrap, reference, mirror, os.environ | {"HOME": workdir})
        warnings = [line for line in said.splitlines() if line.startswith("W:")]
        settle_rootfs(root)
        # a file, not a pipe: if a step dies, nothing is left writing into a pipe nobody reads
        _run(["tar", "-C", str(root), "-cf", str(archive), "."], reference, mirror, None)
        try:
            with tarfile.open(archive, **NAMES) as layer:
                load_canonical_base(layer, reference, reference)
        except (ValueError, tarfile.TarError) as exc:
            raise VerlboxError(f"debootstrap's tree for {reference} cannot be a base: {exc}") from None
    for warning in warnings:  # what debootstrap let pass is the user's to judge (an unchecked suite, a key)
        console.print(f"debootstrap {warning}", markup=False, highlight=False)
    took = time.monotonic() - started
    console.print(f"made base image {reference} with debootstrap from {redact(mirror)} in {took:.0f} s")
    return reference
