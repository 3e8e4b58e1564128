"""What a builder stage compiled (Apex's wheel), as the image got it: each wheel's file name and sha256.

Standard library only: the final stage's Apex step runs it (`python3 compiled.py BLOCK DIR`) before verlbox
is installed; `verlbox lock` reads it back (`python -m verlbox.runtime.steps.compiled_record dump`) and pins the
wheels, and an offline build takes exactly those files. A file of its own, not part of build_record.py:
that one is mounted into every installing step, so a change to it would rebuild them all (Apex's compile
included), while this one only reaches the step that installs the compiled wheel.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

COMPILED_DIR = Path("/opt/verlbox/build-record/compiled")


def wheel_record(folder: Path) -> list[dict]:
    """The wheels in FOLDER with their sha256; name and version from the file name."""
    entries = []
    for path in sorted(folder.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        digest = hashlib.sha256()
        with path.open("rb") as wheel:
            for chunk in iter(lambda: wheel.read(1 << 20), b""):
                digest.update(chunk)
        canonical = re.sub(r"[-_.]+", "-", name).lower()
        entries.append({"name": canonical, "version": version, "file": path.name, "sha256": digest.hexdigest()})
    return entries


def read_compiled(directory: Path = COMPILED_DIR) -> dict[str, list[dict]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        COMPILED_DIR.mkdir(parents=True, exist_ok=True)
        entries = wheel_record(Path(argv[1]))
        (COMPILED_DIR / f"{argv[0]}.json").write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    elif argv == ["dump"]:
        print(json.dumps(read_compiled(), sort_keys=True))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
