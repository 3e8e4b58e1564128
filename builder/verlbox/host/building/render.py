"""Dockerfile text from a build plan: deterministic, the same plan gives the same bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from verlbox.host.building.templating import TEMPLATES
from verlbox.host.recipes.lock import installing_steps

if TYPE_CHECKING:
    from verlbox.host.building.plan import BuildPlan


def render_dockerfile(plan: BuildPlan) -> str:
    text = TEMPLATES.get_template("Dockerfile.j2").render(plan=plan).rstrip("\n") + "\n"
    if plan.lock:  # checked against what this Dockerfile installs, before anything reads the lock's slices
        plan.lock.check_steps(list(installing_steps(text)), plan.recipe.lock_path, offline=plan.offline)
    return text
