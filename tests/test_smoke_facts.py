"""Facts the smoke checks print, from numbers torch gives."""

from __future__ import annotations

import pytest

from verlbox.runtime.smoke import cudnn_version


@pytest.mark.parametrize(("number", "version"), [(90100, "9.1.0"), (90800, "9.8.0"), (8907, "8.9.7"), (8600, "8.6.0")])
def test_cudnn_s_version_integer_reads_as_its_release(number: int, version: str) -> None:
    """cuDNN 9 counts its major version in 10000s, cuDNN 8 in 1000s (cudnn_version.h of each)."""
    assert cudnn_version(number) == version
