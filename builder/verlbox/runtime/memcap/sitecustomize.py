"""Run at every Python start while verlbox puts this folder on PYTHONPATH (train --gpu-memory-gib).

Ray starts verl's workers as new processes; this is the one place they all pass through. `train`
has already checked the value; a bad one set by hand is reported in one line, never a traceback.
"""

import os
import sys

if os.environ.get("VERLBOX_GPU_MEMORY_GIB"):
    from verlbox.errors import UsageError
    from verlbox.runtime.memory_cap import gib_from_environment, install

    try:
        install(gib_from_environment(os.environ) or 0)
    except UsageError as exc:
        print(f"verlbox: GPU memory cap not applied: {exc}", file=sys.stderr)
