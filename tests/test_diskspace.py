"""The free-space check before an offline build: refused in its first seconds, with the figures."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.host.building.diskspace import GIB, DiskSpaceError, local_data_folder, require_free_space
from verlbox.host.building.plan import BuildPlan
from verlbox.host.recipes.recipe import load_recipe


class Engine:
    """The one call the check makes of the docker SDK's client."""

    def __init__(self, name: str, root: Path) -> None:
        self.answer = {"Name": name, "DockerRootDir": str(root)}

    def info(self) -> dict[str, str]:
        return self.answer


def test_too_little_room_names_the_folder_and_both_figures(tmp_path: Path) -> None:
    engine = Engine(socket.gethostname(), tmp_path)
    free = shutil.disk_usage(tmp_path).free
    require_free_space(engine, free // 2, "a build")
    with pytest.raises(DiskSpaceError) as caught:
        require_free_space(engine, free + 1000 * GIB, "an offline build of p40-cu124")
    message = str(caught.value)
    needed = f"{(free + 1000 * GIB) / GIB:.1f}"
    assert f"an offline build of p40-cu124 needs about {needed} GiB free in {tmp_path}" in message
    assert re.search(r"it has \d+\.\d GiB\.", message), message


def test_an_engine_on_another_machine_is_not_measured_here(tmp_path: Path) -> None:
    assert local_data_folder(Engine("docker-desktop", tmp_path)) is None
    assert local_data_folder(Engine(socket.gethostname(), tmp_path / "absent")) is None
    require_free_space(Engine("docker-desktop", tmp_path), 10**18, "a build")  # nothing to measure: no refusal


def _bundle_too_big_for_any_disk(folder: Path) -> Path:
    """A manifest made for p40-cu124 and its lock, listing one sparse 8 TiB file (no room taken)."""
    plan = BuildPlan(load_recipe("p40-cu124"), offline=True)
    assert plan.lock is not None
    (folder / "wheels").mkdir(parents=True)
    with (folder / "wheels" / "huge-1.0-py3-none-any.whl").open("wb") as sparse:
        sparse.truncate(8 * 2**40)
    manifest = {
        "recipe": plan.recipe.name,
        "recipe_hash": plan.recipe.content_hash,
        "lock_hash": plan.lock.content_hash,
        "base": {"reference": "verlbox-base/debian:bookworm-minbase", "image_id": "sha256:" + "0" * 64},
        "files": {"wheels/huge-1.0-py3-none-any.whl": "0" * 64},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.docker
def test_build_offline_refuses_a_bundle_too_big_for_the_disk_before_any_step(docker_engine, tmp_path: Path) -> None:
    if local_data_folder(docker_engine) is None:
        pytest.skip("the Docker engine runs on another machine: its free space is not measured from here")
    bundle = _bundle_too_big_for_any_disk(tmp_path / "bundle")
    result = run_verlbox("build", "p40-cu124", "--offline", str(bundle), "--tag", "verlbox-test/never:built")
    assert result.returncode == 1, result.stderr
    assert "an offline build of p40-cu124 needs about 49154.0 GiB free in " in result.stderr
    assert "Docker's data folder" in result.stderr and "Traceback" not in result.stderr
    # past the check the file-by-file one comes next (an unlisted file stops it before any hashing)
    (bundle / "debs").mkdir()
    (bundle / "debs" / "extra_1.0_amd64.deb").write_bytes(b"deb")
    result = run_verlbox(
        "build", "p40-cu124", "--offline", str(bundle), "--skip-space-check", "--tag", "verlbox-test/never:built"
    )
    assert result.returncode == 2 and "are not listed in it, e.g. debs/extra_1.0_amd64.deb" in result.stderr


def test_a_bundle_for_another_recipe_is_bad_input_before_its_size_is_weighed(tmp_path: Path) -> None:
    bundle = _bundle_too_big_for_any_disk(tmp_path / "bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps(manifest | {"lock_hash": "0" * 64}))
    result = run_verlbox("build", "p40-cu124", "--offline", str(bundle))
    assert result.returncode == 2 and "lock_hash is " + "0" * 64 in result.stderr, result.stderr
    result = run_verlbox("build", "p40-cu124", "--skip-space-check")
    assert result.returncode == 2 and "--skip-space-check goes with --offline" in result.stderr
