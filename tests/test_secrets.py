"""A planted token in every secret a build takes (the apt mirror's and pip index's userinfo, the CA bundle)
is found nowhere afterwards: not in any layer, the image's config and history, its labels, its build
records, nor in what the build printed.

Secrets are not part of BuildKit's cache keys, so a warm cache would run no step and the check would
prove nothing: the system stage (apt, venv, torch: every kind of installing step) is built again with
--no-cache, and its cache records are dropped after.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import subprocess
import tarfile
from urllib.parse import urlsplit, urlunsplit

import pytest
from pip._internal.models.index import PyPI
from rich.console import Console

from conftest import HOST_CA_BUNDLE, build_cache_ids, docker, prune_build_cache_since
from verlbox.host.bootstrap import mirror_from_apt_sources
from verlbox.host.build import run_buildx
from verlbox.host.plan import BuildPlan
from verlbox.host.recipe import load_recipe
from verlbox.host.sources import BuildSources
from verlbox.runtime.build_record import pip_record

TOKEN = f"planted{secrets.token_hex(12)}"
TAG = f"verlbox-test/planted-token:{TOKEN[-8:]}"


def planted(url: str, user: str) -> str:
    """URL with TOKEN as its password and its port written out: the same server, but a name no other source
    uses, so that the build's output shows which steps fetched through it."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}[parts.scheme]
    return urlunsplit(parts._replace(netloc=f"{user}:{TOKEN}@{parts.hostname}:{port}"))


def layer_texts(image_tar: bytes) -> dict[str, bytes]:
    """Every file of `docker save`'s archive, each layer's files by their path inside the layer."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(image_tar)) as outer:
        for member in outer.getmembers():
            data = outer.extractfile(member)
            if data is None:
                continue
            content = data.read()
            found[member.name] = content
            if member.name.endswith((".tar", "layer.tar")) or member.name.startswith("blobs/"):
                try:
                    with tarfile.open(fileobj=io.BytesIO(content)) as layer:
                        for inner in layer.getmembers():
                            if inner.isfile() and (handle := layer.extractfile(inner)) is not None:
                                found[f"{member.name}:{inner.name}"] = handle.read()
                            found[f"{member.name}:{inner.name} (name, link)"] = (
                                f"{inner.name} {inner.linkname}".encode()
                            )
                except tarfile.ReadError:
                    pass  # a config or manifest blob, searched as it is
    return found


@pytest.fixture(scope="module")
def planted_build(docker_engine: object, image: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The system stage of p40-cu124 built with no cache, every secret carrying TOKEN; (console output, tag)."""
    mirror = mirror_from_apt_sources()
    if mirror is None:
        pytest.fail("the host's apt sources name no Debian archive: the planted mirror is made from it")
    folder = tmp_path_factory.mktemp("planted")
    ca_bundle = folder / "ca.pem"
    ca_bundle.write_bytes((HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b"") + f"# {TOKEN}\n".encode())
    sources = BuildSources(
        ca_bundle=ca_bundle,
        pip_index_url=planted(PyPI.simple_url, "__token__"),
        apt_mirror=planted(mirror, "verlbox"),
    )
    base = docker("inspect", "--format", '{{index .Config.Labels "io.verlbox.base"}}', image).stdout.strip()
    plan = BuildPlan(load_recipe("p40-cu124"), base_override=base)
    kept = build_cache_ids(docker_engine)
    said = io.StringIO()
    try:
        run_buildx(
            plan,
            ["--load", "--target", "system", "--tag", TAG, "--no-cache"],
            sources=sources,
            progress="plain",
            console=Console(file=said, width=250),
            what="building",
        )
        yield said.getvalue(), TAG
    finally:
        docker("rmi", "--force", TAG, check=False)
        prune_build_cache_since(docker_engine, kept)


def test_the_planted_build_ran_its_steps_through_the_planted_sources(planted_build: tuple[str, str]) -> None:
    """Else the token's absence proves nothing: every step ran (no cache), apt fetched through the planted
    mirror (its port written out: no other source names it so), and uv downloaded torch from an index
    its cache does not know (uv caches by index URL, and the planted one is new at every run)."""
    output, _ = planted_build
    runs = re.findall(r"^#(\d+) \[system \d+/\d+\] RUN ", output, re.MULTILINE)
    assert len(runs) >= 3 and all(f"\n#{step} DONE " in output for step in runs), output[-3000:]
    mirror = urlsplit(mirror_from_apt_sources() or "")
    planted_mirror = f"{mirror.hostname}:{mirror.port or {'http': 80, 'https': 443}[mirror.scheme]}"
    fetched = re.findall(r"Get:\d+ https?://(\S+?)/", output)
    assert fetched and set(fetched) == {planted_mirror}, sorted(set(fetched))
    assert re.search(r"Downloading torch \(", output), output[-3000:]


def test_the_token_is_in_no_layer_config_or_history(planted_build: tuple[str, str]) -> None:
    _, tag = planted_build
    saved = subprocess.run(["docker", "save", tag], capture_output=True, check=True).stdout
    holding = sorted(name for name, content in layer_texts(saved).items() if TOKEN.encode() in content)
    assert holding == []
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
