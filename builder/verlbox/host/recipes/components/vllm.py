"""vLLM: only a rollout backend where its kernels cover the GPU (stock wheels start at sm_70).

Its step installs verl's pinned dependencies in the same resolution, so that the final stage is one
consistent set (`pip check` clean, numpy at verl's pin); verl's own step then finds them in place.
"""

from __future__ import annotations

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ComputeCapability, ExactVersion, HttpsUrl


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
# vLLM {{ c.version | q }}; kernels for sm {{ c.kernels_for | words }}. Resolved with verl's pinned dependencies: vLLM's
# ranges alone take the newest opencv-python-headless and cupy, which need numpy 2, beside verl's numpy pin
{{ m.pip(plan, "vllm", plan.torch_extra_index) }} {{ (c.wheel_url or "vllm==" ~ c.version) | q }} \\
{% for requirement in plan.recipe.verl.requirements() %}
       {{ requirement | q }} \\
{% endfor %}
       {{ plan.recipe.torch.requirements() | words }}
{%- endmacro %}
"""
