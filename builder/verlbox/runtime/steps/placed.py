"""What verlbox placed in an image, by hash: every file of the installed verl (patched) and of verlbox's own
runtime, as they stood at the end of the build. The lock pins what came from indexes; this pins what
verlbox wrote over them, so that `verlbox verify` can tell a tampered image from an intact one.

    python -m verlbox.runtime.steps.placed write    (the build's last step)
    python -m verlbox.runtime.steps.placed check    (verify's probe: one line per file changed since)
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import sys
from pathlib import Path

# beside the build record, not in it: every *.json there is a step's record, which `verlbox lock` reads
PLACED = Path("/opt/verlbox/placed.json")
DISTRIBUTIONS = ("verl", "verlbox")


def current_hashes() -> dict[str, str]:
    """DIST/PATH -> sha256 for every file the installed DISTRIBUTIONS list (their RECORD), as they are now."""
    found: dict[str, str] = {}
    for name in DISTRIBUTIONS:
        distribution = metadata.distribution(name)
        for entry in distribution.files or []:
            path = Path(str(entry.locate()))
            if path.suffix != ".pyc" and path.is_file():
                found[f"{name}/{entry}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def write(path: Path = PLACED) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current_hashes(), indent=0, sort_keys=True) + "\n")


def changed_since_build(path: Path = PLACED) -> list[str]:
    """One line per placed file that differs from the build's record, is gone, or was added."""
    if not path.is_file():
        return [f"no record of the files verlbox placed ({path}): built by an older verlbox"]
    built: dict[str, str] = json.loads(path.read_text())
    now = current_hashes()
    lines = []
    for name in sorted(set(built) | set(now)):
        if name not in now:
            lines.append(f"{name}: gone since the build")
        elif name not in built:
            lines.append(f"{name}: not there at the build")
        elif now[name] != built[name]:
            lines.append(f"{name}: changed since the build (sha256 {now[name][:12]}, built {built[name][:12]})")
    return lines


if __name__ == "__main__":
    if sys.argv[1:] == ["write"]:
        write()
    elif sys.argv[1:] == ["check"]:
        print(json.dumps(changed_since_build()))
    else:
        sys.exit("usage: python -m verlbox.runtime.steps.placed write|check")
