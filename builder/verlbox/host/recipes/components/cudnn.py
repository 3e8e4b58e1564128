"""System cuDNN from NVIDIA's CUDA apt repository, pinned and held (the CUDA base holds an older one)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import DebianVersion

# NVIDIA's CUDA apt repositories' signing key since its April 2022 rotation (3bf863cc, which replaced 7fa2af80): the
# one key the cuda-keyring of its CUDA images built since then holds
NVIDIA_CUDA_KEY = "EB693B3035CD5710E231E123A4B469963BF863CC"


class Cudnn(Component):
    key = "cudnn"
    apt_version: DebianVersion
    # the base's NVIDIA CUDA apt repository (DISTRO/ARCH, as in its cuda.list): `build --check` asks its index
    repository: Annotated[str, Field(pattern=r"^[a-z0-9]+/[a-z0-9_]+$")]
    # the fingerprint of the key that signs that repository, as the base's cuda-keyring holds it: `build --check`
    # verifies the repository's InRelease with it, so a rotated key fails there, not in the build's apt. Kept out of
    # the recipe hash: a fact of the base image, which its tag and digest already cover
    repository_key: Annotated[str, Field(pattern=r"^[0-9A-F]{40}$")] = Field(default=NVIDIA_CUDA_KEY, exclude=True)

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
