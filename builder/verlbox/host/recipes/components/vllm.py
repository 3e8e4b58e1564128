"""vLLM: only a rollout backend where its kernels cover the GPU (stock wheels start at sm_70).

Its step installs verl's pinned dependencies in the same resolution, so that the final stage is one
consistent set (`pip check` clean, numpy at verl's pin); verl's own step then finds them in place.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ComputeCapability, ExactVersion, HttpsUrl, Sha256


class Vllm(Component):
    key = "vllm"
    version: ExactVersion
    wheel_url: HttpsUrl | None = None
    # the wheel's own sha256: pip checks a URL's #sha256= against what it downloads. Without it an unlocked
    # build installs whatever the URL serves (a lock pins it after the first build)
    wheel_sha256: Sha256 | None = None
    kernels_for: list[ComputeCapability] = Field(min_length=1)

    @model_validator(mode="after")
    def _sha256_of_a_url(self) -> Vllm:
        if self.wheel_sha256 and not self.wheel_url:
            raise ValueError("wheel_sha256 pins the file of wheel_url: give wheel_url too, or drop wheel_sha256")
        return self

    @property
    def wheel(self) -> str | None:
        """The wheel's URL as pip is given it: with its sha256 when the recipe pins one."""
        if not self.wheel_url:
            return None
        return self.wheel_url + (f"#sha256={self.wheel_sha256}" if self.wheel_sha256 else "")

    def pins(self) -> dict[str, str]:
        return {"vllm": self.version}

    template = """
{% import "_macros.j2" as m %}
{% macro final(c, plan) -%}
# vLLM {{ c.version | q }}; kernels for sm {{ c.kernels_for | words }}. Resolved with verl's pinned dependencies: vLLM's
# ranges alone take the newest opencv-python-headless and cupy, which need numpy 2, beside verl's numpy pin
{{ m.pip(plan, "vllm", plan.torch_extra_index) }} {{ (c.wheel or "vllm==" ~ c.version) | q }} \\
{% for requirement in plan.recipe.verl.requirements() %}
       {{ requirement | q }} \\
{% endfor %}
       {{ plan.recipe.torch.requirements() | words }}
{%- endmacro %}
"""
