"""A base image made locally with debootstrap + docker import, for hosts that reach no registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

from rich.console import Console

from verlbox.engine import image_exists
from verlbox.errors import VerlboxError
from verlbox.recipe import Bootstrap


def bootstrapped_reference(bootstrap: Bootstrap) -> str:
    return f"verlbox-base/debian:{bootstrap.suite}-{bootstrap.variant}"


def ensure_bootstrapped_base(engine: Any, bootstrap: Bootstrap, console: Console) -> str:
    reference = bootstrapped_reference(bootstrap)
    if image_exists(engine, reference):
        return reference
    if shutil.which("debootstrap") is None:
        raise VerlboxError("--bootstrap-base needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise VerlboxError("--bootstrap-base runs debootstrap, which needs root")
    with (
        tempfile.TemporaryDirectory(prefix="verlbox-rootfs-") as root,
        console.status(f"debootstrap {bootstrap.suite} ({bootstrap.variant}) -> {reference}"),
    ):
        result = subprocess.run(
            ["debootstrap", f"--variant={bootstrap.variant}", bootstrap.suite, root, bootstrap.mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise VerlboxError(f"debootstrap {bootstrap.suite} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", reference], stdin=tar.stdout, capture_output=True, text=True, check=False
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise VerlboxError(f"docker import of the {bootstrap.suite} root failed: {imported.stderr.strip()}")
    console.print(f"made base image {reference} with debootstrap")
    return reference
