"""`verlbox shell`: a shell (or one command) in the image, through compose's `train` service."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from verlbox import paths
from verlbox.host.commands import image_for


def _dotenv_keys(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    lines = (line.strip() for line in path.read_text(errors="replace").splitlines())
    return {line.split("=", 1)[0].strip() for line in lines if "=" in line and not line.startswith("#")}


def shell_command(args: argparse.Namespace, workdir: Path, environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`docker compose run` on the train service, in the user's folder, honouring its .env.

    compose.yaml's `train` service is the one definition of GPU, mounts, user and environment. The
    compose file in the current folder wins over the shipped one; relative mounts and .env are the
    current folder's. A variable the shell or .env already sets is left alone.
    """
    from verlbox.host.engine import require_cli

    compose_file = workdir / "compose.yaml"
    if not compose_file.is_file():
        compose_file = paths.compose_file()
    command = [require_cli(), "compose", "-f", str(compose_file), "--project-directory", str(workdir), "run", "--rm"]
    command += (
        ["--entrypoint", args.one_command[0], "train", *args.one_command[1:]]
        if args.one_command
        else [
            "--entrypoint",
            "bash",
            "train",
        ]
    )
    already = set(environ) | _dotenv_keys(workdir / ".env")
    environment: dict[str, str] = {}
    if args.recipe or args.image:
        environment["VERLBOX_IMAGE"] = image_for(args)
    for variable, value in (("VERLBOX_UID", os.getuid()), ("VERLBOX_GID", os.getgid())):
        if variable not in already:
            environment[variable] = str(value)
    return command, environment


def shell(args: argparse.Namespace) -> int:
    command, environment = shell_command(args, Path.cwd(), dict(os.environ))
    os.execvpe(command[0], command, os.environ | environment)
    return 0  # not reached: exec replaces this process
