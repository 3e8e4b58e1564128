"""Emulate a smaller GPU: cap every process's CUDA caching allocator at N GiB.

The cap is set through torch.cuda's own lazy-initialisation queue, so importing torch stays cheap
and CUDA is initialised exactly when the process first uses it, as without the cap.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from verlbox.errors import UsageError
from verlbox.runtime.training.environment import origin

SITECUSTOMIZE_DIR = Path(__file__).parent / "memcap"
VARIABLE = "VERLBOX_GPU_MEMORY_GIB"


def parse_gib(text: str, source: str = VARIABLE, where: str = "") -> float:
    """A positive number of GiB, e.g. '24' or '22.5'; anything else is named (SOURCE, and WHERE it was set) and
    refused."""
    try:
        gib = float(text)
    except ValueError:
        gib = float("nan")
    if not gib > 0 or gib == float("inf"):
        raise UsageError(f"{source}={text!r}{where}: expected a positive number of GiB such as 24 (no unit)")
    return gib


def gib_from_environment(environ: Mapping[str, str]) -> float | None:
    value = environ.get(VARIABLE, "").strip()
    return parse_gib(value, VARIABLE, origin(environ)) if value else None


def _apply(cuda: ModuleType, gib: float) -> None:
    for device in range(cuda.device_count()):
        total = cuda.get_device_properties(device).total_memory
        cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)


class _AfterTorchCudaImport(importlib.abc.MetaPathFinder):
    def __init__(self, gib: float) -> None:
        self.gib = gib

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch.cuda":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        load = loader.exec_module  # type: ignore[attr-defined]
        gib = self.gib

        def exec_module(module: ModuleType) -> None:
            load(module)
            module._lazy_call(lambda: _apply(module, gib))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(gib: float) -> None:
    if "torch.cuda" in sys.modules:
        _apply(sys.modules["torch.cuda"], gib)
    else:
        sys.meta_path.insert(0, _AfterTorchCudaImport(gib))
