"""Run at every Python start while verlbox puts this folder on PYTHONPATH (train --gpu-memory-gib).

Ray starts verl's workers as new processes; this is the one place they all pass through. `train`
has already checked the value; a bad one set by hand is reported in one line, never a traceback.

Being first on PYTHONPATH, this module hides every other `sitecustomize` (the user's, or the
distribution's such as Debian's /usr/lib/python3.x/sitecustomize.py): after the cap it runs the next
one on sys.path, once. Only the standard library is used for that, so the chain works in any Python
that inherits this PYTHONPATH, verlbox installed or not.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _apply_cap() -> None:
    if not os.environ.get("VERLBOX_GPU_MEMORY_GIB"):
        return
    from verlbox.errors import UsageError
    from verlbox.runtime.training.memory_cap import gib_from_environment, install

    try:
        install(gib_from_environment(os.environ) or 0)
    except UsageError as exc:
        print(f"verlbox: GPU memory cap not applied: {exc}", file=sys.stderr)


def _run_next_sitecustomize() -> None:
    """Import the `sitecustomize` Python would have found without this folder.

    It becomes sys.modules["sitecustomize"], as if Python had imported it itself. Its errors propagate
    unchanged into site.execsitecustomize, which prints them exactly as for any sitecustomize (one line,
    the traceback under PYTHONVERBOSE) and goes on starting Python."""
    here = os.path.realpath(os.path.dirname(__file__))
    resolved = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    after = resolved.index(here) + 1 if here in resolved else 0
    # this folder may be on the path twice by two names (a link): site drops exact duplicates only
    later = [entry for entry, real in zip(sys.path[after:], resolved[after:], strict=True) if real != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _apply_cap()
finally:
    # the next sitecustomize runs even when the cap could not be (no verlbox in this Python)
    _run_next_sitecustomize()
