"""vLLM: only a rollout backend where its kernels cover the GPU (stock wheels start at sm_70)."""

from __future__ import annotations

from pydantic import Field

from verlbox.host.components.base import Component
from verlbox.host.schema import ComputeCapability, ExactVersion, HttpsUrl


class Vllm(Component):
    key = "vllm"
    version: ExactVersion
    wheel_url: HttpsUrl | None = None
    kernels_for: list[ComputeCapability] = Field(min_length=1)

    def pins(self) -> dict[str, str]:
        return {"vllm": self.version}

    template = """
{% import "_macros.j2" as m %}
{% macro final(c, plan) -%}
# vLLM {{ c.version | q }}; kernels for sm {{ c.kernels_for | words }}
{{ m.pip(plan, "vllm", plan.torch_extra_index) }} {{ (c.wheel_url or "vllm==" ~ c.version) | q }} {{ plan.recipe.torch.requirements() | words }}
{%- endmacro %}
"""
