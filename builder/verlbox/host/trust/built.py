"""What a build made, recorded outside the image: `verlbox build` reads the image it just made from its saved
layers (image_files.py, nothing of the image run) and writes, into the host's state folder, one record per image
ID: the recipe and lock it was built from, its layers' diff IDs, what verify reads from it (Python distributions
and versions, Debian packages, Apex's source commit, the compiled wheels' record) and every path with its line
(kind, mode, owner, sha256). `verlbox verify` holds an image to those records, never to files the image carries.

Every path is recorded, not only those that run: a data file can decide what runs (`/etc/ld.so.preload`, a
`.pth`, an entry point's `entry_points.txt`, dpkg's md5sums), and within one image no file varies.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from verlbox.files import write_atomically
from verlbox.host.clients.engine import docker_output
from verlbox.host.trust.image_files import image_files
from verlbox.runtime.steps.apex_build import SOURCE_RECORD
from verlbox.runtime.steps.build_record import RECORD_DIR

# the files verify reads facts from (kept whole while the image streams by): the venv's distributions (every
# recipe's Python is the venv at /opt/venv, components/python.py), dpkg's database, the build's compiled record
DISTRIBUTION = re.compile(r"opt/venv/lib/python[^/]+/site-packages/[^/]+\.dist-info/(METADATA|" + SOURCE_RECORD + ")")
DPKG_STATUS = "var/lib/dpkg/status"
COMPILED = re.compile(re.escape(str(RECORD_DIR / "compiled").lstrip("/")) + r"/([^/]+)\.json")


def keep(path: str) -> bool:
    return path == DPKG_STATUS or bool(DISTRIBUTION.fullmatch(path) or COMPILED.fullmatch(path))


@dataclass
class Facts:
    """What verify compares with the lock and the recipe, as read from the image's files."""

    pip: dict[str, str]  # canonical name -> version
    apt: dict[str, str]  # Debian package -> version
    apex: str | None  # the source commit Apex's build recorded
    compiled: dict[str, list[dict[str, str]]]  # block -> its wheels' records


def _debian_packages(status: bytes) -> dict[str, str]:
    """Each package dpkg's status file knows with a version (as `dpkg-query -W` lists them)."""
    packages = {}
    for paragraph in status.decode(errors="replace").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", paragraph, re.M))
        if fields.get("Package") and fields.get("Version"):
            packages[fields["Package"]] = fields["Version"]
    return packages


def read_facts(kept: Mapping[str, bytes]) -> Facts:
    """FACTS from the bytes of the files `keep` names."""
    pip: dict[str, str] = {}
    apex = None
    compiled: dict[str, list[dict[str, str]]] = {}
    for path, data in sorted(kept.items()):
        if match := DISTRIBUTION.fullmatch(path):
            if match.group(1) == "METADATA":
                headers = BytesHeaderParser().parsebytes(data)
                if headers["Name"] and headers["Version"]:
                    pip[canonicalize_name(headers["Name"])] = str(headers["Version"])
            elif Path(path).parent.name.startswith("apex-"):
                apex = json.loads(data or b"{}").get("commit")
        elif match := COMPILED.fullmatch(path):
            compiled[match.group(1)] = json.loads(data)
    return Facts(pip, _debian_packages(kept.get(DPKG_STATUS, b"")), apex, compiled)


@dataclass
class Record:
    """One build's image, as the host read it right after building it."""

    recipe: str
    lock_hash: str | None
    image: str  # its ID
    layers: list[str]  # its layers' diff IDs, lowest first
    facts: Facts
    files: dict[str, str]  # path (without the leading /) -> line
    steps: list[str] = field(default_factory=list)  # what made each layer (records before 2026-12-06: none)
    config: dict[str, Any] = field(default_factory=dict)  # what a container runs with (runtime_config; before: none)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(**(data | {"facts": Facts(**data["facts"])}))


def identity(reference: str) -> tuple[str, list[str], dict[str, str]]:
    """(image ID, layers' diff IDs, labels) of the engine's image REFERENCE."""
    inspected = json.loads(docker_output("image", "inspect", reference))[0]
    return inspected["Id"], list(inspected["RootFS"].get("Layers") or []), inspected["Config"].get("Labels") or {}


# the image config's parts that say what a container of it runs and how (entrypoint, command, environment, user,
# working folder, shell, volumes, labels...), not its parent image's ID or a container's terminal settings
NOT_RUNTIME = {
    "Image",
    "Hostname",
    "Domainname",
    "AttachStdin",
    "AttachStdout",
    "AttachStderr",
    "Tty",
    "OpenStdin",
    "StdinOnce",
}


def runtime_config(reference: str) -> dict[str, Any]:
    """What a container of the engine's image REFERENCE runs with, and its platform: no file says it, so a layer's
    digest does not either (`ENTRYPOINT ["python", "-c", ...]` adds no layer). Empty values are left out: engines
    differ in which they list."""
    inspected = json.loads(docker_output("image", "inspect", reference))[0]
    config = {
        key: value
        for key, value in (inspected.get("Config") or {}).items()
        if key not in NOT_RUNTIME and value not in (None, "", [], {}, False)
    }
    return config | {key: inspected[key] for key in ("Os", "Architecture", "Variant") if inspected.get(key)}


def config_digest(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_differences(built: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One line per part of the runtime config (a label, an environment variable, the entrypoint...) that differs
    between BUILT (the record) and NOW (the image)."""
    was, has = _config_parts(built), _config_parts(now)
    return [
        f"config {name}: image {_shown(has.get(name))}, built {_shown(was.get(name))}"
        for name in sorted(was.keys() | has.keys())
        if was.get(name) != has.get(name)
    ]


def _config_parts(config: Mapping[str, Any]) -> dict[str, Any]:
    """CONFIG as the parts a message names: each label and each environment variable apart (a changed pin or
    variable names itself), the rest by key."""
    parts: dict[str, Any] = {}
    for key, value in config.items():
        if key == "Labels":
            parts |= {f"label {name}": text for name, text in value.items()}
        elif key == "Env":
            parts |= {f"Env {name}": text for name, _, text in (entry.partition("=") for entry in value)}
        else:
            parts[key] = value
    return parts


def _shown(value: Any) -> str:
    return "absent" if value is None else json.dumps(value)


def read_image(reference: str) -> Record:
    """REFERENCE's record, read now from its saved layers."""
    image, layers, labels = identity(reference)
    files = image_files(reference, keep)
    return Record(
        labels.get("io.verlbox.recipe", ""),
        labels.get("io.verlbox.lock.hash"),
        image,
        layers,
        read_facts(files.kept),
        files.lines,
        files.steps,
        runtime_config(reference),
    )


def record_path(folder: Path, image: str) -> Path:
    return folder / f"{image.removeprefix('sha256:')}.json.gz"


def write_record(folder: Path, record: Record) -> Path:
    """RECORD into FOLDER (gzip: the p40-cu124 image's 65,000 paths are 10 MB of JSON, 2 MB packed)."""
    path = record_path(folder, record.image)
    write_atomically(path, gzip.compress(json.dumps(asdict(record), sort_keys=True).encode(), mtime=0))
    return path


def load_record(path: Path) -> Record | None:
    """The record at PATH, or None where it is gone or unreadable (one such file never stops a verify)."""
    try:
        return Record.from_json(json.loads(gzip.decompress(path.read_bytes())))
    except (OSError, ValueError, TypeError, KeyError, EOFError):
        return None


def records_of(folder: Path, recipe: str) -> list[Record]:
    """Every readable record in FOLDER of an image of RECIPE."""
    found = [load_record(path) for path in sorted(folder.glob("*.json.gz"))]
    return [record for record in found if record is not None and record.recipe == recipe]
