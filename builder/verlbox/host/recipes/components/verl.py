"""verl at a pinned version, installed with --no-deps; every dependency is pinned here instead."""

from __future__ import annotations

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ExactVersion, PackageName


class Verl(Component):
    key = "verl"
    required = True
    version: ExactVersion
    # verl's metadata asks for vllm<=0.8.5 and flash-attn extras: nothing of it is trusted
    dependencies: dict[PackageName, ExactVersion]

    def pins(self) -> dict[str, str]:
        pins = {"verl": self.version}
        pins |= {name.split("[", 1)[0]: version for name, version in self.dependencies.items()}
        return pins

    def requirements(self) -> list[str]:
        return [f"{name}=={version}" for name, version in sorted(self.dependencies.items())]

    template = """
{% import "_macros.j2" as m %}
{% macro final(c, plan) -%}
# verl {{ c.version | q }} itself with --no-deps, then its dependencies, each pinned: two steps, one RUN (each
# RUN that mounts the build's secrets over freshly written layers waits for the engine, ~9 s here);
# verl first, so that a changed verl file fails the build before 100 other wheels are installed
{{ m.run(plan, ["verl", "verl-deps"], "pip") }}{{ m.steps(plan) }} pip verl --no-deps {{ ("verl==" ~ c.version) | q }} \\
    && {{ m.steps(plan) }} pip {% if plan.torch_extra_index %}{{ plan.torch_extra_index }} {% endif %}verl-deps \\
{% for requirement in c.requirements() %}
       {{ requirement | q }} \\
{% endfor %}
       {{ plan.recipe.torch.requirements() | words }}
{%- endmacro %}
"""
