"""A registry's own bytes of an image index or manifest, by digest, through `docker buildx imagetools`.

buildx is the client the user already has: it reads their `docker login`s and credential helpers, answers a
registry's Bearer challenge, and speaks plain HTTP to a registry on localhost or 127.0.0.1 (as Docker does).
"""

from __future__ import annotations

import subprocess

from verlbox.errors import VerlboxError
from verlbox.host.clients.engine import require_cli

# a registry that does not answer is a failure, not a hang: the bundle is made again later
FETCH_TIMEOUT_S = 120


class RegistryError(VerlboxError):
    pass


def raw_manifest(repository: str, digest: str) -> bytes:
    """The bytes REPOSITORY@DIGEST names (an index, a manifest list or a manifest), exactly as the registry
    serves them: `--raw` prints them unchanged, so their sha256 is the digest."""
    reference = f"{repository}@{digest}"
    command = [require_cli(), "buildx", "imagetools", "inspect", "--raw", reference]
    try:
        run = subprocess.run(command, capture_output=True, check=False, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RegistryError(f"{reference}: the registry did not answer in {FETCH_TIMEOUT_S} s") from None
    if run.returncode != 0:
        said = run.stderr.decode(errors="replace").strip().splitlines() or ["no error output"]
        raise RegistryError(
            f"{reference}: `docker buildx imagetools inspect` failed ({said[-1][-300:]}); "
            "a private registry needs `docker login` first"
        )
    return run.stdout
