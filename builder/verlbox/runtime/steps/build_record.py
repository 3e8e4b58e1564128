"""What each install step of a build put into the image: Python distributions with the sha256 of the
file pip installed them from, and Debian packages with their versions. `verlbox lock` turns these
records into the recipe's lock; `verlbox verify` compares an image with that lock.

Standard library only: build_steps.py, which every installing step runs before verlbox is installed in
the image, imports it from the same folder. Records hold names, versions, file names and hashes, never an
index or mirror URL (an index URL may carry a token); only a URL the recipe itself names is kept.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

RECORD_DIR = Path("/opt/verlbox/build-record")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_record(report: dict) -> list[dict]:
    """The distributions a `pip install --report` installed: name, version, file, sha256 (and a direct URL)."""
    entries = []
    for item in report.get("install", []):
        metadata, download = item["metadata"], item.get("download_info", {})
        url = download.get("url", "")
        hashes = download.get("archive_info", {}).get("hashes", {})
        entry = {
            "name": _canonical(metadata["name"]),
            "version": metadata["version"],
            # the file's name only: an index's URL may carry a token in its userinfo or its query
            "file": unquote(urlsplit(url).path.rsplit("/", 1)[-1]),
            "sha256": hashes.get("sha256", ""),
        }
        if item.get("is_direct") and url.startswith("https://"):
            entry["url"] = url.split("#", 1)[0]  # named by the recipe (validated: https, no credentials)
        entries.append(entry)
    return sorted(entries, key=lambda entry: entry["name"])


def apt_record(before: str, after: str) -> list[dict]:
    """Debian packages an apt step installed or changed: `dpkg-query -W -f '${Package}=${Version}\\n'` lists."""
    old = set(before.split())
    entries = []
    for line in sorted(set(after.split()) - old):
        name, _, version = line.partition("=")
        entries.append({"name": name, "version": version})
    return entries


def requirement_lines(entries: list[dict]) -> list[str]:
    """A pip requirements file that installs exactly these files: `--require-hashes --no-deps`."""
    lines = []
    for entry in entries:
        target = f"{entry['name']} @ {entry['url']}" if "url" in entry else f"{entry['name']}=={entry['version']}"
        lines.append(f"{target} --hash=sha256:{entry['sha256']}")
    return lines


def read_records(directory: Path = RECORD_DIR) -> dict[str, dict[str, list[dict]]]:
    """All records of an image, by step: {"torch": {"pip": [...]}, "python": {"apt": [...], "pip": [...]}}."""
    steps: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(directory.glob("*.json")):
        step, _, kind = path.stem.rpartition(".")
        steps.setdefault(step, {})[kind] = json.loads(path.read_text())
    return steps


def write_record(step: str, kind: str, entries: list[dict], directory: Path = RECORD_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{step}.{kind}.json").write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")


def installed_entry(distribution: metadata.Distribution) -> dict:
    """What is installed of DISTRIBUTION: its version and the sha256 of its RECORD (which lists the hash of
    every file it installed), read after the step wrote the bytecode."""
    record = Path(distribution._path) / "RECORD"  # type: ignore[attr-defined]  # its dist-info folder
    return {
        "name": _canonical(distribution.metadata["Name"]),
        "version": distribution.version,
        "record": hashlib.sha256(record.read_bytes()).hexdigest(),
    }


def write_installed(step: str, names: list[str], path: list[str] | None, directory: Path = RECORD_DIR) -> None:
    """DIRECTORY/installed/STEP.json: what the step installed (NAMES, found in PATH, else this interpreter's
    path), as installed: the lock says what was asked for, this what the image holds (`verify` reads the host's
    record of the build instead: host/trust/built.py).
    Names are compared canonically here (Python 3.9's own lookup misses `ruamel.yaml` for `ruamel-yaml`)."""
    installed = {
        _canonical(distribution.metadata["Name"]): distribution
        for distribution in metadata.distributions(**({} if path is None else {"path": path}))
    }
    if missing := sorted(name for name in names if _canonical(name) not in installed):
        raise LookupError(f"{', '.join(missing)} installed, but not found in {path or 'sys.path'}")
    entries = sorted((installed_entry(installed[_canonical(name)]) for name in names), key=lambda e: e["name"])
    folder = directory / "installed"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step}.json").write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    if argv != ["dump"]:
        print("usage: python -m verlbox.runtime.steps.build_record dump", file=sys.stderr)
        return 2
    # the final image's own steps, and those of build stages whose output it carries (Apex's)
    print(json.dumps(read_records() | read_records(RECORD_DIR / "builder"), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
