"""Run at every Python start while verlbox puts this folder on PYTHONPATH (train --gpu-memory-gib).

Ray starts verl's workers as new processes; this is the one place they all pass through.
"""

import os

if os.environ.get("VERLBOX_GPU_MEMORY_GIB"):
    from verlbox.memory_cap import install

    install(float(os.environ["VERLBOX_GPU_MEMORY_GIB"]))
