"""`build --check`'s cuDNN pin is read as the base's apt reads NVIDIA's repository: its InRelease verified with the
one key the base's cuda-keyring holds (the recipe pins its fingerprint), Packages.gz taken only by the sha256 that
signed InRelease lists. Throwaway keys sign a stand-in repository on 127.0.0.1; the real gpg and gpgv check it.
The helpers here also serve test_pins.py's stand-in NVIDIA repository."""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_verlbox
from standins import serve_files
from verlbox.errors import BAD_INPUT
from verlbox.host.clients.upstream import Http
from verlbox.host.recipes.components.cudnn import NVIDIA_CUDA_KEY
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust import pins

VERSION = "8.9.7.29-1+cuda11.8"
PIN = {"libcudnn8": VERSION, "libcudnn8-dev": VERSION}
PREFIX = "/cuda/ubuntu2204/x86_64"


@dataclass(frozen=True)
class Key:
    fingerprint: str
    public: bytes  # armored, as NVIDIA serves its KEY_ID.pub
    secret: bytes  # armored, no passphrase

    @property
    def file_name(self) -> str:
        return f"{self.fingerprint[-8:].lower()}.pub"


@contextmanager
def gnupg_home() -> Iterator[str]:
    """A GnuPG home of its own, gone afterwards with the gpg-agent that signing started in it."""
    with tempfile.TemporaryDirectory(prefix="vb-gpg-") as home:
        try:
            yield home
        finally:
            subprocess.run(["gpgconf", "--kill", "all"], env=os.environ | {"GNUPGHOME": home}, capture_output=True)


def gpg(home: str, *arguments: str, data: bytes = b"") -> bytes:
    command = ["gpg", "--homedir", home, "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    return subprocess.run([*command, *arguments], input=data, capture_output=True, check=True).stdout


@functools.cache
def throwaway_key(name: str) -> Key:
    """An ed25519 signing key made once per test run for NAME (kept as bytes: no GnuPG home outlives a call)."""
    with gnupg_home() as home:
        gpg(home, "--quick-gen-key", f"verlbox stand-in {name}", "ed25519", "sign", "never")
        listed = gpg(home, "--with-colons", "--list-secret-keys").decode()
        fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:"))
        public = gpg(home, "--armor", "--export", fingerprint)
        return Key(fingerprint, public, gpg(home, "--armor", "--export-secret-keys", fingerprint))


def clearsign(text: str, *signers: Key) -> bytes:
    with gnupg_home() as home:
        users: list[str] = []
        for signer in signers:
            gpg(home, "--import", data=signer.secret)
            users += ["--local-user", signer.fingerprint]
        return gpg(home, *users, "--clearsign", data=text.encode())


def release(packages_gz: bytes) -> str:
    """A Release file listing PACKAGES_GZ as NVIDIA's flat repositories do."""
    digest = hashlib.sha256(packages_gz).hexdigest()
    return f"Origin: NVIDIA\nLabel: stand-in\nArchitecture: x86_64\nSHA256:\n {digest} {len(packages_gz)} Packages.gz\n"


def packages_text(versions: dict[str, str]) -> str:
    stanzas = [f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n" for name, version in versions.items()]
    return "\n".join(stanzas) + "\n"


def signed_repository(prefix: str, packages: str, signer: Key) -> dict[str, bytes]:
    """An NVIDIA-style flat apt repository under PREFIX: Packages.gz (PACKAGES), the InRelease SIGNER clearsigned
    listing its sha256, and SIGNER's public key as NVIDIA serves it (KEY_ID.pub)."""
    packages_gz = gzip.compress(packages.encode(), mtime=0)
    return {
        f"{prefix}/Packages.gz": packages_gz,
        f"{prefix}/InRelease": clearsign(release(packages_gz), signer),
        f"{prefix}/{signer.file_name}": signer.public,
    }


def ask(files: dict[str, bytes], pinned: Key) -> pins.Finding:
    with serve_files(files) as upstream:
        return pins.check_apt_pin(Http(None, 5), f"{upstream}{PREFIX}", PIN, pinned.fingerprint)


@pytest.fixture
def a() -> Key:
    return throwaway_key("A")


@pytest.fixture
def b() -> Key:
    return throwaway_key("B")


@pytest.fixture
def repository(a: Key) -> dict[str, bytes]:
    return signed_repository(PREFIX, packages_text(PIN), a)


def gnupg_processes(folder: Path) -> list[str]:
    """Command lines of running processes that name FOLDER (a gpg-agent left in a GnuPG home there would)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:  # the process ended while being read
            continue
        if str(folder) in text:
            found.append(text)
    return found


def test_a_repository_signed_by_the_pinned_key_is_served_and_leaves_nothing_behind(
    repository: dict[str, bytes], a: Key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the check's temporary GnuPG home goes
    finding = ask(repository, a)
    assert finding.served, finding.answer
    assert finding.answer.endswith(f"signed by its pinned key {a.fingerprint[-8:]}")
    assert list(tmp_path.iterdir()) == [] and gnupg_processes(tmp_path) == []


def test_a_rotated_key_fails_with_the_rotation_line(repository: dict[str, bytes], a: Key, b: Key) -> None:
    """NVIDIA's 2022 rotation, staged: the repository now signed by B, and B's key under the name the pin gives."""
    rotated = signed_repository(PREFIX, packages_text(PIN), b)
    rotated[f"{PREFIX}/{a.file_name}"] = b.public
    finding = ask(rotated, a)
    assert not finding.served
    assert finding.answer.startswith(
        "the repository's key changed (NVIDIA rotated it in 2022): the base's cuda-keyring will not trust it; "
        f"{a.file_name} is {b.fingerprint}, not the pinned {a.fingerprint}"
    ), finding.answer
    del rotated[f"{PREFIX}/{a.file_name}"]  # as NVIDIA did: the old key's file is gone, the new one has its own name
    gone = ask(rotated, a)
    assert not gone.served and gone.answer.startswith(f"its signing key {a.file_name}: HTTP 404"), gone.answer


def test_an_inrelease_signed_by_another_key_fails(repository: dict[str, bytes], a: Key, b: Key) -> None:
    repository[f"{PREFIX}/InRelease"] = signed_repository(PREFIX, packages_text(PIN), b)[f"{PREFIX}/InRelease"]
    finding = ask(repository, a)
    assert not finding.served
    assert finding.answer == (
        f"its InRelease is not signed by the pinned key {a.fingerprint} (it is signed by key {b.fingerprint[-16:]}): "
        "the base's apt would refuse the repository"
    )


def test_a_second_signature_by_a_key_the_base_lacks_does_not_count_against_it(
    repository: dict[str, bytes], a: Key, b: Key
) -> None:
    """As apt: a repository signed by its old and its new key while it changes keys is taken with either."""
    repository[f"{PREFIX}/InRelease"] = clearsign(release(repository[f"{PREFIX}/Packages.gz"]), a, b)
    finding = ask(repository, a)
    assert finding.served, finding.answer


def test_a_packages_gz_changed_after_signing_fails(repository: dict[str, bytes], a: Key) -> None:
    """Still listing the pins: only the sha256 the signed InRelease gives tells it from the signed one."""
    repository[f"{PREFIX}/Packages.gz"] = gzip.compress(packages_text(PIN | {"evil": "1"}).encode(), mtime=0)
    finding = ask(repository, a)
    assert not finding.served
    assert finding.answer.startswith("its Packages.gz is not the one its signed InRelease lists (sha256 "), (
        finding.answer
    )


def test_only_the_signed_part_of_inrelease_counts(repository: dict[str, bytes], a: Key) -> None:
    """A SHA256 section put before the signed block (gpgv ignores it) names another Packages.gz: not taken."""
    forged = gzip.compress(packages_text(PIN | {"evil": "1"}).encode(), mtime=0)
    repository[f"{PREFIX}/InRelease"] = release(forged).encode() + b"\n" + repository[f"{PREFIX}/InRelease"]
    repository[f"{PREFIX}/Packages.gz"] = forged
    finding = ask(repository, a)
    assert not finding.served and "is not the one its signed InRelease lists" in finding.answer, finding.answer


def test_an_inrelease_changed_after_signing_fails(repository: dict[str, bytes], a: Key) -> None:
    signed = repository[f"{PREFIX}/InRelease"]
    repository[f"{PREFIX}/InRelease"] = signed.replace(b"Label: stand-in", b"Label: changed!")
    finding = ask(repository, a)
    assert not finding.served
    assert "not signed by the pinned key" in finding.answer and "changed after signing" in finding.answer


def test_an_unsigned_release_fails(repository: dict[str, bytes], a: Key) -> None:
    unsigned = release(repository[f"{PREFIX}/Packages.gz"]).encode()
    release_only = {path: data for path, data in repository.items() if not path.endswith("/InRelease")}
    release_only[f"{PREFIX}/Release"] = unsigned
    finding = ask(release_only, a)
    assert not finding.served
    assert finding.answer == "its InRelease: HTTP 404 Not Found (the base's apt takes only a signed repository)"
    repository[f"{PREFIX}/InRelease"] = unsigned  # a Release served as InRelease
    finding = ask(repository, a)
    assert not finding.served and finding.answer.startswith(
        f"its InRelease is not signed by the pinned key {a.fingerprint} (it holds no signature)"
    ), finding.answer


def test_a_pin_the_signed_index_does_not_list_fails(a: Key) -> None:
    files = signed_repository(PREFIX, packages_text({"libcudnn8": VERSION, "libcudnn8-dev": "8.9.6.50-1"}), a)
    finding = ask(files, a)
    assert not finding.served and finding.answer == f"not in the repository's index: libcudnn8-dev={VERSION}"


def test_a_key_file_that_is_no_key_fails(repository: dict[str, bytes], a: Key) -> None:
    repository[f"{PREFIX}/{a.file_name}"] = b"<html>moved</html>"
    finding = ask(repository, a)
    assert not finding.served and finding.answer == f"its {a.file_name} holds no OpenPGP public key"


def test_without_gpgv_the_finding_says_what_to_install(
    repository: dict[str, bytes], a: Key, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither gpg nor gpgv on it
    finding = ask(repository, a)
    assert not finding.served
    assert finding.answer == "gpg and gpgv not found: install gnupg and gpgv to check the repository's signature"


def test_p40_pins_nvidia_s_current_key_and_a_short_key_id_is_refused(tmp_path: Path) -> None:
    """The default and p40's pin: NVIDIA's key since its 2022 rotation (3bf863cc); a key id is not a fingerprint."""
    assert load_recipe("p40").cudnn.repository_key == NVIDIA_CUDA_KEY == "EB693B3035CD5710E231E123A4B469963BF863CC"
    path = tmp_path / "short.yaml"
    extends = str(REPO / "recipes" / "p40.yaml")
    path.write_text(yaml.safe_dump({"extends": extends, "cudnn": {"repository_key": "3BF863CC"}}))
    result = run_verlbox("render", str(path), "-o", str(tmp_path / "Dockerfile"))
    assert result.returncode == BAD_INPUT and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"{path}: cudnn.repository_key" in line and "pattern" in line, line
