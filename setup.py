"""Copies the shipped recipes, rendered Dockerfiles and compose.yaml into the wheel.

They live at the top of the repository (where users and reviewers look for them); a wheel has
no repository around it, so they travel as package data under verlbox/shipped (see verlbox.paths).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "verlbox" / "shipped"
        for folder in ("recipes", "dockerfiles"):
            shutil.copytree(folder, target / folder, dirs_exist_ok=True)
        for name in ("compose.yaml", ".env.example"):
            shutil.copy2(name, target / name)


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
