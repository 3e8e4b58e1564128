"""A planted token in every secret a build takes (the apt mirror's and pip index's userinfo, the CA bundle)
is found nowhere afterwards: not in any layer, the image's config and history, its labels, its build
records, what the build printed, nor what `verlbox bundle`'s Debian stage writes. The lock is made from
the records (and a pip report's URLs keep no token: tested below).

Secrets are not part of BuildKit's cache keys, so a warm cache would run no step and the check would
prove nothing: the system stage (apt, venv, torch: every kind of installing step) and the bundle's Debian
stage are run again without their cache, and their cache records are dropped after. Each test also shows
that the planted sources were used (apt's fetches name the planted mirror).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import secrets
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import pytest
from pip._internal.models.index import PyPI
from rich.console import Console

from conftest import HOST_CA_BUNDLE, build_cache_ids, docker, prune_build_cache_since
from verlbox.host.building import build
from verlbox.host.building.bootstrap import mirror_from_apt_sources
from verlbox.host.building.build import run_buildx
from verlbox.host.building.context import write_context
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.sources import BuildSources
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.steps.build_record import pip_record

TOKEN = f"planted{secrets.token_hex(12)}"
TAG = f"verlbox-test/planted-token:{TOKEN[-8:]}"


def planted(url: str, user: str) -> str:
    """URL with TOKEN as its password and its port written out: the same server, but a name no other source
    uses, so that the build's output shows which steps fetched through it."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}[parts.scheme]
    return urlunsplit(parts._replace(netloc=f"{user}:{TOKEN}@{parts.hostname}:{port}"))


COPY_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"


class _Scanned:
    """A file object over HEAD (bytes read ahead) and then SOURCE's bytes, noting whether NEEDLE went by,
    across reads too: every byte read through it is searched once."""

    def __init__(self, head: bytes, source: IO[bytes], needle: bytes) -> None:
        self.head, self.source, self.needle = head, source, needle
        self.tail, self.holds = b"", False

    def read(self, size: int = -1) -> bytes:
        taken = self.head[:size] if size >= 0 else self.head
        self.head = self.head[len(taken) :]
        rest = size - len(taken) if size >= 0 else -1
        data = taken + (self.source.read(rest) if rest else b"")
        keep = len(self.needle) - 1  # what a needle split across two reads has in the first
        self.holds = self.holds or self.needle in self.tail + data[:keep] or self.needle in data
        self.tail = data[-keep:] if len(data) >= keep else (self.tail + data)[-keep:]
        return data

    def drain(self) -> bool:
        while self.read(COPY_CHUNK):
            pass
        return self.holds


def places_holding(image_tar: IO[bytes], needle: bytes) -> tuple[list[str], int]:
    """Where NEEDLE is in `docker save`'s archive, read as it streams (an image is gigabytes): a blob (the
    config, the manifest, a layer's tar, gzipped or not) and within a layer each file by its path; and how many
    layers were read as tars, so that a format this cannot open fails the test instead of passing it."""
    found: list[str] = []
    layers = 0
    with tarfile.open(fileobj=image_tar, mode="r|") as outer:
        for member in outer:
            data = outer.extractfile(member) if member.isfile() else None
            if data is None:
                continue
            blob = _Scanned(head := data.read(tarfile.BLOCKSIZE), data, needle)
            unpacked = blob
            if head[:2] == GZIP_MAGIC:  # the containerd image store saves layers compressed
                stream = gzip.GzipFile(fileobj=blob)
                unpacked = _Scanned(head := stream.read(tarfile.BLOCKSIZE), stream, needle)  # type: ignore[arg-type]
            if head[257:262] == b"ustar":
                layers += 1
                with tarfile.open(fileobj=unpacked, mode="r|") as layer:
                    for inner in layer:
                        handle = layer.extractfile(inner) if inner.isfile() else None
                        if handle is not None and _Scanned(b"", handle, needle).drain():
                            found.append(f"{member.name}:{inner.name}")
            if unpacked.drain() or blob.drain():
                found.append(member.name)
    return sorted(found), layers


def test_the_scan_finds_the_needle_wherever_a_layer_holds_it() -> None:
    """places_holding on small archives: split across reads, in a long name (a PAX header), in a link's
    target, inside a gzipped layer; a clean archive holds nothing, and each layer is counted."""

    def tar(entries: list[tarfile.TarInfo | tuple[str, bytes]], compress: bool = False) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz" if compress else "w", format=tarfile.PAX_FORMAT) as archive:
            for entry in entries:
                if isinstance(entry, tarfile.TarInfo):
                    archive.addfile(entry)
                else:
                    info = tarfile.TarInfo(entry[0])
                    info.size = len(entry[1])
                    archive.addfile(info, io.BytesIO(entry[1]))
        return out.getvalue()

    needle = b"planted0123456789"
    link = tarfile.TarInfo("etc/link")
    link.type, link.linkname = tarfile.SYMTYPE, f"/run/{needle.decode()}"
    layers = {
        "blobs/sha256/split": tar([("big", b"x" * (COPY_CHUNK - 5) + needle)]),
        "blobs/sha256/name": tar([(f"{'d/' * 60}{needle.decode()}", b"")]),
        "blobs/sha256/link": tar([link]),
        "blobs/sha256/gzip": tar([("etc/conf", b"token=" + needle)], compress=True),
        "blobs/sha256/clean": tar([("etc/a", b"a" * 3000)]),
    }
    image = tar([*layers.items(), ("blobs/sha256/config", b'{"env": "' + needle + b'"}')])
    found, opened = places_holding(io.BytesIO(image), needle)
    assert opened == len(layers)
    holding = ["split", "split:big", "name", "link", "gzip", "gzip:etc/conf", "config"]
    assert found == sorted(f"blobs/sha256/{place}" for place in holding)
    assert places_holding(io.BytesIO(image), b"nowhere0123456789") == ([], len(layers))


@pytest.fixture(scope="module")
def planted_sources(tmp_path_factory: pytest.TempPathFactory) -> BuildSources:
    """Every secret a build takes, each carrying TOKEN: the CA bundle (a comment), the pip index's and
    the apt mirror's passwords (the same servers the build uses anyway)."""
    mirror = mirror_from_apt_sources()
    if mirror is None:
        pytest.fail("the host's apt sources name no Debian archive: the planted mirror is made from it")
    ca_bundle = tmp_path_factory.mktemp("planted") / "ca.pem"
    ca_bundle.write_bytes((HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b"") + f"# {TOKEN}\n".encode())
    return BuildSources(
        ca_bundle=ca_bundle,
        pip_index_url=planted(PyPI.simple_url, "__token__"),
        apt_mirror=planted(mirror, "verlbox"),
    )


@pytest.fixture(scope="module")
def planted_plan(image: str) -> BuildPlan:
    base = docker("inspect", "--format", '{{index .Config.Labels "io.verlbox.base"}}', image).stdout.strip()
    return BuildPlan(load_recipe("p40-cu124"), base_override=base)


@pytest.fixture(scope="module")
def planted_build(
    docker_engine: object, planted_sources: BuildSources, planted_plan: BuildPlan
) -> Iterator[tuple[str, str]]:
    """The system stage of p40-cu124 built with no cache, every secret carrying TOKEN; (console output, tag).
    Its locked files' cache is a new one (as on a new builder), so every locked file is fetched through the
    planted index, not taken from what the session's image build fetched."""
    kept = build_cache_ids(docker_engine)
    said = io.StringIO()

    def context_with_a_new_file_cache(plan: BuildPlan, directory: Path, *args: object) -> Path:
        written = write_context(plan, directory, *args)  # type: ignore[arg-type]
        dockerfile = directory / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text().replace("id=verlbox-locked-files,", f"id=planted-{cache},"))
        return written

    cache = secrets.token_hex(6)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(build, "write_context", context_with_a_new_file_cache)
            run_buildx(
                planted_plan,
                ["--load", "--target", "system", "--tag", TAG, "--no-cache"],
                sources=planted_sources,
                progress="plain",
                console=Console(file=said, width=250),
                what="building",
            )
        yield said.getvalue(), TAG
    finally:
        docker("rmi", "--force", TAG, check=False)
        prune_build_cache_since(docker_engine, kept)


@pytest.fixture(scope="module")
def planted_bundle_debs(
    docker_engine: object,
    planted_sources: BuildSources,
    planted_plan: BuildPlan,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path]]:
    """`verlbox bundle`'s Debian stage run again (no cache) with the planted secrets, its /bundle exported:
    apt and its helper fetch through the planted mirror, the login from the step's auth.conf. (Output, folder.)"""
    kept = build_cache_ids(docker_engine)
    out = tmp_path_factory.mktemp("planted-debs")
    with tempfile.TemporaryDirectory(prefix="verlbox-context-") as context:
        write_context(planted_plan, Path(context), planted_sources)
        dockerfile = Path(context) / "Dockerfile"
        dockerfile.write_text(
            dockerfile.read_text() + "\nFROM scratch AS planted\nCOPY --from=bundle-debian /bundle/ /\n"
        )
        arguments, environment = planted_sources.secret_arguments()
        command = ["docker", "buildx", "build", "--progress", "plain", "--file", str(dockerfile), "--target", "planted"]
        command += ["--no-cache-filter", "bundle-debian", "--output", f"type=local,dest={out}", *arguments, context]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, env=os.environ | environment, timeout=900, check=False
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            yield result.stdout + result.stderr, out
        finally:
            prune_build_cache_since(docker_engine, kept)


def test_the_planted_build_ran_its_steps_through_the_planted_sources(planted_build: tuple[str, str]) -> None:
    """Else the token's absence proves nothing: every step ran (no cache), apt fetched through the planted
    mirror (its port written out: no other source names it so), and torch's locked files were fetched
    through the planted index (the build's locked files' cache is a new one)."""
    output, _ = planted_build
    runs = re.findall(r"^#(\d+) \[system \d+/\d+\] RUN ", output, re.MULTILINE)
    assert len(runs) >= 3 and all(f"\n#{step} DONE " in output for step in runs), output[-3000:]
    mirror = urlsplit(mirror_from_apt_sources() or "")
    planted_mirror = f"{mirror.hostname}:{mirror.port or {'http': 80, 'https': 443}[mirror.scheme]}"
    fetched = re.findall(r"Get:\d+ https?://(\S+?)/", output)
    assert fetched and set(fetched) == {planted_mirror}, sorted(set(fetched))
    files = [int(count) for count in re.findall(r"locked files \(\d+ MiB\) by sha256: (\d+) fetched, 0 kept", output)]
    assert files and max(files) >= 20, output[-3000:]  # torch's step: torch and its nvidia-* wheels


def test_the_token_is_in_no_layer_config_or_history(planted_build: tuple[str, str]) -> None:
    _, tag = planted_build
    with subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE) as saved:
        assert saved.stdout is not None
        holding, layers = places_holding(saved.stdout, TOKEN.encode())
    assert saved.returncode == 0
    assert holding == []
    diff_ids = json.loads(docker("image", "inspect", tag).stdout)[0]["RootFS"]["Layers"]
    assert layers == len(set(diff_ids)), "not every layer of docker save's archive was read as a tar"
    assert TOKEN not in docker("history", "--no-trunc", tag).stdout
    inspected = json.loads(docker("inspect", tag).stdout)[0]
    assert TOKEN not in json.dumps(inspected)


def test_the_token_is_not_in_what_the_build_printed(planted_build: tuple[str, str]) -> None:
    output, _ = planted_build
    assert TOKEN not in output


def test_the_token_is_not_in_the_build_records(planted_build: tuple[str, str]) -> None:
    _, tag = planted_build
    records = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", "cat /opt/verlbox/build-record/*.json").stdout
    assert '"name"' in records and TOKEN not in records


def test_a_pip_report_from_an_index_with_a_token_records_no_url() -> None:
    """Unlocked builds record pip's --report, which `verlbox lock` turns into the lock."""
    wheel = "rich-14.0.0-py3-none-any.whl"
    url = f"https://__token__:{TOKEN}@index.invalid/packages/{wheel}?auth={TOKEN}#sha256=" + "a" * 64
    report = {
        "install": [
            {
                "metadata": {"name": "rich", "version": "14.0.0"},
                "download_info": {"url": url, "archive_info": {"hashes": {"sha256": "a" * 64}}},
                "is_direct": False,
            }
        ]
    }
    record = pip_record(report)
    assert record[0]["file"] == wheel and TOKEN not in json.dumps(record)


def fetched_hosts(output: str) -> set[str]:
    return set(re.findall(r"Get:\d+ https?://(\S+?)/", output))


def test_bundle_s_debian_stage_fetches_through_the_planted_mirror_and_keeps_no_token(
    planted_bundle_debs: tuple[str, Path],
) -> None:
    output, folder = planted_bundle_debs
    mirror = urlsplit(mirror_from_apt_sources() or "")
    assert fetched_hosts(output) == {f"{mirror.hostname}:{mirror.port or {'http': 80, 'https': 443}[mirror.scheme]}"}
    files = [path for path in folder.rglob("*") if path.is_file()]
    assert any(path.suffix == ".deb" for path in files) and any(path.name == "Packages.xz" for path in files)
    assert TOKEN not in output
    assert [path for path in files if TOKEN.encode() in path.read_bytes() or TOKEN in str(path)] == []
