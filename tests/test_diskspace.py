"""The free-space check before an offline build: refused in its first seconds, with the figures."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.host.diskspace import GIB, DiskSpaceError, local_data_folder, require_free_space


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
    assert (
        f"an offline build of p40-cu124 needs about {(free + 1000 * GIB) / GIB:.0f} GiB free in {tmp_path}" in message
    )
    assert f"it has {free / GIB:.1f} GiB" in message


def test_an_engine_on_another_machine_is_not_measured_here(tmp_path: Path) -> None:
    assert local_data_folder(Engine("docker-desktop", tmp_path)) is None
    assert local_data_folder(Engine(socket.gethostname(), tmp_path / "absent")) is None
    require_free_space(Engine("docker-desktop", tmp_path), 10**18, "a build")  # nothing to measure: no refusal


@pytest.mark.docker
def test_build_offline_refuses_a_bundle_too_big_for_the_disk_before_any_step(docker_engine, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    with (bundle / "wheels" / "huge-1.0-py3-none-any.whl").open("wb") as sparse:
        sparse.truncate(8 * 2**40)  # 8 TiB that take no room: only the listed size counts
    manifest = {
        "recipe": "p40-cu124",
        "recipe_hash": "0" * 64,
        "lock_hash": "0" * 64,
        "base": {"reference": "verlbox-base/debian:bookworm-minbase", "image_id": "sha256:" + "0" * 64},
        "files": {"wheels/huge-1.0-py3-none-any.whl": "0" * 64},
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    result = run_verlbox("build", "p40-cu124", "--offline", str(bundle), "--tag", "verlbox-test/never:built")
    assert result.returncode == 1, result.stderr
    assert "an offline build of p40-cu124 needs about 49152 GiB free in " in result.stderr
    assert "Docker's data folder" in result.stderr and "Traceback" not in result.stderr
