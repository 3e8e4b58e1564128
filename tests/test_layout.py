"""The two sides: the image side never imports the host side, and verlbox works from a plain wheel."""

from __future__ import annotations

import ast
import graphlib
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
        "import sys; from verlbox import cli; import verlbox.runtime.commands, verlbox.runtime.training.train, "
        "verlbox.runtime.checks.smoke, verlbox.runtime.training.preflight, verlbox.runtime.training.data; "
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


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every verlbox module PATH imports anywhere (top level, in a function, under TYPE_CHECKING): `from
    verlbox.runtime import progress` counts as verlbox.runtime.training.progress where that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known}


def test_no_module_imports_itself_through_others() -> None:
    """No import circles on either side, type-only imports included: each module can be read, and moved,
    after the ones it uses (a circle was build -> bundle -> build, and plan <-> render)."""
    files = {_module_of(path): path for path in PACKAGE.rglob("*.py")}
    graph = {module: _imported_modules(path, set(files)) - {module} for module, path in files.items()}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"an import circle: {' -> '.join(error.args[1])}")


# Folders by job (ARCHITECTURE.md): each may import only the folders listed, on its own side; a module at a
# side's top (host/commands.py, runtime/commands.py: the commands' glue; runtime/gpu.py, a shared table) is
# outside the rule, and the host side may import the image side's modules (never the reverse)
FOLDER_RULES = {
    "host.clients": set(),
    "host.recipes": {"host.clients"},
    "host.building": {"host.recipes", "host.clients"},
    "host.trust": {"host.building", "host.recipes", "host.clients"},
    "host.runs": {"host.trust", "host.building", "host.recipes", "host.clients"},
    "runtime.steps": set(),
    "runtime.training": {"runtime.steps"},
    "runtime.checks": {"runtime.training", "runtime.steps"},
}


def _folder(module: str) -> str | None:
    return next((folder for folder in FOLDER_RULES if module.startswith(f"verlbox.{folder}.")), None)


def test_folders_import_only_the_folders_below_them() -> None:
    files = {_module_of(path): path for path in PACKAGE.rglob("*.py")}
    assert set(FOLDER_RULES) <= {_folder(module) for module in files}, "a folder of the rule is gone"
    for module, path in files.items():
        mine = _folder(module)
        if mine is None:
            assert module.count(".") <= 2, f"{module}: a module below a side belongs in one of its folders"
            continue
        side = mine.split(".")[0]
        for used in _imported_modules(path, set(files)):
            theirs = _folder(used)
            if used.startswith(f"verlbox.{side}.commands"):
                pytest.fail(f"{module} imports {used}: the commands' glue imports folders, not the reverse")
            if theirs and theirs != mine and theirs.split(".")[0] == side:
                assert theirs in FOLDER_RULES[mine], f"{module} imports {used}: {mine}/ may import {FOLDER_RULES[mine]}"
