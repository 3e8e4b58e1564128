"""NVIDIA Apex at a pinned commit, compiled into a wheel in a stage of its own; only the wheel ships."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from verlbox.host.components.base import Component
from verlbox.host.schema import GitCommit, HttpsUrl


class Apex(Component):
    key = "apex"
    repo: HttpsUrl = "https://github.com/NVIDIA/apex"
    commit: GitCommit
    # Apex changed how CUDA extensions are requested at tag 25.09; a commit hash does not say which.
    build_style: Literal["config-settings", "env"] = "config-settings"
    max_jobs: Annotated[int, Field(ge=1, le=64)] = 4

    def pins(self) -> dict[str, str]:
        return {"apex": self.commit}

    template = """
{% import "_macros.j2" as m %}
{% macro builder(c, plan) -%}
# NVIDIA Apex at a pinned commit, compiled into a wheel here; only the wheel reaches the image.
# No GPU is visible during a build, so the arch list comes from the recipe's target GPUs. The lock's
# constraints do not apply: Apex's build tools are pinned here and are not part of the image.
ARG TORCH_CUDA_ARCH_LIST={{ plan.cuda_arch_list | q }}
ARG MAX_JOBS={{ c.max_jobs | q }}
WORKDIR /src/apex
{{ m.apt_install(plan, ["git"]) }}
{{ m.run(plan, constrained=False) }} git init -q . && git remote add origin {{ c.repo | q }} \\
    && git fetch -q --depth 1 origin {{ c.commit | q }} && git checkout -q FETCH_HEAD \\
    && pip install packaging==25.0 setuptools==80.9.0 wheel==0.45.1 ninja==1.11.1.4 \\
{% if c.build_style == "env" %}
    && APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip wheel -v --no-build-isolation --no-deps -w /wheels . \\
{% else %}
    && pip wheel -v --no-build-isolation --no-deps -w /wheels \\
       --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" . \\
{% endif %}
    && printf '{"commit": "%s"}\\n' "$(git rev-parse HEAD)" >/wheels/verlbox-source.json
{%- endmacro %}
{% macro final(c, plan) -%}
# the source record goes into Apex's dist-info: smoke compares the commit with the recipe's
RUN --mount=type=bind,from=apex-build,source=/wheels,target=/tmp/apex-wheels \\
    pip install --no-cache-dir --no-deps /tmp/apex-wheels/*.whl \\
    && cp /tmp/apex-wheels/verlbox-source.json "$(python -c 'import importlib.metadata as m; print(m.distribution("apex")._path)')/"
{%- endmacro %}
"""
