"""Integration: build p40-cu124 on the real Docker engine FROM a debootstrapped base, then look inside."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from conftest import HOST_CA_BUNDLE, IMAGE, REPO, ca_arguments, docker, git_shaped_archive, run_verlbox, staging_tags
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust import pins
from verlbox.runtime.checks.smoke import CPU_CHECKS
from verlbox.runtime.steps.apex_build import fatbin_architectures, file_sha256
from verlbox.runtime.training.patches import patch_set_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]


# In the Apex build stage: the SASS architectures of each extension in the wheel, by cuobjdump and by
# the fatbin reader smoke uses (apex_build.py, mounted from the build context).
UNPACK_WHEEL = """
import glob, json, subprocess, zipfile
from pathlib import Path
zipfile.ZipFile(glob.glob("/wheels/apex-*.whl")[0]).extractall("/tmp/w")
objects = sorted(glob.glob("/tmp/w/*.so"))
"""
CUOBJDUMP_SASS = (
    UNPACK_WHEEL
    + """
found = {}
for so in objects:
    listing = subprocess.run(["cuobjdump", "--list-elf", so], capture_output=True, text=True).stdout.split()
    archs = {word.split(".")[-2] for word in listing if word.endswith(".cubin")}
    found[Path(so).name.split(".")[0]] = sorted(archs, key=lambda arch: int(arch.split("_")[1]))
print(json.dumps(found))
"""
)
READER_SASS = (
    UNPACK_WHEEL
    + """
import sys
sys.path.insert(0, "/tmp/verlbox-apex")
from apex_build import fatbin_architectures
print(json.dumps({Path(so).name.split(".")[0]: fatbin_architectures(Path(so))["sass"] for so in objects}))
"""
)


def ca_secret() -> list[str]:
    return ["--secret", f"id=ca_bundle,src={HOST_CA_BUNDLE}"] if HOST_CA_BUNDLE.is_file() else []


def derived_image(tmp_path: Path, tag: str, dockerfile: str, files: dict[str, Path] | None = None) -> str:
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    for name, source in (files or {}).items():
        (context / name).write_bytes(source.read_bytes())
    docker("buildx", "build", "--load", "--progress", "plain", "--tag", tag, str(context))
    return tag


def smoke(image: str, json_file: Path) -> tuple[int, dict[str, dict[str, str]]]:
    result = run_verlbox("smoke", "p40-cu124", "--image", image, "--json", str(json_file), timeout=900)
    assert json_file.is_file(), result.stderr[-3000:]
    return result.returncode, {row["name"]: row for row in json.loads(json_file.read_text())}


def test_build_streams_its_steps_and_tags_only_the_final_name(build_output, staging_tags_before_build) -> None:
    streamed = "RUN steps.sh pip verl --no-deps verl==0.4.1 && steps.sh pip verl-deps"
    assert "[final" in build_output.stderr and streamed in build_output.stderr
    assert f"built {IMAGE}" in build_output.stderr
    assert staging_tags() == staging_tags_before_build


def test_labels_carry_recipe_hash_pins_and_patch_set(image: str) -> None:
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)
    recipe = load_recipe("p40-cu124")
    assert labels["io.verlbox.recipe"] == "p40-cu124"
    assert labels["io.verlbox.recipe.hash"] == recipe.content_hash
    assert labels["io.verlbox.recipe.origin"] == "shipped"
    assert labels["io.verlbox.verl-patch-set.hash"] == patch_set_for("0.4.1").content_hash
    assert labels["io.verlbox.version"] == "0.1.0"
    for component, version in recipe.pins().items():
        assert labels[f"io.verlbox.pin.{canonicalize_name(component)}"] == version
    # the image's own spec carries the lock's hash too: train records it in run.json (labels are not visible inside)
    spec = json.loads(docker("run", "--rm", "--entrypoint", "cat", image, "/opt/verlbox/image-spec.json").stdout)
    assert spec["lock_hash"] == labels["io.verlbox.lock.hash"]


def test_inside_torch_260_verl_041_and_no_flash_attn(image: str) -> None:
    probe = (
        "import importlib.util, json, torch, verl; print(json.dumps({'torch': torch.__version__, "
        "'verl': verl.__version__, 'flash_attn': importlib.util.find_spec('flash_attn') is not None}))"
    )
    result = docker("run", "--rm", "--entrypoint", "python", image, "-c", probe)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "torch": "2.6.0+cu124",
        "verl": "0.4.1",
        "flash_attn": False,
    }


BYTECODE_PROBE = """
import importlib.metadata as metadata, importlib.util, json, os
missing = {}
for dist in metadata.distributions():
    for path in dist.files or []:
        source = str(path.locate())
        if path.suffix == ".py" and os.path.exists(source) and "/site-packages/" in source:
            if not os.path.exists(importlib.util.cache_from_source(source)):
                missing.setdefault(dist.metadata["Name"], []).append(str(path))
print(json.dumps(missing))
"""


def test_every_installed_python_file_has_its_bytecode(image: str) -> None:
    """The image runs with PYTHONDONTWRITEBYTECODE: a file without bytecode compiles at every import.
    Each step compiles its own files (and the patch step the files it changes)."""
    result = docker("run", "--rm", "--entrypoint", "python", image, "-c", BYTECODE_PROBE)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


def test_the_image_s_glibc_is_at_least_the_floor_build_check_judges_wheels_by(image: str) -> None:
    """`verlbox build --check` accepts a wheel up to manylinux_2_{GLIBC_MINOR}: the image must run it."""
    probe = "import json, platform; print(json.dumps(platform.libc_ver()))"
    result = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", probe)
    library, version = json.loads(result.stdout.strip().splitlines()[-1])
    assert library == "glibc" and int(version.split(".")[1]) >= pins.GLIBC_MINOR, version


def in_image(image: str, script: str) -> str:
    """What a shell script prints in a throwaway container (its exit status does not matter)."""
    return docker("run", "--rm", "--entrypoint", "sh", image, "-c", f"{script}; true").stdout.strip()


def _certificates(text: str) -> set[str]:
    return set(re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", text, re.S))


def test_the_image_matches_its_hashed_lock(image: str, tmp_path: Path) -> None:
    result = run_verlbox("verify", image)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{image} matches" in result.stdout and result.stderr == ""
    # `verlbox lock` finds the same steps, files and hashes in the image (a copy: the repo is never rewritten)
    for name in ("p40-cu124.yaml", "_verl-0.4.1.yaml", "p40-cu124.lock.json"):
        (tmp_path / name).write_text((REPO / "recipes" / name).read_text())
    result = run_verlbox("lock", str(tmp_path / "p40-cu124.yaml"), "--image", image)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "p40-cu124.lock.json").read_text())
    committed = json.loads((REPO / "recipes" / "p40-cu124.lock.json").read_text())
    assert written["steps"] == committed["steps"]
    assert all(entry["sha256"] for step in written["steps"] for entry in step["pip"])


def test_an_altered_hash_in_the_lock_fails_the_build_at_once_naming_the_package(image: str, tmp_path: Path) -> None:
    for name in ("p40-cu124.yaml", "_verl-0.4.1.yaml"):
        (tmp_path / name).write_text((REPO / "recipes" / name).read_text())
    lock = json.loads((REPO / "recipes" / "p40-cu124.lock.json").read_text())
    verl_step = next(step for step in lock["steps"] if step["name"] == "verl")
    verl_step["pip"][0]["sha256"] = "0" * 64
    (tmp_path / "p40-cu124.lock.json").write_text(json.dumps(lock))
    before = docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    started = time.monotonic()
    result = run_verlbox(
        "build", str(tmp_path / "p40-cu124.yaml"), "--bootstrap-base", "--tag", image, *ca_arguments(), timeout=1200
    )
    seconds = time.monotonic() - started
    # the file is fetched by name and held to the lock's sha256 before any installer sees it
    fetched = "verl-0.4.1-py2.py3-none-any.whl: served with sha256 "
    assert result.returncode == 1 and "0" * 64 in result.stderr and fetched in result.stderr, result.stderr[-3000:]
    assert seconds < 120, f"the hash mismatch took {seconds:.0f} s to surface"  # every earlier layer is cached
    assert docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip() == before


def test_verify_names_a_package_that_differs_from_the_lock(image: str, tmp_path: Path) -> None:
    # a Debian package the lock does not list, as dpkg records one (no archive needed to plant it)
    planted = (
        "\\nPackage: planted\\nStatus: install ok installed\\nPriority: optional\\nSection: misc\\n"
        "Maintainer: nobody <nobody@invalid>\\nArchitecture: all\\nVersion: 1.0\\nDescription: planted\\n"
    )
    tampered = derived_image(
        tmp_path,
        "verlbox-test/tampered-verify:ci",
        f"FROM {image}\nRUN pip uninstall -y codetiming && printf '{planted}' >> /var/lib/dpkg/status \\\n"
        # a patched verl file swapped after the build: nothing of the lock changes, yet the image is not intact
        "    && echo '# swapped' >> \"$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
        '/verl/workers/actor/dp_actor.py"\n',
    )
    try:
        intact = run_verlbox("verify", image)
        assert intact.returncode == 0 and "file /" not in intact.stdout, intact.stdout
        result = run_verlbox("verify", tampered, timeout=900)
        assert result.returncode == 1
        assert "python codetiming: lock 1.4.0, image absent" in result.stdout
        assert "debian planted: image 1.0, not in the lock" in result.stdout
        site = "/opt/venv/lib/python3.11/site-packages"
        lines = result.stdout.splitlines()
        changed = f"file {site}/verl/workers/actor/dp_actor.py: changed since the build (file 0644 0:0 sha256 "
        assert [line for line in lines if line.startswith(changed)], lines
        assert f"file {site}/codetiming/__init__.py: removed since the build" in result.stdout
        assert "file /var/lib/dpkg/status: changed since the build" in result.stdout
    finally:
        docker("image", "rm", tampered, check=False)


def test_an_image_of_another_recipe_is_named_as_such(image: str) -> None:
    as_p40 = run_verlbox("verify", image, "--recipe", "p40")
    assert as_p40.returncode == 1
    assert as_p40.stdout.strip() == (f"{image} was built from recipe p40-cu124, not p40: name recipe p40-cu124 instead")
    locked = run_verlbox("lock", "p40", "--image", image)
    assert locked.returncode == 2 and locked.stderr.strip().splitlines() == [
        f"verlbox: error: {image} was built from p40-cu124, not recipe p40: lock it as that recipe"
    ]
    assert not (REPO / "recipes" / "p40.lock.json").exists()


def test_the_final_image_has_apex_but_no_cuda_toolchain(image: str) -> None:
    found = in_image(
        image, "command -v nvcc cuobjdump ptxas; ls -d /usr/include/cuda* /usr/lib/nvidia-cuda-toolkit 2>/dev/null"
    )
    assert found == ""
    record = json.loads(
        docker("run", "--rm", "--entrypoint", "python", image, "-c",
               "import importlib.metadata as m; print(m.distribution('apex').read_text('verlbox-source.json'))").stdout
    )  # fmt: skip
    assert record["commit"] == "e13873debc4699d39c6861074b9a3b2a02327f92" and record["nvcc"] == "12.4"
    assert record["build_patches"] == ["skip-fused-weight-gradient-mlp"]  # it would hold no sm_61 code
    assert record["archive_sha256"] == load_recipe("p40-cu124").apex.archive_sha256


@pytest.fixture(scope="module")
def apex_stage(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The Apex build stage (it has the toolkit) as an image, from the build's layer cache, and its context."""
    stage = "verlbox-test/apex-build:ci"
    context = tmp_path_factory.mktemp("apex-stage")
    from verlbox.host.building.context import write_context
    from verlbox.host.building.plan import BuildPlan
    from verlbox.host.building.sources import BuildSources

    write_context(BuildPlan(load_recipe("p40-cu124"), "verlbox-base/debian:bookworm-minbase"), context, BuildSources())
    docker("buildx", "build", "--load", "--progress", "plain", "--target", "apex-build", "--tag", stage,
           *ca_secret(), str(context), timeout=3000)  # fmt: skip
    yield stage, context
    docker("image", "rm", stage, check=False)


def test_the_apex_stage_brings_its_compiler_to_a_base_without_one(apex_stage: tuple[str, Path]) -> None:
    """The rehearsal of p40's Apex stage on a base with no g++ (a -devel base is not promised one): the
    stage's own apt step installs it."""
    where = "command -v g++ || echo none"
    base = docker("run", "--rm", "--entrypoint", "sh", "verlbox-base/debian:bookworm-minbase", "-c", where)
    stage = docker("run", "--rm", "--entrypoint", "sh", apex_stage[0], "-c", where)
    assert base.stdout.strip() == "none" and stage.stdout.strip() == "/usr/bin/g++"


def test_the_fatbin_reader_agrees_with_cuobjdump(apex_stage: tuple[str, Path]) -> None:
    """In the Apex build stage: cuobjdump and smoke's reader list the same SASS."""
    stage, context = apex_stage
    listed = json.loads(docker("run", "--rm", stage, "python3", "-c", CUOBJDUMP_SASS).stdout)
    mount = f"{context / 'apex'}:/tmp/verlbox-apex:ro"
    read = json.loads(docker("run", "--rm", "-v", mount, stage, "python3", "-c", READER_SASS).stdout)
    cuda_extensions = {name for name, archs in listed.items() if archs}
    assert len(cuda_extensions) == 10 and listed == read
    assert all(read[name] == ["sm_61"] for name in cuda_extensions)
    assert "fused_weight_gradient_mlp_cuda" not in read


# Two compiles in one container, each from its own folder, with other PIDs, at other times, torch's
# headers touched in between (as a second install of torch dates them).
COMPILE_TWICE = """
for run in first second-with-a-longer-name; do
  mkdir -p /exercise/$run && cd /exercise/$run
  for _ in $(seq 300); do /bin/true; done
  find /opt/venv/lib/python3*/site-packages/torch/include -type f -exec touch {} +
  python3 /tmp/verlbox-apex/apex_build.py /exercise/plan.json /exercise/archive/apex-*.tar.gz /exercise/$run/wheels \
    >/exercise/$run.log 2>&1 || { tail -n 40 /exercise/$run.log; exit 1; }
  sleep 2
done
"""


def test_a_cuda_extension_compiles_to_the_same_wheel_twice(apex_stage: tuple[str, Path], tmp_path: Path) -> None:
    """The Apex stage's compile, with its plan's folder and flags, on a small CUDA extension: one wheel, byte
    for byte (a whole Apex compile takes too long to run twice; the lock's hash checks the one the build made)."""
    stage, context = apex_stage
    source = REPO / "tests" / "fixtures" / "repeatable-extension"
    commit = "1" * 40
    (tmp_path / "archive").mkdir()
    files = {path.name: path.read_bytes() for path in source.iterdir()}
    archive = git_shaped_archive(tmp_path / "archive", commit, files, mtime=1_700_000_000)
    shipped = json.loads((context / "apex" / "plan.json").read_text())
    plan = shipped | {"commit": commit, "archive_sha256": file_sha256(archive), "build_patches": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    mounts = ["-v", f"{tmp_path}:/exercise", "-v", f"{context / 'apex'}:/tmp/verlbox-apex:ro"]
    compiled = docker("run", "--rm", *mounts, stage, "bash", "-c", COMPILE_TWICE, check=False, timeout=900)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    first, second = (next((tmp_path / run / "wheels").glob("*.whl")) for run in ("first", "second-with-a-longer-name"))
    assert first.name == second.name == "repeatable_ext-0.1-cp311-cp311-linux_x86_64.whl"
    assert file_sha256(first) == file_sha256(second)
    with zipfile.ZipFile(first) as wheel:  # it did compile CUDA code, for the stage's target
        (shared_object,) = [name for name in wheel.namelist() if name.endswith(".so")]
        wheel.extract(shared_object, tmp_path / "unpacked")
        assert {time for info in wheel.infolist() for time in [info.date_time]} == {(2023, 11, 14, 22, 13, 20)}
    assert fatbin_architectures(tmp_path / "unpacked" / shared_object)["sass"] == ["sm_61"]


def test_no_ca_material_in_layers_or_history(image: str) -> None:
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert "BEGIN CERTIFICATE" not in history and str(HOST_CA_BUNDLE) not in history
    leftovers = in_image(image, "ls -A /run/secrets 2>/dev/null; ls /etc/apt/apt.conf.d/99verlbox-ca 2>/dev/null")
    assert leftovers == ""
    if not HOST_CA_BUNDLE.is_file():
        return
    # certificates only this host trusts (a re-signing proxy): the build needed them, the image must not keep them
    image_bundle = docker("run", "--rm", "--entrypoint", "cat", image, "/etc/ssl/certs/ca-certificates.crt").stdout
    host_only = _certificates(HOST_CA_BUNDLE.read_text()) - _certificates(image_bundle)
    for certificate in sorted(host_only)[:3]:
        marker = certificate.splitlines()[1]
        found = in_image(image, f"grep -rlF '{marker}' /etc /opt /root /tmp /usr/local /workspace 2>/dev/null")
        assert found == "", found


def test_cpu_smoke_tier_passes_and_gpu_tier_is_skipped_with_a_reason(image: str, tmp_path: Path) -> None:
    # `--json -`: the JSON is stdout (nothing else there), the table goes to stderr, no file named "-"
    result = run_verlbox("smoke", "p40-cu124", "--image", image, "--json", "-", cwd=tmp_path, timeout=900)
    assert not (tmp_path / "-").exists() and "matches its lock" in result.stderr
    code, results = result.returncode, {row["name"]: row for row in json.loads(result.stdout)}
    failed = {name: row["detail"] for name, row in results.items() if row["status"] == "failed"}
    assert code == 0 and failed == {}
    cpu = [row for row in results.values() if row["tier"] == "cpu"]
    assert [row["name"] for row in cpu] == [name for name, _ in CPU_CHECKS]
    assert all(row["status"] == "passed" for row in cpu)
    assert results["matches its lock"]["status"] == "passed"
    assert results["Apex machine code for targets"]["detail"] == "10 CUDA extensions hold SASS for 6.1"
    assert results["Apex extensions load"]["detail"].endswith(
        "11 extension modules load (built with --cpp_ext --cuda_ext); "
        "not built, no code for the targets: fused_weight_gradient_mlp_cuda"
    )
    assert results["GPU tier"] == {
        "tier": "gpu",
        "name": "GPU tier",
        "status": "skipped",
        "detail": "not requested (--gpu)",
    }
    # the cuDNN torch loads, and where from: torch 2.6.0's own pin, not a system library
    assert (
        "torch loads cuDNN 9.1.0 from pip's nvidia-cudnn-cu12 9.1.0.70 (libcudnn.so.9)"
        in (results["pins match the recipe"]["detail"])
    )


def test_smoke_fails_when_a_patch_is_reverted_in_the_image(image: str, tmp_path: Path) -> None:
    revert = (
        "from pathlib import Path; import sysconfig; from verlbox.runtime.training.patches import patch_set_for; "
        "p = next(x for x in patch_set_for('0.4.1').patches if x.id == 'critic-autocast-follows-param-dtype'); "
        "f = Path(sysconfig.get_paths()['purelib']) / p.file; f.write_text(f.read_text().replace(p.replace, p.find))"
    )
    tampered = derived_image(tmp_path, "verlbox-test/tampered-patch:ci", f'FROM {image}\nRUN python -c "{revert}"\n')
    try:
        code, results = smoke(tampered, tmp_path / "smoke.json")
        assert code == 1
        check = results["verl patch set applied"]
        assert check["status"] == "failed"
        assert (
            "patch critic-autocast-follows-param-dtype (verl/workers/critic/dp_critic.py) is pending" in check["detail"]
        )
        assert results["pins match the recipe"]["status"] == "passed"
    finally:
        docker("image", "rm", tampered, check=False)


def test_smoke_names_an_apex_extension_that_is_missing_or_another_commit(image: str, tmp_path: Path) -> None:
    site = "/opt/venv/lib/python3.11/site-packages"  # the image's venv (recipe: Python 3.11)
    record = f"{site}/apex-*.dist-info/verlbox-source.json"
    tampered = derived_image(
        tmp_path,
        "verlbox-test/tampered-apex:ci",
        f"FROM {image}\nRUN rm {site}/mlp_cuda.*.so && sed -i 's/e13873de/0000aaaa/' {record}\n",
    )
    try:
        code, results = smoke(tampered, tmp_path / "smoke.json")
        assert code == 1
        loads = results["Apex extensions load"]
        assert loads["status"] == "failed" and "mlp_cuda" in loads["detail"]
        machine_code = results["Apex machine code for targets"]
        assert machine_code["status"] == "failed" and "mlp_cuda: not installed" in machine_code["detail"]
        pins = results["pins match the recipe"]
        assert pins["status"] == "failed" and "apex 0000aaaa" in pins["detail"]
    finally:
        docker("image", "rm", tampered, check=False)


def test_smoke_fails_when_a_pinned_package_is_swapped(image: str, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "codetiming==1.3.0", "-d", str(wheels)],
        check=True,
        capture_output=True,
    )
    wheel = next(wheels.glob("codetiming-1.3.0-*.whl"))
    tampered = derived_image(
        tmp_path,
        "verlbox-test/tampered-pin:ci",
        f"FROM {image}\nCOPY {wheel.name} /tmp/\nRUN pip install --no-cache-dir --no-deps /tmp/{wheel.name}\n",
        {wheel.name: wheel},
    )
    try:
        code, results = smoke(tampered, tmp_path / "smoke.json")
        assert code == 1
        assert results["pins match the recipe"]["status"] == "failed"
        assert "codetiming 1.3.0 (recipe pins 1.4.0)" in results["pins match the recipe"]["detail"]
        assert results["verl patch set applied"]["status"] == "passed"
    finally:
        docker("image", "rm", tampered, check=False)


def test_a_failed_build_keeps_the_previous_image_and_its_tag(image: str, tmp_path: Path) -> None:
    before = docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    tags_before = staging_tags()
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "extends": str(REPO / "recipes" / "p40-cu124.yaml"),
                "verl": {"dependencies": {"verlbox-no-such-package": "1.0.0"}},
            }
        )
    )
    result = run_verlbox("build", str(broken), "--bootstrap-base", "--tag", image, *ca_arguments(), timeout=1200)
    assert result.returncode == 1
    assert "previous images and tags are untouched" in result.stderr and "Full log: " in result.stderr
    log = Path(result.stderr.split("Full log: ", 1)[1].split()[0])
    assert log.is_file() and "verlbox-no-such-package" in log.read_text()
    assert docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip() == before
    assert staging_tags() == tags_before


def test_train_without_a_gpu_stops_at_preflight_in_one_sentence(image: str) -> None:
    result = docker("run", "--rm", image, "train", check=False)
    assert result.returncode == 3
    assert "preflight GPU visible: training needs 1 GPU(s) but 0 are visible" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_override_in_a_one_off_run_exits_2_at_once_even_under_compose_s_hold(image: str) -> None:
    """`docker compose run --rm train train trainer.total_epoch=2` in a run folder whose compose.yaml sets
    VERLBOX_ON_HALT=wait (as run folders made before `--on-halt` do): a typo typed by hand ends the one-off
    at once, in one line; a dry run never holds. Only `train --on-halt wait` (the service's own command) holds."""
    result = docker(
        "run", "--rm", "-e", "VERLBOX_ON_HALT=wait", image, "train", "trainer.total_epoch=2", check=False, timeout=120
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("verlbox: error: trainer.total_epoch: verl 0.4.1 does not declare it")
    assert "holding here" not in result.stderr and "Traceback" not in result.stderr
    dry = docker("run", "--rm", "-e", "VERLBOX_PROFILE=gpro", image, "train", "--on-halt", "wait", "--dry-run",
                 check=False, timeout=120)  # fmt: skip
    assert dry.returncode == 2 and "no training profile named 'gpro'" in dry.stderr, dry.stderr
    assert "holding here" not in dry.stderr
    held = docker("run", "--rm", "--name", f"verlbox-held-{os.getpid()}", "-d", image, "train", "--on-halt", "wait",
                  check=False)  # fmt: skip
    try:  # the service's command (what `up` runs): a failure holds with its reason
        for _ in range(60):
            logs = docker("logs", held.stdout.strip(), check=False).stderr
            if "holding here" in logs:
                break
            time.sleep(1)
        assert "preflight GPU visible" in logs and "holding here" in logs
    finally:
        docker("rm", "-f", held.stdout.strip(), check=False)


def test_a_model_folder_the_container_user_cannot_read_is_one_line_naming_owner_and_mode(
    image: str, tmp_path: Path
) -> None:
    """A root-owned mode-700 folder meets a container that runs as the user: before, glob() saw it empty ("no
    weights") and the fetch record's is_file() raised PermissionError (an internal error, restarted by compose)."""
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    (models / "m" / "config.json").write_text("{}")
    (models / "m").chmod(0o700)
    models.chmod(0o755)
    stranger = str(os.getuid() + 4321)
    said = f"/models/m: cannot read it (owner uid {os.getuid()}, mode 700; this runs as uid {stranger})"
    run = ("run", "--rm", "--user", f"{stranger}:{stranger}", "-e", "HOME=/tmp", "-v", f"{models}:/models", image)
    fetched = docker(*run, "fetch", "model", "--out", "/models/m", check=False)
    (line,) = fetched.stderr.strip().splitlines()
    assert fetched.returncode == 2 and line.startswith(f"verlbox: error: {said}: on the host, `sudo chown")
    planned = docker(*run[:-1], "-e", "VERLBOX_MODEL_DIR=/models/m", image, "train", "--dry-run", check=False)
    assert said in planned.stdout + planned.stderr and "Traceback" not in planned.stderr
    assert "no weights" not in planned.stdout + planned.stderr


def test_overrides_inside_the_image_check_keys_without_the_docker_sdk(image: str) -> None:
    # no recipe named: in an image it is the image's own
    applied = docker("run", "--rm", image, "overrides", "trainer.total_epochs=2")
    assert "trainer.total_epochs=2" in applied.stdout and "trainer.total_epochs=1" not in applied.stdout
    named = docker("run", "--rm", image, "overrides", "p40-cu124", "trainer.total_epochs=2")
    assert named.stdout == applied.stdout
    blog_key = "actor_rollout_ref.fsdp_config.param_offload=True"
    refused = docker("run", "--rm", image, "overrides", blog_key, check=False)
    assert refused.returncode == 2 and "actor_rollout_ref.actor.fsdp_config.param_offload" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_dry_run_prints_the_exact_command(image: str) -> None:
    result = docker("run", "--rm", image, "train", "--dry-run", "trainer.total_epochs=2")
    assert "-m verl.trainer.main_ppo" in result.stdout
    assert "trainer.total_epochs=2" in result.stdout and "trainer.total_epochs=1" not in result.stdout
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in result.stdout


def test_files_written_to_a_mounted_folder_belong_to_the_caller(image: str, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        (raw / f"{split}.jsonl").write_text(json.dumps({"question": "q?", "answer": "#### 1,000"}) + "\n")
    os.chmod(tmp_path, 0o777)
    docker(
        "run",
        "--rm",
        "--user",
        "4321:4321",
        "-v",
        f"{tmp_path}:/data",
        image,
        "prepare-data",
        "gsm8k",
        "--source",
        "/data/raw",
        "--out",
        "/data/gsm8k",
    )
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in (tmp_path / "gsm8k").iterdir()}
    assert owners == {(4321, 4321)}
    assert sorted(p.name for p in (tmp_path / "gsm8k").iterdir()) == [
        "test.parquet",
        "train.parquet",
        "validation.parquet",
    ]


def test_apt_in_the_image_reads_the_build_s_mirror_and_the_base_s_files_stay_as_they_were(image: str) -> None:
    """build_steps.py gives apt the build's mirror (a BuildKit secret) in copies of the base's sources, its
    login in an auth.conf of the step's own: apt, in the image, asks the mirror (its & and | kept as they
    are, no login in a URL), and the base's sources and the step's temporary files are as before."""
    runtime = REPO / "builder" / "verlbox" / "runtime" / "steps"
    script = """
import subprocess, pathlib
import build_steps as steps
base = pathlib.Path("/etc/apt/sources.list").read_text()
secrets = steps.Secrets(apt_mirror="https://ci:t0k@mirror.invalid/deb&ian|c")
with steps.apt_options(secrets) as options:
    subprocess.run(["apt-get", *options, "--print-uris", "update"], check=True)
print("same" if pathlib.Path("/etc/apt/sources.list").read_text() == base else "changed")
print(sorted(str(p) for p in pathlib.Path("/tmp").glob("verlbox-apt-*")))
"""
    shown = docker(
        "run", "--rm", "--user", "0", "--entrypoint", "python3", "-v", f"{runtime}:/src:ro", "-w", "/src",
        image, "-c", script,
    ).stdout.splitlines()  # fmt: skip
    assert shown[0].startswith("'https://mirror.invalid/deb&ian|c/dists/bookworm/InRelease' "), shown
    assert shown[-2:] == ["same", "[]"] and not any("t0k" in line for line in shown), shown
