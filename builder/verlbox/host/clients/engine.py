"""The local Docker engine through the docker SDK: is it up, inspect, tag, untag."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from typing import Any

from verlbox.errors import MissingImage, VerlboxError
from verlbox.host.clients.reference import ImageReference


class EngineError(VerlboxError):
    pass


def client() -> Any:
    import docker  # here, not at the top: lock.py needs only the CLI, and images have no docker SDK

    try:
        engine = docker.from_env()
        engine.ping()
    except docker.errors.DockerException as exc:
        raise EngineError(f"no Docker engine answers ({exc}); start dockerd or set DOCKER_HOST") from None
    return engine


def require_cli() -> str:
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise EngineError("the docker command-line client is not on PATH")
    return docker_cli


def docker_output(*args: str) -> str:
    """What a docker CLI command prints; its error output, shortened, when it fails."""
    run = subprocess.run([require_cli(), *args], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise EngineError(f"docker {' '.join(args[:4])} failed: {run.stderr.strip()[-1000:]}")
    return run.stdout


def require_image(reference: str, missing_hint: str) -> None:
    """One line when REFERENCE is not on the engine (the CLI would otherwise try a registry, or print its error)."""
    command = [require_cli(), "image", "inspect", "--format", "{{.Id}}", reference]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode == 0:
        return
    if "no such image" in run.stderr.lower():
        raise MissingImage(f"{reference} is not on this engine: {missing_hint}")
    client()  # no engine at all: its own one-line error
    raise EngineError(f"cannot inspect {reference}: {run.stderr.strip().splitlines()[-1][-300:]}")


def image_exists(engine: Any, reference: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        engine.images.get(reference)
    except ImageNotFound:
        return False
    return True


def retag(engine: Any, source: str, targets: list[ImageReference]) -> None:
    """Point every target at source's image, then drop the source tag (the image itself stays)."""
    image = engine.images.get(source)
    for target in targets:
        image.tag(target.repository, target.tag)
    untag(engine, source)


def untag(engine: Any, reference: str) -> None:
    from docker.errors import ImageNotFound

    with contextlib.suppress(ImageNotFound):
        engine.images.remove(reference, noprune=True)
