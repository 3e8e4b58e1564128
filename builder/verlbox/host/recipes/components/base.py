"""A component: one part of an image, its recipe schema, its pins and its Dockerfile steps together.

In the manner of hpc-container-maker's building blocks, a component's template defines up to three
macros, each called with the component and the build plan: `system` (steps in the shared stage every
later stage starts from), `builder` (a stage of its own, whose output the final stage mounts) and
`final` (steps in the image users run). Multi-stage builds fall out of which macros a template has.
"""

from __future__ import annotations

from typing import ClassVar

from verlbox.host.recipes.schema import Strict


class Component(Strict):
    key: ClassVar[str]  # its key in a recipe file, and its template's name
    required: ClassVar[bool] = False
    template: ClassVar[str]

    def pins(self) -> dict[str, str]:
        """What this component puts in the image, name -> exact version: labels and smoke compare these."""
        return {}
