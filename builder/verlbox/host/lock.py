"""Lock files: the exact Python packages of a recipe's last good image, STEM.lock.txt beside the recipe.

Written by `verlbox lock` from the image's `pip freeze`, read by the build plan from the same place
(always by the recipe file's stem), and bind-mounted into every pip install as PIP_CONSTRAINT.
"""

from __future__ import annotations

import subprocess

from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.host.engine import require_cli
from verlbox.host.recipe import RecipeHead


def frozen_packages(image: str) -> list[str]:
    run = subprocess.run(
        [require_cli(), "run", "--rm", "--entrypoint", "pip", image, "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise VerlboxError(f"pip freeze in {image} failed: {run.stderr.strip()[-1000:]}")
    # verlbox itself is installed from the build context on every build: never a constraint
    return [line for line in run.stdout.splitlines() if line and not line.startswith("verlbox ")]


def write_lock(recipe: RecipeHead, image: str) -> tuple[str, int]:
    target = recipe.lock_path
    if target is None:
        raise UsageError(f"recipe {recipe.name} was not read from a file, so it has no place for a lock")
    frozen = frozen_packages(image)
    header = (
        f"# pip freeze of {image} (recipe {recipe.name}, hash {recipe.content_hash[:12]}), written by\n"
        f"# `verlbox lock`. Builds install with these as pip constraints.\n"
    )
    write_atomically(target, header + "\n".join(frozen) + "\n")
    return str(target), len(frozen)
