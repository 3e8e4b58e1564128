"""Exit codes from one table (errors.EXIT_CODES): the README's table is that one, every error class carries a
code of it, and bad input is 2 wherever it comes from, a run folder's VERLBOX_GPUS included."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox import errors
from verlbox.errors import BAD_INPUT, EXIT_CODES, MissingImage, UsageError, VerlboxError
from verlbox.host.runs.settings import check_gpu_count


def readme_exit_codes() -> list[tuple[str, str]]:
    """The rows of the README's table under "### Exit codes", as written."""
    section = (REPO / "README.md").read_text().split("\n### Exit codes\n", 1)[1]
    lines = section.strip().split("\n\n", 1)[0].splitlines()
    assert lines[:2] == ["| code | meaning |", "|---|---|"], lines[:2]
    rows = []
    for line in lines[2:]:
        code, meaning = line.removeprefix("| ").removesuffix(" |").split(" | ", 1)
        rows.append((code, meaning))
    return rows


def test_the_readme_table_is_the_table_in_errors_py() -> None:
    assert readme_exit_codes() == list(EXIT_CODES)


def test_every_error_class_exits_with_a_code_of_the_table() -> None:
    listed = {code for code, _ in EXIT_CODES}
    classes = [value for _, value in inspect.getmembers(errors, inspect.isclass) if issubclass(value, VerlboxError)]
    assert {cls.__name__ for cls in classes} >= {"UsageError", "RecipeError", "MissingImage", "BuildError"}
    for cls in classes:
        assert str(cls.exit_code) in listed, cls.__name__
    # a missing image is bad input as a missing label is: the same code, one rule
    assert MissingImage.exit_code == UsageError.exit_code == BAD_INPUT


def test_the_interrupt_code_is_the_table_s() -> None:
    assert f"{errors.INTERRUPTED} Ctrl-C" in dict(EXIT_CODES)[f"{errors.SIGNALLED} + N"]


# --- VERLBOX_GPUS: compose decodes it; verlbox names it first ---


@pytest.mark.parametrize("value", ["1", "2", "16", "all", ""])
def test_gpu_counts_compose_takes_pass(tmp_path: Path, value: str) -> None:
    (tmp_path / ".env").write_text(f"VERLBOX_GPUS={value}\n")
    check_gpu_count(tmp_path, {})


@pytest.mark.parametrize(
    "value", ["two", "0", "-1", "1.5", "ALL", "\uff12"]
)  # the last: a full-width 2, a digit to str.isdigit
def test_a_bad_gpu_count_in_the_env_file_is_bad_input_naming_it(tmp_path: Path, value: str) -> None:
    (tmp_path / ".env").write_text(f"VERLBOX_GPUS={value}\n")
    with pytest.raises(UsageError) as refused:
        check_gpu_count(tmp_path, {})
    assert str(refused.value) == (
        f"VERLBOX_GPUS={value!r} (from {tmp_path / '.env'}): expected how many GPUs train reserves, a whole number "
        ">= 1, or `all`"
    )
    assert refused.value.exit_code == BAD_INPUT


def test_the_environment_wins_over_the_env_file_as_in_compose(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("VERLBOX_GPUS=two\n")
    check_gpu_count(tmp_path, {"VERLBOX_GPUS": "2"})
    check_gpu_count(tmp_path, {"VERLBOX_GPUS": ""})  # set and empty: compose's ${VERLBOX_GPUS:-1}
    (tmp_path / ".env").write_text("VERLBOX_GPUS=2\n")
    with pytest.raises(UsageError, match=r"^VERLBOX_GPUS='two' \(from the environment\): expected"):
        check_gpu_count(tmp_path, {"VERLBOX_GPUS": "two"})


def test_verlbox_shell_refuses_a_bad_gpu_count_with_exit_2_before_compose(tmp_path: Path) -> None:
    """Before, compose's decoding error ("services[ray-worker].deploy...count: invalid value") came out as exit 1."""
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=verlbox-test/absent:never\nVERLBOX_GPUS=two\n")
    for environment in ({}, {"VERLBOX_GPUS": "two"}):
        result = run_verlbox("shell", "--no-gpu", "--", "true", cwd=tmp_path, env=environment)
        where = "the environment" if environment else str(tmp_path / ".env")
        assert (result.returncode, result.stderr.strip()) == (
            BAD_INPUT,
            f"verlbox: error: VERLBOX_GPUS='two' (from {where}): expected how many GPUs train reserves, a whole "
            "number >= 1, or `all`",
        )
