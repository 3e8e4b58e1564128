"""The local Docker engine through the docker SDK: is it up, inspect, tag, untag, remove."""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

from verlbox.errors import VerlboxError


class EngineError(VerlboxError):
    pass


def client() -> Any:
    try:
        import docker
    except ImportError:
        raise EngineError("the docker SDK is missing: pip install 'verlbox[host]'") from None
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


def image_exists(engine: Any, reference: str) -> bool:
    import docker

    try:
        engine.images.get(reference)
    except docker.errors.ImageNotFound:
        return False
    return True


def retag(engine: Any, source: str, targets: list[str]) -> None:
    """Point every target at source's image, then drop the source tag (the image itself stays)."""
    image = engine.images.get(source)
    for target in targets:
        repository, _, tag = target.rpartition(":")
        image.tag(repository, tag)
    untag(engine, source)


def untag(engine: Any, reference: str) -> None:
    import docker

    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.images.remove(reference, noprune=True)
