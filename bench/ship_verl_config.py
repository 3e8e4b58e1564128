"""Ship verl's Hydra config as package data, so the host checks overrides without verl installed.

  python bench/ship_verl_config.py WHEEL [--lock recipes/p40-cu124.lock.json] [--out DIR]

WHEEL is the pinned verl wheel (`pip download --no-deps verl==0.4.1`); its sha256 must be the one the
lock records for verl, so the shipped copy always comes from the file the images install. The config
files are copied byte for byte into DIR/verl-VERSION/ (default: verlbox's shipped folder) beside
source.json, which names the wheel and its hash. tests/test_overrides.py reruns this against the
wheel and compares.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import zipfile
from pathlib import Path

from verlbox.runtime.training.overrides import CONFIG_FILES, SHIPPED_CONFIGS, SOURCE_RECORD, WHEEL_CONFIG_DIR


def locked_verl(lock: Path) -> dict[str, str]:
    """The lock's entry for the verl wheel (file, version, sha256)."""
    entries = [pip for step in json.loads(lock.read_text())["steps"] for pip in step["pip"] if pip["name"] == "verl"]
    if len(entries) != 1:
        raise SystemExit(f"{lock}: expected one verl wheel, found {len(entries)}")
    return entries[0]


def ship(wheel: Path, lock: Path, out: Path) -> Path:
    locked = locked_verl(lock)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != locked["sha256"]:
        raise SystemExit(f"{wheel.name}: sha256 {digest}, but {lock} has {locked['sha256']} for {locked['file']}")
    target = out / f"verl-{locked['version']}"
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in CONFIG_FILES:
            (target / name).write_bytes(archive.read(f"{WHEEL_CONFIG_DIR}/{name}"))
    record = {"wheel": locked["file"], "sha256": digest, "files": [f"{WHEEL_CONFIG_DIR}/{n}" for n in CONFIG_FILES]}
    (target / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--lock", type=Path, default=Path("recipes/p40-cu124.lock.json"))
    parser.add_argument("--out", type=Path, default=SHIPPED_CONFIGS)
    args = parser.parse_args()
    print(f"wrote {ship(args.wheel, args.lock, args.out)}")


if __name__ == "__main__":
    main()
