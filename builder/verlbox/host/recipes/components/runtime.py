"""verlbox's own runtime in the image: entrypoint, preflight, smoke checks and the verl patch set."""

from __future__ import annotations

from pydantic import Field

from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import ExactVersion, PackageName

# The image side's few needs; it never imports the host side, so no Jinja2 or docker SDK in images.
# `packaging` comes with the verl stack (virtualenv, via ray, wants a newer one than a pin would keep).
RUNTIME_REQUIREMENTS = {"pydantic": "2.11.7", "PyYAML": "6.0.2", "rich": "14.0.0"}


class Runtime(Component):
    key = "runtime"
    required = True
    requirements: dict[PackageName, ExactVersion] = Field(default_factory=lambda: dict(RUNTIME_REQUIREMENTS))

    def pins(self) -> dict[str, str]:
        return dict(self.requirements)

    def pins_as_requirements(self) -> list[str]:
        return [f"{name}=={version}" for name, version in self.requirements.items()]

    template = """
{% import "_macros.j2" as m %}
{% macro final(c, plan) -%}
# the verlbox runtime: entrypoint, smoke checks and the verl patch set (changes most often: last)
{{ m.pip(plan, "runtime") }} {{ c.pins_as_requirements() | words }}
COPY image-spec.json /opt/verlbox/image-spec.json
{{ m.RUN(plan) }} --mount=type=bind,source=verlbox-src,target=/tmp/verlbox-src,rw \\
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/verlbox-src \\
    && verlbox patch-verl "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \\
    && python -m verlbox.runtime.steps.placed write \\
    && mkdir -p /workspace && chmod 1777 /workspace
ENV VERLBOX_IMAGE_SPEC=/opt/verlbox/image-spec.json \\
    HF_HUB_OFFLINE=1 \\
    HF_DATASETS_OFFLINE=1
WORKDIR /workspace
ENTRYPOINT ["verlbox"]
CMD ["train"]
{%- endmacro %}
"""
