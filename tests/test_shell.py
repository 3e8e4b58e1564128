"""`verlbox shell` hands over to `docker compose run` on the train service (the exec is the faked boundary)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO
from verlbox import cli


class Exec(BaseException):  # not an Exception: the CLI turns those into one-line errors
    pass


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, object]:
    seen: dict[str, object] = {}

    def fake_execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
        seen.update(file=file, args=args, env=env)
        raise Exec

    monkeypatch.setattr(os, "execvpe", fake_execvpe)
    monkeypatch.chdir(tmp_path)
    for variable in ("VERLBOX_IMAGE", "VERLBOX_UID", "VERLBOX_GID"):
        monkeypatch.delenv(variable, raising=False)
    return seen


def run(*argv: str) -> None:
    with pytest.raises(Exec):
        cli.main(["shell", *argv])


def test_interactive_shell_uses_the_train_service_in_the_users_folder(captured: dict, tmp_path: Path) -> None:
    run("p40-cu124")
    args = captured["args"]
    compose = ["compose", "-f", str(REPO / "compose.yaml"), "--project-directory", str(tmp_path), "run", "--rm"]
    assert args[1:] == [*compose, "--entrypoint", "bash", "train"]
    env = captured["env"]
    assert env["VERLBOX_IMAGE"] == "verlbox/p40-cu124:0.1.0"
    assert (env["VERLBOX_UID"], env["VERLBOX_GID"]) == (str(os.getuid()), str(os.getgid()))


def test_one_command_after_the_double_dash(captured: dict) -> None:
    run("p40", "--", "python", "-V")
    assert captured["args"][7:] == ["--rm", "--entrypoint", "python", "train", "-V"]
    assert captured["env"]["VERLBOX_IMAGE"] == "verlbox/p40:0.1.0"


def test_one_command_with_an_image_and_no_recipe(captured: dict) -> None:
    run("--image", "mine:1", "--", "nvidia-smi", "-L")
    assert captured["args"][7:] == ["--rm", "--entrypoint", "nvidia-smi", "train", "-L"]
    assert captured["env"]["VERLBOX_IMAGE"] == "mine:1"


def test_without_a_recipe_the_dotenv_decides(captured: dict, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=verlbox/p40-cu124:0.1.0\nVERLBOX_UID=1234\n")
    (tmp_path / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    run()
    env = captured["env"]
    # compose reads .env itself; a variable verlbox exported would win over it, so none is exported
    assert "VERLBOX_IMAGE" not in env and "VERLBOX_UID" not in env
    assert env["VERLBOX_GID"] == str(os.getgid())
    assert captured["args"][3] == str(tmp_path / "compose.yaml")  # the folder's own compose file wins
