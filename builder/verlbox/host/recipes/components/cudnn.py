"""System cuDNN from NVIDIA's CUDA apt repository, pinned and held (the CUDA base holds an older one)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import DebianVersion


class Cudnn(Component):
    key = "cudnn"
    apt_version: DebianVersion
    # the base's NVIDIA CUDA apt repository (DISTRO/ARCH, as in its cuda.list): `build --check` asks its index
    repository: Annotated[str, Field(pattern=r"^[a-z0-9]+/[a-z0-9_]+$")]

    @property
    def version(self) -> str:
        return self.apt_version.split("-", 1)[0]

    def pins(self) -> dict[str, str]:
        return {"cudnn": self.version}

    template = """
{% import "_macros.j2" as m %}
{% macro system(c, plan) -%}
# cuDNN {{ c.version | q }} from NVIDIA's CUDA apt repository: the base holds an older one
{{ m.apt_install(plan, "cudnn", ["libcudnn8=" ~ c.apt_version, "libcudnn8-dev=" ~ c.apt_version],
                 ["--allow-change-held-packages", "--allow-downgrades"]) }} \\
    && apt-mark hold libcudnn8 libcudnn8-dev
{%- endmacro %}
"""
