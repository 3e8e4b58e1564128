"""PyTorch (+ torchvision, torchaudio): the largest layer, placed early so that it is rebuilt rarely."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ExactVersion


class Torch(Component):
    key = "torch"
    required = True
    version: ExactVersion
    torchvision: ExactVersion | None = None
    torchaudio: ExactVersion | None = None
    # Torch from a wheel index of its own (e.g. PyTorch's cu118 builds). The recipe names it; its URL
    # is given at build time (--torch-index-url), so no index host is written into recipes or images.
    index: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")] | None = None

    def pins(self) -> dict[str, str]:
        pins = {"torch": self.version}
        pins |= {"torchvision": self.torchvision} if self.torchvision else {}
        pins |= {"torchaudio": self.torchaudio} if self.torchaudio else {}
        return pins

    def requirements(self) -> list[str]:
        """Repeated in every later pip install so that no dependency can swap torch out."""
        return [f"{name}=={version}" for name, version in self.pins().items()]

    template = """
{% import "_macros.j2" as m %}
{% macro system(c, plan) -%}
# PyTorch {{ c.version | q }}{% if c.index %} from the {{ c.index | q }} wheel index{% endif %}: the largest layer, kept early
{{ m.pip(plan, "torch", "--index=torch" if c.index else "") }} {{ c.requirements() | words }}
{%- endmacro %}
"""
