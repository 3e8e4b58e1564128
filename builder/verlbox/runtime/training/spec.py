"""The image spec: what the image side knows about the recipe it was built from.

The host side writes it from a validated recipe into every image (/opt/verlbox/image-spec.json);
train, preflight and smoke read it. It holds versions and GPU targets, never a URL or a path of the
machine that built the image.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import UsageError

SPEC_VARIABLE = "VERLBOX_IMAGE_SPEC"


class ImageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    recipe_hash: str
    target_gpus: list[str]
    cuda: str
    verl: str
    profile: str
    vllm_kernels_for: list[str] | None = None
    apex_commit: str | None = None
    pins: dict[str, str]
    # the lock a locked build installed from (its io.verlbox.lock.hash label): train records it per run
    lock_hash: str | None = None


def read_spec(path: Path) -> ImageSpec:
    try:
        return ImageSpec.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise UsageError(f"{path}: not a verlbox image spec ({' '.join(str(exc).split())[:300]})") from None


def baked_spec() -> ImageSpec | None:
    """The spec of the image this process runs in, if it runs in one."""
    location = os.environ.get(SPEC_VARIABLE)
    return read_spec(Path(location)) if location else None
