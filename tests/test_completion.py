"""`verlbox completion`: the scripts it prints complete in a real bash (and load in a real zsh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.cli import HANDLERS
from verlbox.host.recipes.recipe import recipe_names

BASH = shutil.which("bash")


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_verlbox("completion", "bash")
    assert result.returncode == 0, result.stderr
    path = tmp_path_factory.mktemp("completion") / "verlbox.bash"
    path.write_text(result.stdout)
    return path


def complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What Tab offers at the end of LINE: the registered function run as bash runs it (COMP_WORDS, COMP_CWORD)."""
    words = line.split(" ")  # a trailing space: an empty word being completed
    program = (
        f"source {script}\n"
        'function=$(complete -p verlbox | sed -n "s/.*-F \\([^ ]*\\) verlbox$/\\1/p")\n'
        '[ -n "$function" ] || { echo "verlbox has no completion function" >&2; exit 3; }\n'
        'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMPREPLY=()\n'
        '"$function" verlbox "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    assert BASH is not None
    result = subprocess.run(
        [BASH, "--norc", "-c", program, "bash", *words], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stderr
    return [word for word in result.stdout.splitlines() if word]


def test_the_script_registers_a_function_for_verlbox(bash_script: Path) -> None:
    assert BASH is not None
    result = subprocess.run(
        [BASH, "--norc", "-c", f"source {bash_script} && complete -p verlbox"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.strip() == "complete -F _verlbox verlbox", result.stderr


def test_commands_complete_from_the_parser(bash_script: Path) -> None:
    assert complete(bash_script, "verlbox bui") == ["build"]
    assert complete(bash_script, "verlbox bu") == ["build", "bundle"]
    every = complete(bash_script, "verlbox ")
    assert set(HANDLERS) <= set(every) and {"--help", "--version"} <= set(every)


def test_options_values_and_recipes(bash_script: Path) -> None:
    assert complete(bash_script, "verlbox build ") == recipe_names()
    assert complete(bash_script, "verlbox build p40-cu124 --pro") == ["--progress"]
    assert complete(bash_script, "verlbox build p40-cu124 --progress ") == ["auto", "plain"]
    assert complete(bash_script, "verlbox verify --recipe p40-") == ["p40-cu124"]
    assert complete(bash_script, "verlbox clean --") == ["--help", "--yes", "--images", "--all-build-cache", "--run"]
    assert complete(bash_script, "verlbox completion ") == ["bash", "zsh"]
    assert complete(bash_script, "verlbox fetch ") == ["model", "data"]
    # an option's value is not counted as a positional: the recipe is still the first one
    assert complete(bash_script, "verlbox build --tag mine:1 p40-c") == ["p40-cu124"]
    # free text (a tag, an override) is offered nothing
    assert complete(bash_script, "verlbox build --tag ") == []
    assert complete(bash_script, "verlbox overrides p40-cu124 ") == []


def test_a_recipe_that_looks_like_a_path_completes_as_a_file(bash_script: Path, tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("")
    assert complete(bash_script, "verlbox build ./mi", cwd=tmp_path) == ["./mine.yaml"]


def test_the_zsh_script_is_valid_and_registers_for_verlbox(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:  # CI installs it (.ci/install-docker.sh): there this never skips
        if os.environ.get("CI"):
            pytest.fail("CI installs zsh for this test")
        pytest.skip("no zsh on this host")
    result = run_verlbox("completion", "zsh")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#compdef verlbox\n")
    (tmp_path / "_verlbox").write_text(result.stdout)
    syntax = subprocess.run(["zsh", "-n", str(tmp_path / "_verlbox")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    program = f"fpath=({tmp_path} $fpath); autoload -U compinit && compinit -u -D; print -r -- $_comps[verlbox]"
    loaded = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True)
    assert loaded.stdout.strip() == "_verlbox", loaded.stderr
    for name in recipe_names():
        assert name in result.stdout
