"""Where the files verlbox ships (recipes, rendered Dockerfiles, compose.yaml) are found.

A wheel carries them as package data under verlbox/shipped (setup.py copies them in at build time);
a checkout or an editable install reads them from the top of the source tree. Nothing else
computes these paths.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parents[1]


def shipped_root() -> Path:
    """The folder that holds recipes/, dockerfiles/ and compose.yaml."""
    packaged = PACKAGE_DIR / "shipped"
    if (packaged / "recipes").is_dir():
        return packaged
    return _CHECKOUT


def recipes_dir() -> Path:
    return shipped_root() / "recipes"


def dockerfiles_dir() -> Path:
    return shipped_root() / "dockerfiles"


def compose_file() -> Path:
    return shipped_root() / "compose.yaml"


def env_example_file() -> Path:
    return shipped_root() / ".env.example"
