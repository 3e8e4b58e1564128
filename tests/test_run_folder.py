"""Which run folder a host command reads (run_folder.py): marks, the .env as compose reads it, the shell's
variables over the .env's, and the folder named as given (a link is not followed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.dotenv import dotenv_values_of
from verlbox.errors import UsageError
from verlbox.run_folder import find_run_folder, is_run_folder

NO_ENGINE = "unix:///nonexistent/docker.sock"


def test_a_run_folder_is_marked_by_compose_init_or_verlbox_s_keys_not_any_env(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("DATABASE_URL=postgres://x\n")  # another project's .env
    assert not is_run_folder(tmp_path) and find_run_folder(None, tmp_path) is None
    (tmp_path / ".env").write_text("VERLBOX_IMAGE=verlbox/p40:0.1.0\n")
    assert is_run_folder(tmp_path)
    with pytest.raises(UsageError, match=r"^--run .*nowhere: no such folder"):
        find_run_folder(str(tmp_path / "nowhere"))


def test_the_env_is_read_as_compose_reads_it() -> None:
    values = dotenv_values_of(
        "# a comment\nVERLBOX_CHECKPOINTS='/mnt/a b'\nVERLBOX_DATA=./data # where GSM8K goes\n"
        'export VERLBOX_MODELS="./m"\nHF_TOKEN=abc#def\n'
    )
    assert values == {
        "VERLBOX_CHECKPOINTS": "/mnt/a b",
        "VERLBOX_DATA": "./data",
        "VERLBOX_MODELS": "./m",
        "HF_TOKEN": "abc#def",
    }


def test_the_shell_wins_over_the_env_and_a_linked_folder_keeps_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / ".env").write_text("VERLBOX_CHECKPOINTS=./ck\nVERLBOX_MODEL_NAME=small\n")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    monkeypatch.delenv("VERLBOX_CHECKPOINTS", raising=False)
    monkeypatch.delenv("VERLBOX_MODEL_NAME", raising=False)
    run = find_run_folder(str(tmp_path / "link"))
    assert run is not None and run.path == tmp_path / "link"  # compose names the project after the link
    assert run.checkpoints == tmp_path / "link" / "ck" and run.fetch_target("model").name == "small"
    monkeypatch.setenv("VERLBOX_CHECKPOINTS", "/elsewhere")
    assert run.checkpoints == Path("/elsewhere")


def test_fetch_and_runs_say_what_they_need_where_the_rule_finds_nothing(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("VERLBOX_MODEL_REPO=\n")
    other = run_verlbox("fetch", "model", "--repo", "someone/other", cwd=tmp_path)
    assert other.returncode == 2 and other.stderr.splitlines()[-1] == (
        "verlbox: error: --repo someone/other: the run folder's model folder holds VERLBOX_MODEL_REPO "
        "(Qwen/Qwen2.5-0.5B-Instruct); give --out DIR, or set VERLBOX_MODEL_REPO in its .env"
    )
    assert not (tmp_path / "models").exists()
    in_image = run_verlbox("fetch", "data", cwd=tmp_path, env={"VERLBOX_IMAGE_SPEC": os.devnull})
    assert in_image.returncode == 2 and "train reads /models/NAME and /data/gsm8k-raw" in in_image.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    runs = run_verlbox("runs", cwd=empty)
    assert runs.returncode == 2 and runs.stderr.strip() == (
        f"verlbox: error: no run folder here ({empty} has no .env or compose.yaml) and no ./checkpoints: give a "
        "checkpoints FOLDER, or --run DIR"
    )


def test_the_checkout_is_no_run_folder_and_run_names_the_command_that_makes_one() -> None:
    assert not is_run_folder(REPO) and find_run_folder(None, REPO) is None
    with pytest.raises(UsageError) as caught:
        find_run_folder(str(REPO))
    assert str(caught.value) == (
        f"--run {REPO}: verlbox's source tree, not a run folder (its compose.yaml is init's template): "
        "`verlbox init ~/run` makes one"
    )


def test_init_refuses_the_checkout_and_a_folder_inside_a_run_folder_s_folders(tmp_path: Path) -> None:
    checkout = tmp_path / "verlbox"  # a checkout as init tells one: its own compose.yaml and source
    (checkout / "builder" / "verlbox").mkdir(parents=True)
    for name in ("compose.yaml", "builder/verlbox/cli.py"):
        shutil.copy(REPO / name, checkout / name)
    for where in (checkout, checkout / "builder"):
        refused = run_verlbox("init", "--image", "mine/p40:1", cwd=where, env={"DOCKER_HOST": NO_ENGINE})
        tree = "verlbox's source tree" if where == checkout else f"inside verlbox's source tree {checkout}"
        assert refused.returncode == 2 and refused.stderr.strip() == (
            f"verlbox: error: . is {tree}: make the run folder outside it, e.g. `verlbox init ~/run`"
        )
    assert sorted(path.name for path in checkout.rglob("*")) == ["builder", "cli.py", "compose.yaml", "verlbox"]
    made = run_verlbox("init", "run", "--image", "mine/p40:1", cwd=tmp_path, env={"DOCKER_HOST": NO_ENGINE})
    assert made.returncode == 0, made.stderr
    nested = run_verlbox("init", "inner", "--image", "mine/p40:1", cwd=tmp_path / "run" / "models")
    assert nested.returncode == 2 and nested.stderr.strip() == (
        f"verlbox: error: inner is inside the run folder {tmp_path / 'run'} (its VERLBOX_MODELS, "
        f"{tmp_path / 'run' / 'models'}): a run folder there would be mounted into that run; "
        f"`verlbox init {tmp_path / 'inner'}` makes one beside it"
    )
    assert not (tmp_path / "run" / "models" / "inner").exists()
    beside = run_verlbox("init", "other", "--image", "mine/p40:1", cwd=tmp_path / "run", env={"DOCKER_HOST": NO_ENGINE})
    assert beside.returncode == 0, beside.stderr  # in a run folder, outside its bound folders: allowed
