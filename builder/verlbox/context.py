"""The build context: the rendered Dockerfile, the resolved recipe and the verlbox source, nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from verlbox.errors import VerlboxError
from verlbox.plan import BuildPlan
from verlbox.render import render_dockerfile

SOURCE_ROOT = Path(__file__).resolve().parents[2]


def write_context(plan: BuildPlan, directory: Path) -> Path:
    """Fill `directory`; the same plan and source give the same bytes, so the layer cache holds."""
    if not (SOURCE_ROOT / "pyproject.toml").is_file():
        raise VerlboxError(
            f"building needs verlbox's source tree (no pyproject.toml in {SOURCE_ROOT}): "
            "install it with `pip install -e .` from a checkout"
        )
    (directory / "Dockerfile").write_text(render_dockerfile(plan))
    if plan.lock_text:
        (directory / "constraints.txt").write_text(plan.lock_text)
    recipe = {"recipe": plan.recipe.model_dump(mode="json"), "labels": plan.labels}
    (directory / "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    source = directory / "verlbox-src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(SOURCE_ROOT / name, source / name)
    shutil.copytree(
        SOURCE_ROOT / "builder" / "verlbox",
        source / "builder" / "verlbox",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return directory
