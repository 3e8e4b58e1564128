"""Dockerfile text from a build plan: deterministic, the same plan gives the same bytes."""

from __future__ import annotations

from verlbox.blocks import TEMPLATES
from verlbox.plan import BuildPlan


def render_dockerfile(plan: BuildPlan) -> str:
    text = TEMPLATES.get_template("Dockerfile.j2").render(recipe=plan.recipe, plan=plan)
    return text.rstrip("\n") + "\n"
