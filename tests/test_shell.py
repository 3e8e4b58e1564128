"""`verlbox shell` hands over to `docker compose run` on the train service (the exec is the faked boundary)."""

from __future__ import annotations

import os

import pytest

from conftest import REPO
from verlbox import cli


class Exec(Exception):
    pass


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    seen: dict[str, object] = {}

    def fake_execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
        seen.update(file=file, args=args, env=env)
        raise Exec

    monkeypatch.setattr(os, "execvpe", fake_execvpe)
    return seen


def run(*argv: str) -> None:
    with pytest.raises(Exec):
        cli.main(["shell", *argv])


def test_interactive_shell_uses_the_train_service_as_the_user(captured: dict[str, object]) -> None:
    run("p40-cu124")
    args = captured["args"]
    assert args[1:] == ["compose", "-f", str(REPO / "compose.yaml"), "run", "--rm", "--entrypoint", "bash", "train"]
    env = captured["env"]
    assert env["VERLBOX_IMAGE"] == "verlbox/p40-cu124:0.1.0"
    assert (env["VERLBOX_UID"], env["VERLBOX_GID"]) == (str(os.getuid()), str(os.getgid()))


def test_one_command_after_the_double_dash(captured: dict[str, object]) -> None:
    run("p40", "--", "python", "-V")
    assert captured["args"][5:] == ["--rm", "--entrypoint", "python", "train", "-V"]
    assert captured["env"]["VERLBOX_IMAGE"] == "verlbox/p40:0.1.0"


def test_one_command_without_a_recipe(captured: dict[str, object]) -> None:
    run("--image", "mine:1", "--", "nvidia-smi", "-L")
    assert captured["args"][5:] == ["--rm", "--entrypoint", "nvidia-smi", "train", "-L"]
    assert captured["env"]["VERLBOX_IMAGE"] == "mine:1"
