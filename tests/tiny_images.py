"""Tiny images a test builds on the real engine (no registry: FROM scratch), and what their builds leave behind
removed after, by a token every BuildKit record of theirs names."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

from conftest import docker


def token() -> str:
    """Unique to this process and call: another session's objects on the engine never match it."""
    return f"{os.getpid()}x{secrets.token_hex(4)}"


def labels_line(labels: dict[str, str]) -> str:
    return f"LABEL {' '.join(f'{key}={value}' for key, value in labels.items())}\n" if labels else ""


def build(folder: Path, dockerfile: str, tag: str | None = None, epoch: int | None = None) -> str:
    """DOCKERFILE built in FOLDER (made here; files the Dockerfile copies already in it); the image's ID. No TAG:
    the image is loaded untagged. EPOCH: its Created (BuildKit's SOURCE_DATE_EPOCH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    command = ["buildx", "build", "-q", "--load", *(["-t", tag] if tag else [])]
    command += ["--build-arg", f"SOURCE_DATE_EPOCH={epoch}"] if epoch is not None else []
    return docker(*command, str(folder)).stdout.strip()


def labelled(folder: Path, labels: dict[str, str], tag: str | None = None, epoch: int | None = None) -> str:
    """A two-byte image with LABELS, FROM scratch: nothing in it runs."""
    folder.mkdir(parents=True)
    (folder / "marker").write_text(folder.name)
    return build(folder, f"FROM scratch\n{labels_line(labels)}COPY marker /marker\n", tag, epoch)


def runnable(folder: Path, mark: str) -> str:
    """Dockerfile lines that give a FROM scratch image /true (the host's, with the libraries it loads), so that a
    RUN can run; MARK names the copied folders, so that their BuildKit records name it too."""
    true = shutil.which("true")
    assert true is not None
    root = folder / f"root-{mark}"
    libraries = re.findall(r"(/\S+) \(0x", subprocess.run(["ldd", true], capture_output=True, text=True).stdout)
    for source in [true, *libraries]:
        target = root / source.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(source), target)
    return f"FROM scratch\nCOPY root-{mark}/ /\n"


def true_command(*words: str) -> str:
    """An exec-form RUN command of /true (what BuildKit describes a record by)."""
    return "[" + ", ".join(f'"{word}"' for word in (shutil.which("true"), *words)) + "]"


def records_naming(engine: Any, mark: str) -> list[dict[str, Any]]:
    return [record for record in engine.df().get("BuildCache") or [] if mark in (record.get("Description") or "")]


def prune_records_naming(engine: Any, mark: str) -> None:
    """Every build-cache record whose description names MARK; a record goes once nothing is built on it."""
    while records := records_naming(engine, mark):
        pruned = [engine.api.prune_builds(filters={"id": f"^{record['ID']}$"}) for record in records]
        if not any(result.get("CachesDeleted") for result in pruned):
            return
