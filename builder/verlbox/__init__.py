"""verlbox: reproducible images for verl RL post-training on old GPUs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("verlbox")
except PackageNotFoundError:  # running from a source tree that was not pip-installed
    __version__ = "0.1.0"
