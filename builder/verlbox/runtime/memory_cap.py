"""A stable name: compose.yaml's cluster services put `verlbox.runtime.memory_cap.SITECUSTOMIZE_DIR` on
PYTHONPATH, and run folders written by earlier releases name it too. The code is training/memory_cap.py."""

from verlbox.runtime.training.memory_cap import SITECUSTOMIZE_DIR

__all__ = ["SITECUSTOMIZE_DIR"]
