"""The build context: Dockerfile, image spec, build-env.sh, the lock, and verlbox's own package.

verlbox's package is copied from wherever it is installed (a checkout, an editable install or a
wheel), with a minimal pyproject of its own, so building works the same from all three. The same
plan and package give the same bytes, so the layer cache holds.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from verlbox import paths
from verlbox.host.plan import BuildPlan
from verlbox.host.render import render_dockerfile

_IMAGE_PYPROJECT = """\
# verlbox inside an image: the runtime only needs what the image's runtime step installed.
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "verlbox"
version = "{version}"
requires-python = ">=3.10"

[project.scripts]
verlbox = "verlbox.cli:main"

[tool.setuptools.packages.find]
include = ["verlbox*"]

[tool.setuptools.package-data]
"*" = ["*.yaml", "*.j2", "*.sh", "memcap/*.py", "profiles/*.yaml", "templates/*"]
"""


def write_context(plan: BuildPlan, directory: Path) -> Path:
    (directory / "Dockerfile").write_text(render_dockerfile(plan))
    (directory / "build-env.sh").write_text(
        resources.files("verlbox.host").joinpath("templates", "build-env.sh").read_text()
    )
    if plan.lock_text:
        (directory / "constraints.txt").write_text(plan.lock_text)
    (directory / "image-spec.json").write_text(plan.recipe.image_spec().model_dump_json(indent=2) + "\n")
    source = directory / "verlbox-src"
    source.mkdir()
    (source / "pyproject.toml").write_text(_IMAGE_PYPROJECT.format(version=plan.verlbox_version))
    shutil.copytree(
        paths.PACKAGE_DIR, source / "verlbox", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "shipped")
    )
    return directory
