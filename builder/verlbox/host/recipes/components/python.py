"""The distribution's Python in a venv at /opt/venv, with pip pinned, and the system packages it needs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ExactVersion, Text


class Python(Component):
    key = "python"
    required = True
    version: Annotated[Text, Field(pattern=r"^3\.[0-9]+$")]
    pip: ExactVersion = "25.1.1"
    # installs locked steps (by hash, no resolver): measured about 5x faster than pip (docs/benchmarks.md)
    uv: ExactVersion = "0.9.5"

    def pins(self) -> dict[str, str]:
        return {"python": self.version}

    template = """
{% import "_macros.j2" as m %}
{% macro system(c, plan) -%}
# system packages and the distribution's Python {{ c.version | q }}
ENV DEBIAN_FRONTEND=noninteractive \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PIP_NO_INPUT=1 \\
    PYTHONDONTWRITEBYTECODE=1 \\
    VIRTUAL_ENV=/opt/venv \\
    PATH=/opt/venv/bin:$PATH
{{ m.apt_install(plan, "python", ["ca-certificates", "python3", "python3-venv", "python3-dev"]) }} \\
    && python3 -c 'import sys; assert "%d.%d" % sys.version_info[:2] == sys.argv[1], "base image has Python %d.%d" % sys.version_info[:2]' {{ c.version | q }}
{{ m.run(plan, "python", "pip") }}python3 -m venv /opt/venv && {{ m.steps(plan) }} pip python {{ ("pip==" ~ c.pip) | q }} {{ ("uv==" ~ c.uv) | q }}
{%- endmacro %}
"""
