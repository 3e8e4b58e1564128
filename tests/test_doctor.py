"""`verlbox doctor`: the host's engine, plugins, NVIDIA runtime and GPUs, and the recipe that fits each GPU.

The verdicts are plain functions of facts (tested directly); the command itself runs as a subprocess
against the real engine, with a fake nvidia-smi (and, where a passing host is wanted, a fake
nvidia-container-runtime-hook) first on PATH.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.host.recipes.recipe import load_recipe, recipe_names
from verlbox.host.runs.doctor import (
    FAILED,
    NVIDIA_HOOK,
    PASSED,
    WARNING,
    Gpu,
    GpuQueryError,
    RuntimeFacts,
    driver_support,
    gpu_findings,
    nvidia_runtime_finding,
    parse_nvidia_smi,
    recipe_finding,
    recommend,
)

P40_535 = "0, Tesla P40, 6.1, 24576, 535.183.01"
P40_550 = "0, Tesla P40, 6.1, 24576, 550.54.14"
H200 = "0, NVIDIA H200, 9.0, 143771, 580.159.04"
NO_GPU = None


def recipes() -> list:
    return [load_recipe(name) for name in recipe_names()]


def gpu(capability: str, driver: str, name: str = "Tesla P40") -> Gpu:
    return Gpu("0", name, capability, 24576, driver)


# --- the verdicts, fed facts ---


def test_nvidia_smi_rows_are_parsed_and_a_strange_row_is_named() -> None:
    gpus = parse_nvidia_smi(f"{P40_535}\n1, NVIDIA H200, 9.0, 143771, 580.159.04\n\n")
    assert gpus == [
        Gpu("0", "Tesla P40", "6.1", 24576, "535.183.01"),
        Gpu("1", "NVIDIA H200", "9.0", 143771, "580.159.04"),
    ]
    line = 'Field "compute_cap" is not a valid field to query.'
    with pytest.raises(GpuQueryError, match=re.escape(f"nvidia-smi printed an unexpected row: {line!r}")):
        parse_nvidia_smi(line + "\n")


def test_driver_floors_come_from_the_cuda_table() -> None:
    assert driver_support("550.54.14", "12.4") == (True, "")
    runs, note = driver_support("535.183.01", "12.4")
    assert runs and "minor-version compatibility (>= 525.60.13)" in note and "full support from 550.54.14" in note
    assert driver_support("535.183.01", "11.8") == (True, "")
    assert driver_support("515.105.01", "12.4") == (False, "needs driver >= 525.60.13, full support from 550.54.14")
    assert driver_support("440.33.01", "11.8")[0] is False


def test_p40_with_driver_535_gets_both_recipes_one_through_compatibility() -> None:
    finding = recipe_finding(gpu("6.1", "535.183.01"), recipes())
    assert finding.status == PASSED
    assert finding.detail.startswith("p40 (CUDA 11.8); p40-cu124 (CUDA 12.4, through CUDA minor-version compat")
    assert "full support from 550.54.14" in finding.detail


def test_p40_with_driver_550_gets_both_recipes_plainly() -> None:
    finding = recipe_finding(gpu("6.1", "550.54.14"), recipes())
    assert (finding.status, finding.detail) == (PASSED, "p40 (CUDA 11.8); p40-cu124 (CUDA 12.4)")


def test_p40_with_an_old_driver_gets_only_what_it_can_run() -> None:
    finding = recipe_finding(gpu("6.1", "520.61.05"), recipes())
    assert finding.status == PASSED
    assert finding.detail == (
        "p40 (CUDA 11.8); not p40-cu124 (CUDA 12.4, needs driver >= 525.60.13, full support from 550.54.14)"
    )
    too_old = recipe_finding(gpu("6.1", "418.226.00"), recipes())
    assert too_old.status == FAILED and "too old for every recipe" in too_old.detail and "R580" in too_old.fix


def test_a_gpu_no_recipe_targets_is_named_with_its_capability() -> None:
    finding = recipe_finding(gpu("9.0", "580.159.04", "NVIDIA H200"), recipes())
    assert finding.status == FAILED
    assert finding.detail.startswith("no shipped recipe targets compute capability 9.0 (NVIDIA H200;")
    assert "target_gpus: ['9.0']" in finding.fix


@pytest.mark.parametrize(
    ("facts", "status", "words"),
    [
        (RuntimeFacts(True, frozenset({"runc"}), "/usr/bin/" + NVIDIA_HOOK, None), PASSED, "/usr/bin/" + NVIDIA_HOOK),
        (RuntimeFacts(True, frozenset({"runc"}), None, None), FAILED, f"no {NVIDIA_HOOK} on the Docker daemon's PATH"),
        (RuntimeFacts(True, frozenset({"runc", "nvidia"}), None, None), WARNING, "an nvidia runtime is registered"),
        (RuntimeFacts(True, frozenset({"runc"}), None, "/usr/bin/nvidia-ctk"), FAILED, "only the toolkit's base"),
        (RuntimeFacts(False, frozenset({"nvidia"}), None, None), PASSED, "lists an nvidia runtime"),
        (RuntimeFacts(False, frozenset({"runc"}), None, None), WARNING, "cannot be checked from here"),
    ],
)
def test_nvidia_runtime_verdicts(facts: RuntimeFacts, status: str, words: str) -> None:
    finding = nvidia_runtime_finding(facts)
    assert finding.status == status and words in finding.detail
    if status == FAILED:
        assert "nvidia-ctk runtime configure --runtime=docker" in finding.fix and "restart Docker" in finding.fix


def test_a_gpu_without_a_recipe_is_only_a_warning_beside_one_with_a_recipe() -> None:
    gpus = [gpu("6.1", "550.54.14"), Gpu("1", "NVIDIA H200", "9.0", 1, "580")]
    statuses = {finding.check: finding.status for finding in gpu_findings(recipes(), gpus)}
    assert statuses == {"GPU 0": PASSED, "recipe for GPU 0": PASSED, "GPU 1": PASSED, "recipe for GPU 1": WARNING}


# --- the one recipe to build ---

P40_LOCKED_NOTE = "it is locked (built, and every package pinned from that build)"
P40_FALLBACK = "p40 (CUDA 11.8, no lock) fits too, for a driver that cannot run CUDA 12.4"


@pytest.mark.parametrize(
    ("driver", "line"),
    [
        (
            "535.183.01",
            f"recommended: verlbox build p40-cu124: {P40_LOCKED_NOTE}, and driver 535.183.01 runs its CUDA 12.4 "
            "through CUDA minor-version compatibility (>= 525.60.13), full support from 550.54.14; " + P40_FALLBACK,
        ),
        (
            "550.54.14",
            f"recommended: verlbox build p40-cu124: {P40_LOCKED_NOTE}, and driver 550.54.14 runs its CUDA 12.4; "
            + P40_FALLBACK,
        ),
        (
            "520.61.05",
            "recommended: verlbox build p40: driver 520.61.05 runs its CUDA 11.8; it has no lock: `verlbox build p40 "
            "--check` asks whether every pin is served; not p40-cu124: CUDA 12.4 needs driver >= 525.60.13, full "
            "support from 550.54.14",
        ),
    ],
    ids=["p40-driver-535", "p40-driver-550", "p40-driver-520"],
)
def test_one_recipe_is_recommended_by_the_rule(driver: str, line: str) -> None:
    """Both P40 recipes run on 535 (CUDA 12.4 through compatibility): the locked one is named, with why, and p40
    as the recipe for a driver that cannot run 12.4; a driver below 525 gets p40, saying why not the other."""
    recommendation = recommend([gpu("6.1", driver)], recipes())
    assert recommendation is not None and recommendation.line == line


def test_the_rule_prefers_a_lock_then_full_driver_support_then_the_newer_cuda(tmp_path: Path) -> None:
    """Recipe files of a user's own, copies of the shipped two: whether each is locked is whether a lock lies
    beside it."""
    shutil.copy(REPO / "recipes" / "_verl-0.4.1.yaml", tmp_path)
    for name, shipped in (("new-locked", "p40-cu124"), ("new", "p40-cu124"), ("old", "p40")):
        shutil.copy(REPO / "recipes" / f"{shipped}.yaml", tmp_path / f"{name}.yaml")
    shutil.copy(REPO / "recipes" / "p40-cu124.lock.json", tmp_path / "new-locked.lock.json")
    locked, new, old = (load_recipe(str(tmp_path / f"{name}.yaml")) for name in ("new-locked", "new", "old"))
    assert (locked.cuda.version, new.cuda.version, old.cuda.version) == ("12.4", "12.4", "11.8")

    def chosen(driver: str, *candidates: object) -> str:
        recommendation = recommend([gpu("6.1", driver)], list(candidates))
        assert recommendation is not None
        return recommendation.recipe

    assert chosen("535.183.01", old, locked, new) == "new-locked"  # a lock first, even through compatibility
    assert chosen("535.183.01", new, old) == "old"  # no lock: 535 runs 11.8 fully, 12.4 only through compatibility
    assert chosen("550.54.14", old, new) == "new"  # both fully: the newer CUDA
    assert chosen("520.61.05", locked, old) == "old"  # a lock is no use on a driver that cannot run its CUDA


def test_the_quickstart_builds_what_doctor_recommends_for_a_p40() -> None:
    """The README's quickstart leads with one build: the recipe doctor names on a P40's usual drivers."""
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    builds = [line.split()[2] for line in quickstart.splitlines() if line.startswith("verlbox build ")]
    assert builds, quickstart
    for nvidia_smi in (P40_535, P40_550):
        recommendation = recommend(parse_nvidia_smi(nvidia_smi), recipes())
        assert recommendation is not None and set(builds) == {recommendation.recipe}


def test_no_recommendation_where_no_recipe_runs() -> None:
    assert recommend([gpu("9.0", "580.159.04", "NVIDIA H200")], recipes()) is None
    assert recommend([gpu("6.1", "418.226.00")], recipes()) is None
    assert recommend([], recipes()) is None


# --- the command, against the real engine ---


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def doctor(tmp_path: Path, nvidia_smi: str | None, hook: bool) -> subprocess.CompletedProcess[str]:
    """`verlbox doctor` with PATH holding only docker and the fakes: no real nvidia-smi can answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = shutil.which("docker")
    assert docker is not None
    (bin_dir / "docker").symlink_to(docker)
    if nvidia_smi is not None:
        _executable(bin_dir / "nvidia-smi", f"#!/bin/sh\necho '{nvidia_smi}'\n")
    if hook:
        _executable(bin_dir / NVIDIA_HOOK, "#!/bin/sh\nexit 0\n")
    return run_verlbox("doctor", env={"PATH": str(bin_dir)})


def rows(output: str) -> dict[str, tuple[str, str]]:
    """check -> (result, detail) from the printed table."""
    table = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 3 and cells[1] in (PASSED, FAILED, WARNING, "skipped"):
            table[cells[0]] = (cells[1], cells[2])
    return table


def test_real_engine_passes_and_the_missing_nvidia_runtime_fails_with_its_fix(
    docker_engine: object, compose_cli: None, tmp_path: Path
) -> None:
    if shutil.which(NVIDIA_HOOK, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip(f"this host has {NVIDIA_HOOK}: the missing-runtime verdict cannot be seen here")
    result = doctor(tmp_path, P40_550, hook=False)
    assert result.returncode == 1, result.stdout + result.stderr
    table = rows(result.stdout)
    assert table["Docker engine"][0] == PASSED and table["Docker engine"][1].startswith("Docker Engine ")
    assert table["buildx"][0] == PASSED and table["compose"][0] == PASSED
    assert table["NVIDIA runtime"] == (
        FAILED,
        f"no {NVIDIA_HOOK} on the Docker daemon's PATH, so Docker cannot give containers a GPU",
    )
    fixes = [line for line in result.stdout.splitlines() if line.startswith("NVIDIA runtime: ")]
    assert fixes == [
        "NVIDIA runtime: install the NVIDIA Container Toolkit (package nvidia-container-toolkit), run "
        "`sudo nvidia-ctk runtime configure --runtime=docker`, then restart Docker (`sudo systemctl restart docker`)"
    ]
    assert table["recipe for GPU 0"] == (PASSED, "p40 (CUDA 11.8); p40-cu124 (CUDA 12.4)")  # the GPU itself is fine
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("nvidia_smi", "returncode", "verdict"),
    [
        (
            P40_535,
            0,
            (
                PASSED,
                "p40 (CUDA 11.8); p40-cu124 (CUDA 12.4, through CUDA minor-version compatibility (>= 525.60.13), "
                "full support from 550.54.14)",
            ),
        ),
        (P40_550, 0, (PASSED, "p40 (CUDA 11.8); p40-cu124 (CUDA 12.4)")),
        (
            H200,
            1,
            (
                FAILED,
                "no shipped recipe targets compute capability 9.0 (NVIDIA H200; the shipped ones target 6.1)",
            ),
        ),
    ],
    ids=["p40-driver-535", "p40-driver-550", "h200"],
)
def test_recipe_verdict_and_exit_code_per_gpu(
    docker_engine: object, compose_cli: None, tmp_path: Path, nvidia_smi: str, returncode: int, verdict: tuple
) -> None:
    result = doctor(tmp_path, nvidia_smi, hook=True)
    table = rows(result.stdout)
    assert result.returncode == returncode, result.stdout + result.stderr
    assert table["NVIDIA runtime"][0] == PASSED
    assert table["recipe for GPU 0"] == verdict
    name, capability, memory, driver = nvidia_smi.split(", ")[1:]
    gib = f"{int(memory) / 1024:.1f} GiB"
    assert table["GPU 0"] == (PASSED, f"{name}, compute capability {capability}, {gib}, driver {driver}")
    fixes = [line for line in result.stdout.splitlines() if line.startswith("recipe for GPU 0: ")]
    last = result.stdout.strip().splitlines()[-1]
    if returncode:
        assert fixes == [
            "recipe for GPU 0: write a recipe with target_gpus: ['9.0'] (README: Recipes), "
            "or use a GPU of compute capability 6.1"
        ]
        assert last.startswith("recommended: verlbox build p40-cu124: no recipe runs on this host's GPUs, ")
    else:
        assert fixes == []
        # the line a user acts on comes last, and names one recipe
        recommendation = recommend(parse_nvidia_smi(nvidia_smi), recipes())
        assert recommendation is not None and last == recommendation.line
        assert last.startswith("recommended: verlbox build p40-cu124: it is locked")


def test_no_nvidia_smi_at_all_says_so(docker_engine: object, compose_cli: None, tmp_path: Path) -> None:
    result = doctor(tmp_path, NO_GPU, hook=True)
    assert result.returncode == 1
    table = rows(result.stdout)
    assert table["GPUs"] == (FAILED, "no nvidia-smi on PATH: no NVIDIA driver on this host")
    assert not any(check.startswith("recipe for") for check in table)
    assert "GPUs: install the NVIDIA driver so that `nvidia-smi` works" in result.stdout


def test_a_failing_nvidia_smi_is_one_row(docker_engine: object, compose_cli: None, tmp_path: Path) -> None:
    bin_dir = tmp_path / "fake"
    bin_dir.mkdir()
    _executable(
        bin_dir / "nvidia-smi",
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n",
    )
    docker = shutil.which("docker")
    assert docker is not None
    (bin_dir / "docker").symlink_to(docker)
    result = run_verlbox("doctor", env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert rows(result.stdout)["GPUs"] == (
        FAILED,
        "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.",
    )


def test_a_host_without_docker_gets_rows_not_a_traceback(tmp_path: Path) -> None:
    """As on the lent GPU machine: a driver and a GPU, no Docker at all (docs/gpu-runs/doctor-h200.txt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", f"#!/bin/sh\necho '{P40_550}'\n")
    result = run_verlbox("doctor", env={"PATH": str(bin_dir)})
    assert result.returncode == 1 and "Traceback" not in result.stderr and "internal error" not in result.stderr
    table = rows(result.stdout)
    assert table["Docker engine"] == (FAILED, "no docker command on PATH")
    assert table["buildx"][0] == FAILED and table["compose"][0] == FAILED
    assert table["recipe for GPU 0"][0] == PASSED
    assert result.stdout.strip().splitlines()[-1].startswith("recommended: verlbox build p40-cu124: ")


OLD_NVIDIA_SMI = """#!/bin/sh
# driver 470's nvidia-smi: no compute_cap field
case "$1" in
  *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.'; exit 2 ;;
esac
echo '0, Tesla P40, 24451, 470.256.02'
echo '1, Quadro K620, 2000, 470.256.02'
"""


def test_a_driver_too_old_to_report_compute_capability_still_gets_a_verdict(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", OLD_NVIDIA_SMI)
    result = run_verlbox("doctor", env={"PATH": str(bin_dir)})
    assert "Traceback" not in result.stderr
    table = rows(result.stdout)
    assert table["GPU 0"] == (PASSED, "Tesla P40, compute capability 6.1, 23.9 GiB, driver 470.256.02")
    # CUDA 11.8 runs on 470 through minor-version compatibility; CUDA 12.4 needs >= 525
    assert table["recipe for GPU 0"][0] == PASSED and table["recipe for GPU 0"][1].startswith("p40 (CUDA 11.8")
    assert "not p40-cu124" in table["recipe for GPU 0"][1]
    assert table["recipe for GPU 1"][0] == WARNING and "does not know Quadro K620's" in table["recipe for GPU 1"][1]
    assert result.stdout.strip().splitlines()[-1] == (
        "recommended: verlbox build p40: driver 470.256.02 runs its CUDA 11.8 through CUDA minor-version "
        "compatibility (>= 450.80.02), full support from 520.61.05; it has no lock: `verlbox build p40 --check` asks "
        "whether every pin is served; not p40-cu124: CUDA 12.4 needs driver >= 525.60.13, full support from 550.54.14"
    )


def test_a_host_without_a_gpu_still_ends_with_the_recipe_to_build(tmp_path: Path) -> None:
    """A build-only host (no nvidia-smi, no Docker here either): the README promises it the recipe line too,
    with the driver the GPU host needs, each floor named for what it is."""
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_verlbox("doctor", env={"PATH": str(empty)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        "recommended: verlbox build p40-cu124: no GPU answers here, so this host builds for another: it is locked "
        "(built, and every package pinned from that build); that host's GPU of compute capability 6.1 needs a "
        "driver that runs CUDA 12.4 (from 525.60.13 through CUDA's minor-version compatibility, fully from "
        "550.54.14; `verlbox doctor` there says)"
    )
