"""The installed `verlbox` as a new user meets it: exit codes, one line per failure, nothing left behind."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from conftest import docker, run_verlbox
from verlbox import __version__
from verlbox.host.recipes.recipe import load_recipe


def engine_leftovers() -> tuple[set[str], set[str]]:
    containers = set(docker("ps", "-a", "--format", "{{.ID}}").stdout.split())
    networks = set(docker("network", "ls", "--format", "{{.Name}}").stdout.split())
    return containers, networks


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verlbox: error: "), stderr
    return lines[0]


def test_version() -> None:
    result = run_verlbox("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"verlbox {__version__}"


def test_bare_verlbox_shows_its_help() -> None:
    result = run_verlbox()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: verlbox ") and "verlbox doctor" in result.stdout


def test_a_mistyped_command_gets_the_nearest_and_the_host_s_commands() -> None:
    result = run_verlbox("biuld", "p40-cu124")
    line = one_error_line(result.stderr)
    assert result.returncode == 2
    assert line.startswith("verlbox: error: no command 'biuld' (did you mean `verlbox build`?); the commands: ")
    listed = line.split("; the commands: ")[1].removesuffix(" (see `verlbox --help`)").split(", ")
    assert {"build", "init", "doctor", "clean", "fetch"} <= set(listed)
    assert not {"train", "smoke-checks", "prepare-data", "patch-verl", "tensorboard"} & set(listed)


@pytest.mark.parametrize(
    ("words", "abbreviated"),
    [
        (["init", "--imag", "foo", "run"], "--imag"),
        (["build", "p40-cu124", "--chec"], "--chec"),
        (["clean", "--ye"], "--ye"),
        (["fetch", "model", "--ou", "x"], "--ou"),
    ],
    ids=["init", "build", "clean", "fetch"],
)
def test_no_command_takes_an_abbreviated_option(words: list[str], abbreviated: str, tmp_path: Path) -> None:
    """`init --imag foo` was taken as --image: compose then failed on an image nobody meant."""
    result = run_verlbox(*words, cwd=tmp_path)
    assert result.returncode == 2
    assert f"unrecognized arguments: {abbreviated}" in one_error_line(result.stderr)
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_on_the_host_says_it_runs_in_the_image() -> None:
    result = run_verlbox("tensorboard")
    assert result.returncode == 2
    assert one_error_line(result.stderr) == (
        "verlbox: error: tensorboard runs in the image, where TensorBoard is installed: `docker compose up -d "
        "tensorboard` in the run folder serves every run's curves (README: Watching a run)"
    )


def test_recipes_piped_keep_every_name_and_purpose_whole() -> None:
    result = run_verlbox("recipes")
    assert result.returncode == 0
    for name in ("p40", "p40-cu124"):
        row = next(line for line in result.stdout.splitlines() if f" {name} " in line)
        assert load_recipe(name).description in row


def test_recipes_name_the_driver_floor_doctor_applies() -> None:
    """The driver column is doctor's rule, not the description's prose: its lowest driver is accepted by
    doctor (through CUDA's compatibility), the one below it is refused, the full-support one has no note."""
    from verlbox.host.runs.doctor import driver_support

    result = run_verlbox("recipes")
    for name in ("p40", "p40-cu124"):
        row = next(line for line in result.stdout.splitlines() if f" {name} " in line)
        full, lowest = re.search(r">= (\S+) \(full support\); >= (\S+) through CUDA's minor-version", row).groups()
        cuda = load_recipe(name).cuda.version
        assert driver_support(lowest, cuda)[0] and "compatibility" in driver_support(lowest, cuda)[1]
        assert driver_support(full, cuda) == (True, "")
        below = lowest.split(".")
        assert not driver_support(f"{int(below[0]) - 1}.{below[1]}", cuda)[0]


def test_render_check_says_what_matches_and_takes_a_recipe(tmp_path: Path) -> None:
    every = run_verlbox("render", "--check")
    assert every.returncode == 0 and "p40, p40-cu124 match their recipes" in every.stdout
    one = run_verlbox("render", "--check", "p40-cu124")
    assert one.returncode == 0 and "p40-cu124 match" in one.stdout and "p40," not in one.stdout
    unknown = run_verlbox("render", "--check", str(tmp_path / "mine.yaml"))
    assert unknown.returncode == 2 and "is not one" in one_error_line(unknown.stderr)


@pytest.mark.docker
def test_verify_and_smoke_of_a_missing_image_are_one_line_each_and_bad_input(docker_engine: object) -> None:
    """An image named that the engine lacks is bad input (exit 2), as one without verlbox's labels is
    (errors.EXIT_CODES: refused before anything changed); before, it was 1."""
    before = engine_leftovers()
    verify = run_verlbox("verify", "does/not:exist")
    line = one_error_line(verify.stderr)
    assert verify.returncode == 2 and "does/not:exist is not on this engine" in line and "failed:" not in line
    # p40's base comes from a registry, so its default tag is never on these machines
    smoke = run_verlbox("smoke", "p40")
    line = one_error_line(smoke.stderr)
    assert (
        smoke.returncode == 2 and "verlbox/p40:0.1.0 is not on this engine: build it first: verlbox build p40" in line
    )
    smoke_gpu = run_verlbox("smoke", "p40-cu124", "--gpu", "--image", "does/not:exist")
    assert smoke_gpu.returncode == 2 and "does/not:exist is not on this engine" in one_error_line(smoke_gpu.stderr)
    assert engine_leftovers() == before


@pytest.mark.docker
def test_verify_of_an_image_without_the_recipe_label_is_bad_input_too(docker_engine: object, tmp_path: Path) -> None:
    tag = f"verlbox-test/unlabelled-verify:{os.getpid()}"
    (tmp_path / "marker").write_text(tag)
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    docker("buildx", "build", "-q", "--load", "-t", tag, str(tmp_path))
    try:
        result = run_verlbox("verify", tag)
    finally:
        docker("image", "rm", tag, check=False)
    assert result.returncode == 2
    assert one_error_line(result.stderr).endswith(f"{tag} names no recipe (no io.verlbox.recipe label): pass --recipe")


@pytest.mark.docker
def test_smoke_gpu_without_the_nvidia_runtime_is_one_line(docker_engine: object, image: str) -> None:
    before = engine_leftovers()
    result = run_verlbox("smoke", "p40-cu124", "--gpu", "--image", image)
    line = one_error_line(result.stderr)
    assert result.returncode == 1 and "NVIDIA" in line and "could not select device driver" not in line
    assert engine_leftovers() == before


@pytest.mark.docker
def test_verify_success_goes_to_stdout(image: str) -> None:
    result = run_verlbox("verify", image)
    assert result.returncode == 0 and f"{image} matches" in result.stdout


def test_smoke_json_to_stdout_is_declared() -> None:
    """`--json -` is stdout for host smoke as for smoke-checks (the image test runs it for real)."""
    for command in (["smoke", "p40-cu124"], ["smoke-checks"]):
        result = run_verlbox(*command, "--help")
        assert "or to stdout with -" in " ".join(result.stdout.split()), command


def test_every_option_has_help() -> None:
    import argparse

    from verlbox.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert missing == []
    assert {"doctor", "init", "fetch", "shell"} <= set(commands.choices)


def test_a_debian_mirror_for_the_ubuntu_based_p40_is_refused_before_any_step(tmp_path: Path) -> None:
    """p40's base is Ubuntu 22.04: apt there would read Ubuntu's paths from a Debian mirror and fail mid-build."""
    for given, env in (
        (["--apt-mirror", "http://deb.invalid/debian"], {}),
        ([], {"VERLBOX_APT_MIRROR": "http://deb.invalid/debian"}),
    ):
        result = run_verlbox("build", "p40", *given, "--sources", str(tmp_path), env=env)
        assert result.returncode == 2, result.stderr
        assert one_error_line(result.stderr) == (
            "verlbox: error: recipe p40: its base nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04 is Ubuntu, and "
            "--apt-mirror (or VERLBOX_APT_MIRROR) is a Debian mirror, which Ubuntu's apt cannot read: build without it"
        )
    assert not list(tmp_path.iterdir())  # nothing fetched, nothing started


def test_bundling_p40_is_refused_in_one_sentence_saying_why(tmp_path: Path) -> None:
    result = run_verlbox("bundle", "p40", "--out", str(tmp_path / "bundle"))
    assert result.returncode == 2 and one_error_line(result.stderr) == (
        "verlbox: error: recipe p40 cannot be bundled: its base is Ubuntu, with NVIDIA's flat CUDA repository, and "
        "an offline build checks each .deb against Debian's signed archive only"
    )
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize(
    ("given", "advice"),
    [
        ({"gpu": True}, "(--gpu needs the GPU tier)"),
        ({"model": "models/qwen"}, "(--model needs the GPU tier)"),
        ({"learn": True, "model": "m"}, "(--learn and --model need the GPU tier)"),
    ],
    ids=["gpu", "model", "learn-model"],
)
def test_smoke_without_a_gpu_names_the_flag_that_needs_one(given: dict[str, object], advice: str) -> None:
    """`smoke --model` on a host without the NVIDIA runtime once advised "without --gpu", never given."""
    from verlbox.host.commands import cpu_tier_advice

    args = argparse.Namespace(
        **({"recipe": "p40-cu124", "image": None, "gpu": False, "learn": False, "model": None} | given)
    )
    assert cpu_tier_advice(args) == f"; or run the CPU tier alone: `verlbox smoke p40-cu124` {advice}"
