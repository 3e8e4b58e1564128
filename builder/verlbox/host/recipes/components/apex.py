"""NVIDIA Apex from a hashed source archive, compiled into a wheel in a stage of its own.

Only the wheel (and its source record) reaches the image. The stage starts from the system stage
(so it builds against the image's own torch) and, where the recipe names one, adds a CUDA toolkit
from Debian packages unpacked with `dpkg -x` (no apt install: trixie's toolkit would pull a newer
glibc into bookworm). The compile itself runs verlbox's apex_build.py with a plan rendered from
this component, so changing anything else in verlbox never recompiles Apex.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field

from verlbox.host.recipes.archive import ArchivePin
from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.schema import (
    DebianVersion,
    ExactVersion,
    GitCommit,
    HttpsUrl,
    PackageName,
    Sha256,
    Slug,
    Strict,
)
from verlbox.runtime.steps.apex_facts import apex_facts

BUILD_REQUIREMENTS = {"packaging": "25.0", "setuptools": "80.9.0", "wheel": "0.45.1", "ninja": "1.11.1.4"}
# What makes two compiles give one wheel (each found by diffoscope on two clean compiles; apex_build.py
# says why): one absolute folder for the source, and nvcc's intermediates named after their object, not
# its PID. Not recipe keys: a wheel compiled otherwise is not the one a lock pins.
REPEATABLE_BUILD_FOLDER = "/tmp/verlbox-apex-build"
REPEATABLE_ENVIRONMENT = {"NVCC_APPEND_FLAGS": "-objtemp"}


class DebianToolkit(Strict):
    """A CUDA toolkit from Debian's archive, for a base that has none: packages and versions pinned."""

    suite: Slug
    components: list[Slug] = Field(min_length=1)
    packages: dict[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.+-]+$")], DebianVersion] = Field(min_length=1)
    cuda_home: Literal["/usr"] = "/usr"


class Apex(Component):
    key = "apex"
    repo: HttpsUrl = "https://github.com/NVIDIA/apex"
    commit: GitCommit
    # sha256 of `git archive` of the commit (.tar.gz), and of the tar stream inside it: gzip's bytes
    # differ between tools, the tar `git archive` writes for a commit does not (GitHub's archive is
    # accepted by it). The build refuses anything that matches neither.
    archive_sha256: Sha256
    tar_sha256: Sha256 | None = None
    # Apex changed how CUDA extensions are requested at tag 25.09; a commit hash does not say which.
    build_style: Literal["config-settings", "env"] = "config-settings"
    # parallel nvcc jobs; null sizes them to the building machine's cores and memory
    max_jobs: Annotated[int, Field(ge=1, le=256)] | None = None
    toolkit: DebianToolkit | None = None
    build_requirements: dict[PackageName, ExactVersion] = Field(default_factory=lambda: dict(BUILD_REQUIREMENTS))

    def pins(self) -> dict[str, str]:
        # the toolkit's packages are pinned above but stay in the build stage: not the image's pins
        return {"apex": self.commit}

    @property
    def archive_name(self) -> str:
        return f"apex-{self.commit}.tar.gz"

    def archive_pin(self) -> ArchivePin:
        return ArchivePin(
            name=self.archive_name,
            sha256=self.archive_sha256,
            tar_sha256=self.tar_sha256,
            upstream_url=f"{self.repo}/archive/{self.commit}.tar.gz",
            how_to_make=f"`git archive --format=tar.gz --prefix=apex-{self.commit}/ -o {self.archive_name} "
            f"{self.commit}` in a clone of {self.repo}",
        )

    def build_plan(self, targets: list[str], archive_sha256: str | None = None) -> dict:
        """What apex_build.py reads: the same plan builds the same Apex in an image or on a GPU machine.

        `archive_sha256` is the file the host accepted (by its own hash or its tar stream's): the
        Apex stage checks those exact bytes again.
        """
        facts = apex_facts(self.commit)
        return {
            "commit": self.commit,
            "archive_sha256": archive_sha256 or self.archive_sha256,
            "arch_list": ";".join(targets),
            "build_style": self.build_style,
            "max_jobs": self.max_jobs,
            "build_patches": [patch.model_dump() for patch in facts.patches_for(targets)],
            "build_folder": REPEATABLE_BUILD_FOLDER,
            "environment": REPEATABLE_ENVIRONMENT,
        }

    def build_plan_json(self, targets: list[str], archive_sha256: str | None = None) -> str:
        return json.dumps(self.build_plan(targets, archive_sha256), indent=2, sort_keys=True) + "\n"

    template = """
{% import "_macros.j2" as m %}
{% macro builder(c, plan) -%}
# NVIDIA Apex {{ c.commit | q }} from its hashed archive, compiled for sm {{ plan.recipe.target_gpus | words }} (no GPU
# is visible during a build, so the architectures come from the recipe). Only the wheel leaves this stage.
{% if c.toolkit %}
# CUDA toolkit from Debian {{ c.toolkit.suite | q }} ({{ c.toolkit.components | words }}), unpacked at / without apt's dependency resolution
{% else %}
# the host compiler nvcc calls: a CUDA -devel base is not promised to carry one
{% endif %}
{{ m.apt_install(plan, "apex-compiler", ["g++"]) }}
{% if c.toolkit %}
{{ m.run(plan) }}{{ m.steps(plan) }} toolkit {{ c.toolkit.suite | q }}{% for component in c.toolkit.components %} --component={{ component | q }}{% endfor %} \\
       {{ c.toolkit.packages.items() | map("join", "=") | words }}
ENV CUDA_HOME={{ c.toolkit.cuda_home | q }}
{% endif %}
{{ m.pip(plan, "apex-build-tools") }} {{ c.build_requirements.items() | map("join", "==") | words }}
RUN --mount=type=bind,source=apex,target=/tmp/verlbox-apex \\
    python3 /tmp/verlbox-apex/apex_build.py /tmp/verlbox-apex/plan.json /tmp/verlbox-apex/{{ c.archive_name | q }} /wheels \\
    && mkdir -p /wheels/build-record && cp /opt/verlbox/build-record/*.json /wheels/build-record/
{%- endmacro %}
{% macro final(c, plan) -%}
# the source record goes into Apex's dist-info: smoke compares its commit with the recipe's; the wheel's
# sha256 into the build record, which `verlbox lock` pins (an offline build then takes that wheel only)
{{ m.RUN(plan) }} --mount=type=bind,from=apex-build,source=/wheels,target=/tmp/apex-wheels \\
    --mount=type=bind,source=verlbox-build/compiled.py,target=/tmp/verlbox/compiled.py \\
    pip install --no-cache-dir --no-deps /tmp/apex-wheels/*.whl \\
    && python3 /tmp/verlbox/compiled.py apex /tmp/apex-wheels \\
    && mkdir -p /opt/verlbox/build-record/builder && cp /tmp/apex-wheels/build-record/apex-* /opt/verlbox/build-record/builder/ \\
    && cp /tmp/apex-wheels/verlbox-source.json "$(python -c 'import importlib.metadata as m; print(m.distribution("apex")._path)')/"
{%- endmacro %}
"""
