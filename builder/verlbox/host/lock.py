"""Lock files: what a recipe's last good build installed, step by step, with hashes.

STEM.lock.json beside the recipe file (always named after the file, whatever `name:` says) holds,
for each install step, the Python files pip installed (name, version, sha256) and the Debian
packages apt installed over the base (name, version), plus the base's identity. Builds of a locked
recipe install each step's slice exactly: `pip install --no-deps --require-hashes` and
`apt-get install name=version`. `verlbox lock` writes it from a built image's own build record;
`verlbox verify` compares an image with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.host.engine import docker_output
from verlbox.runtime.build_record import requirement_lines

LOCK_FORMAT = 1


Entries = list[dict[str, str]]


class LockStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    stage: Literal["final", "builder"]  # a builder stage's packages never reach the image
    pip: Entries = []
    apt: Entries = []


class Lock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = LOCK_FORMAT
    recipe: str
    recipe_hash: str
    base: dict[str, Any]
    steps: list[LockStep]  # in build order: a later step may replace what an earlier one installed
    # the date every file and history entry of an offline (bundle) build is clamped to: the locked build's
    source_date_epoch: int | None = None

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def step(self, name: str) -> LockStep | None:
        return next((step for step in self.steps if step.name == name), None)

    def slice(self, name: str, kind: str, by_version: bool = False) -> str | None:
        step = self.step(name)
        entries = getattr(step, kind) if step else None
        if not entries:
            return None
        if kind == "pip":
            # by_version: a file the lock names by URL is found by name and version (offline, in a folder)
            lines = requirement_lines(
                [{k: v for k, v in e.items() if k != "url"} for e in entries] if by_version else entries
            )
        else:
            lines = [f"{e['name']}={e['version']}" for e in entries]
        return "\n".join(lines) + "\n"

    def packages(self, kind: str) -> dict[str, str]:
        """What the final image holds, by name: the last step that installed a package decides its version."""
        return {e["name"]: e["version"] for step in self.steps if step.stage == "final" for e in getattr(step, kind)}


def read_lock(path: Path) -> Lock:
    try:
        return Lock.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise UsageError(
            f"{path}: not a verlbox lock ({' '.join(str(exc).split())[:300]}); run `verlbox lock`"
        ) from None


def image_records(image: str) -> dict[str, dict[str, Entries]]:
    """The build record an image carries (/opt/verlbox/build-record), read by the image's own Python."""
    output = docker_output("run", "--rm", "--entrypoint", "python", image, "-m", "verlbox.runtime.build_record", "dump")
    return json.loads(output)


def steps_in_build_order(dockerfile: str, records: dict[str, dict[str, Entries]]) -> list[LockStep]:
    """The recorded steps, in the order the Dockerfile runs them (each step names itself when it records).

    A step in a `*-build` stage is a builder step: its packages build something (Apex) and stay there.
    """
    order: list[str] = []
    builder: set[str] = set()
    for stage in re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]:
        name = stage.split("\n", 1)[0].rsplit(" AS ", 1)[-1]
        for step in re.findall(r"verlbox_(?:pip|apt_end) ([a-z0-9-]+)", stage):
            order.append(step)
            if name.endswith("-build"):
                builder.add(step)
    steps = []
    for name, kinds in records.items():
        if name not in order:
            raise VerlboxError(f"the image records a step {name!r} this recipe's Dockerfile does not have")
        steps.append(LockStep(name=name, stage="builder" if name in builder else "final", **kinds))
    return sorted(steps, key=lambda step: order.index(step.name))


def image_created(image: str) -> int:
    """The image's creation time in whole seconds (Docker prints it as RFC 3339 with nanoseconds)."""
    created = docker_output("image", "inspect", "--format", "{{.Created}}", image).strip()
    return int(datetime.strptime(created[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp())


def image_labels(image: str) -> dict[str, str]:
    return json.loads(docker_output("image", "inspect", "--format", "{{json .Config.Labels}}", image)) or {}


def base_identity(reference: str) -> dict[str, Any]:
    """A base by registry digest where it has one; a local base (debootstrap) by image ID and packages."""
    inspected = json.loads(docker_output("image", "inspect", reference))[0]
    identity: dict[str, Any] = {"reference": reference, "image_id": inspected["Id"]}
    if inspected.get("RepoDigests"):
        identity["digest"] = inspected["RepoDigests"][0]
    else:
        packages = docker_output(
            "run", "--rm", "--entrypoint", "dpkg-query", reference, "-W", "-f", "${Package}=${Version}\\n"
        )
        identity["packages"] = sorted(packages.split())
    return identity


def lock_from_image(recipe_name: str, recipe_hash: str, dockerfile: str, image: str) -> Lock:
    labels = image_labels(image)
    base = labels.get("io.verlbox.base")
    if not base:
        raise VerlboxError(f"{image} carries no io.verlbox.base label: build it with this verlbox first")
    steps = steps_in_build_order(dockerfile, image_records(image))
    return Lock(
        recipe=recipe_name,
        recipe_hash=recipe_hash,
        base=base_identity(base),
        steps=steps,
        source_date_epoch=image_created(image),
    )


def write_lock(path: Path, lock: Lock) -> None:
    write_atomically(path, json.dumps(lock.model_dump(), indent=1) + "\n")
