"""The two sides: the image side never imports the host side, and verlbox works from a plain wheel."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "builder" / "verlbox"
# what the image side may import from verlbox: itself and the shared leaves
SHARED = {"verlbox", "verlbox.errors", "verlbox.files", "verlbox.dotenv", "verlbox.run_folder"}


def verlbox_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("verlbox")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("verlbox"):
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "runtime").rglob("*.py")), ids=str
)
def test_the_image_side_never_imports_the_host_side(module: str) -> None:
    imports = verlbox_imports(PACKAGE / module)
    foreign = {name for name in imports if not (name.startswith("verlbox.runtime") or name in SHARED)}
    assert foreign == set(), f"{module} imports {foreign}"


def test_image_commands_load_neither_jinja_nor_docker_nor_the_host_side() -> None:
    probe = (
        "import sys; from verlbox import cli; import verlbox.runtime.commands, verlbox.runtime.train, "
        "verlbox.runtime.smoke, verlbox.runtime.preflight, verlbox.runtime.data; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('jinja2', 'docker') or m.startswith('verlbox.host')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_plain_install_finds_recipes_and_renders_from_any_folder(wheel_venv: Path, tmp_path: Path) -> None:
    verlbox = wheel_venv / "bin" / "verlbox"
    listed = subprocess.run([verlbox, "recipes"], cwd=tmp_path, capture_output=True, text=True, env={"COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert "p40-cu124" in listed.stdout and "2.6.0+cu118" in listed.stdout
    rendered = subprocess.run([verlbox, "render", "p40"], cwd=tmp_path, capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == (REPO / "dockerfiles" / "p40.Dockerfile").read_text()
    # the installed package is a copy: nothing of the checkout is on its path
    where = subprocess.run(
        [wheel_venv / "bin" / "python", "-c", "import verlbox.paths as p; print(p.shipped_root())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(REPO) not in where.stdout and "site-packages" in where.stdout
