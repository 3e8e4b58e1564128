"""Facts the smoke checks print, from numbers torch gives."""

from __future__ import annotations

import pytest

from verlbox.runtime.checks.smoke import cudnn_version


@pytest.mark.parametrize(("number", "version"), [(90100, "9.1.0"), (90800, "9.8.0"), (8907, "8.9.7"), (8600, "8.6.0")])
def test_cudnn_s_version_integer_reads_as_its_release(number: int, version: str) -> None:
    """cuDNN 9 counts its major version in 10000s, cuDNN 8 in 1000s (cudnn_version.h of each)."""
    assert cudnn_version(number) == version


def test_a_long_detail_wraps_in_its_cell_and_is_never_cut_short() -> None:
    """Piped (80 columns, no terminal), the table used to end a long detail with an ellipsis."""
    import io

    from rich.console import Console

    from verlbox.runtime.checks.smoke import CheckResult
    from verlbox.runtime.commands import print_results

    detail = "apex 25.04 compiled for sm_61; " + "torch loads cuDNN 9.1.0 from pip's nvidia-cudnn-cu12 9.1.0.70 " * 3
    buffer = io.StringIO()
    print_results([CheckResult("cpu", "pins match the recipe", "passed", detail)], Console(file=buffer, width=80))
    cells = "".join(line.split("\u2502")[4] for line in buffer.getvalue().splitlines() if line.startswith("\u2502"))
    assert "\u2026" not in buffer.getvalue() and " ".join(cells.split()) == " ".join(detail.split())


def test_the_placed_record_is_not_read_as_a_build_step() -> None:
    """`verlbox lock` reads every *.json of the build record as a step's: placed.json beside it would be a
    step named '' (found by the clean-clone CI)."""
    from verlbox.runtime.steps import build_record, placed

    assert placed.PLACED.parent != build_record.RECORD_DIR and not placed.PLACED.is_relative_to(build_record.RECORD_DIR)
