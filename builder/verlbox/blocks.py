"""Building blocks: one per component, each knowing its own Dockerfile steps.

A block's template (templates/<name>.j2) defines up to three macros: `system` (steps in the shared
stage that every later stage starts from), `builder` (a stage of its own whose output is copied on)
and `final` (steps in the image users run). Multi-stage builds fall out of which macros exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import jinja2

if TYPE_CHECKING:
    from verlbox.plan import BuildPlan

Part = Literal["system", "builder", "final"]

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("verlbox", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # Dockerfiles, not HTML
)


@dataclass(frozen=True)
class Block:
    name: str
    plan: BuildPlan

    def _module(self) -> object:
        return TEMPLATES.get_template(f"{self.name}.j2").module

    def has(self, part: Part) -> bool:
        return callable(getattr(self._module(), part, None))

    def render(self, part: Part) -> str:
        macro = getattr(self._module(), part)
        return str(macro(self.plan.recipe, self.plan)).strip("\n")
