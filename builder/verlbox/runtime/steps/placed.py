"""What verlbox placed in an image, by hash: every file of the installed verl (patched) and of verlbox's own
runtime, as they stood at the end of the build, for a reader of the image. `verlbox verify` does not read it
(an image's own record vouches for nothing): it holds the image to the host's record of the build
(host/trust/built.py).

    python -m verlbox.runtime.steps.placed write    (the build's last step)
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


if __name__ == "__main__":
    if sys.argv[1:] == ["write"]:
        write()
    else:
        sys.exit("usage: python -m verlbox.runtime.steps.placed write")
