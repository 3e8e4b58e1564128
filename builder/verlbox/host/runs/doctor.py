"""`verlbox doctor`: can this host build and run verlbox images, and which shipped recipe fits each GPU?

Facts are gathered once (the engine's info, nvidia-smi's table); each verdict is a plain function of
them, so tests can feed the facts of hosts they are not. Output: one table (check / result / detail),
one line per problem with its fix, then the one recipe to build when any fits (`recommend`: where
several fit, a user should not have to weigh them). Exit 0 only when a build and a GPU run can work.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verlbox.errors import VerlboxError
from verlbox.host.building.diskspace import GIB, local_data_folder
from verlbox.host.recipes.recipe import RecipeHead, load_recipe, recipe_names
from verlbox.runtime.gpu import CUDA_MIN_DRIVER

PASSED, WARNING, FAILED, SKIPPED = "passed", "warning", "failed", "skipped"
COLOURS = {PASSED: "green", WARNING: "yellow", FAILED: "red", SKIPPED: "yellow"}

# Docker (since 19.03; 26 here) registers its "nvidia" device driver, which `--gpus` and compose's
# `driver: nvidia` reservation need, only when this hook is on dockerd's PATH as the daemon starts.
# An `nvidia` entry in `docker info`'s Runtimes alone is not enough, and CDI specs serve only
# `driver: cdi` requests, which the shipped compose.yaml does not make.
NVIDIA_HOOK = "nvidia-container-runtime-hook"
# The PATH systemd gives dockerd; a dockerd started by hand has its starter's PATH, searched first.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNTIME_FIX = (
    "install the NVIDIA Container Toolkit (package nvidia-container-toolkit), run "
    "`sudo nvidia-ctk runtime configure --runtime=docker`, then restart Docker (`sudo systemctl restart docker`)"
)
# compose's `!reset` tag (compose-go v2), which `verlbox shell --no-gpu` uses, arrived in compose 2.24
COMPOSE_RESET = Version("2.24")
# one image build's layers, stages and cache at their peak (docs/benchmarks.md: a 6.9 GB image,
# 17-19 GiB at an offline build's peak)
BUILD_ROOM = 20 * GIB
# NVIDIA's last driver branch for Pascal GPUs (the P40): newer drivers do not list them at all
PASCAL_LAST_BRANCH = "R580"
NVIDIA_SMI_QUERY = "--query-gpu=index,name,compute_cap,memory.total,driver_version"
# drivers before 510 (470 is common on P40s) know no compute_cap field: their GPUs go by name
OLD_DRIVER_QUERY = "--query-gpu=index,name,memory.total,driver_version"
KNOWN_CAPABILITIES = {
    "Tesla P40": "6.1",
    "Tesla P4": "6.1",
    "Tesla P100-PCIE-16GB": "6.0",
    "Tesla P100-PCIE-12GB": "6.0",
    "Tesla P100-SXM2-16GB": "6.0",
    "Tesla M40": "5.2",
    "Tesla M40 24GB": "5.2",
    "Tesla V100-PCIE-16GB": "7.0",
    "Tesla V100-PCIE-32GB": "7.0",
    "Tesla V100-SXM2-16GB": "7.0",
    "Tesla V100-SXM2-32GB": "7.0",
    "Tesla T4": "7.5",
}
UNKNOWN_CAPABILITY = "unknown"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    compute_capability: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class RuntimeFacts:
    """What the host can see of how the engine gives containers a GPU."""

    engine_local: bool  # the engine runs on this machine: its binaries are ours to look at
    runtimes: frozenset[str]  # `docker info`'s Runtimes
    hook: str | None  # nvidia-container-runtime-hook on the daemon's likely PATH (local engine only)
    nvidia_ctk: str | None


class GpuQueryError(VerlboxError):
    pass


class NvidiaRuntimeMissing(VerlboxError):
    pass


# --- the NVIDIA container runtime (also used by `verlbox shell` and `verlbox smoke --gpu`) ---


def runtime_facts(engine: Any) -> RuntimeFacts:
    local = local_data_folder(engine) is not None
    search = os.pathsep.join((os.environ.get("PATH", ""), SERVICE_PATH))
    return RuntimeFacts(
        engine_local=local,
        runtimes=frozenset(engine.info().get("Runtimes") or {}),
        hook=shutil.which(NVIDIA_HOOK, path=search) if local else None,
        nvidia_ctk=shutil.which("nvidia-ctk", path=search) if local else None,
    )


def nvidia_runtime_finding(facts: RuntimeFacts) -> Finding:
    name = "NVIDIA runtime"
    registered = "nvidia" in facts.runtimes
    if not facts.engine_local:
        if registered:
            return Finding(name, PASSED, "the engine runs elsewhere and lists an nvidia runtime")
        return Finding(
            name,
            WARNING,
            "the engine runs on another machine and lists no nvidia runtime: its GPUs cannot be checked from here",
            f"try `docker run --rm --gpus all IMAGE nvidia-smi`; if it fails, on the engine's machine: {RUNTIME_FIX}",
        )
    if facts.hook:
        extra = ", nvidia runtime registered" if registered else ""
        return Finding(name, PASSED, f"{facts.hook} (Docker loads it when it starts){extra}")
    if registered:
        # a packaged Docker (a snap, say) finds the hook on a PATH of its own: Docker's word goes first
        return Finding(
            name,
            WARNING,
            f"an nvidia runtime is registered, but no {NVIDIA_HOOK} is on the usual PATH",
            f"if `docker run --rm --gpus all IMAGE nvidia-smi` fails: {RUNTIME_FIX}",
        )
    detail = f"no {NVIDIA_HOOK} on the Docker daemon's PATH, so Docker cannot give containers a GPU"
    if facts.nvidia_ctk:
        detail += f" ({facts.nvidia_ctk} is there: only the toolkit's base package?)"
    return Finding(name, FAILED, detail, RUNTIME_FIX)


def require_nvidia_runtime(otherwise: str = "", engine: Any | None = None) -> None:
    """Raise one line (what is missing, the fix, then OTHERWISE) when the engine cannot give a container a GPU.

    ENGINE: a docker SDK client already at hand (default: a new one). Passes where the engine runs
    elsewhere and cannot be checked: Docker's own error says more there.
    """
    from verlbox.host.clients.engine import client

    finding = nvidia_runtime_finding(runtime_facts(engine or client()))
    if finding.status == FAILED:
        raise NvidiaRuntimeMissing(f"{finding.detail}: {finding.fix}{otherwise}")


# --- GPUs and recipes ---


def parse_nvidia_smi(text: str, with_capability: bool = True) -> list[Gpu]:
    """nvidia-smi's `--format=csv,noheader,nounits` rows for NVIDIA_SMI_QUERY (or OLD_DRIVER_QUERY)."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        cells = [cell.strip() for cell in row]
        if not with_capability and len(cells) == 4:
            cells.insert(2, KNOWN_CAPABILITIES.get(cells[1], UNKNOWN_CAPABILITY))
        if len(cells) != 5 or not cells[3].isdigit():
            raise GpuQueryError(f"nvidia-smi printed an unexpected row: {', '.join(row)!r}")
        index, name, capability, memory, driver = cells
        gpus.append(Gpu(index, name, capability, int(memory), driver))
    return gpus


def query_gpus() -> list[Gpu]:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        raise GpuQueryError("no nvidia-smi on PATH: no NVIDIA driver on this host")
    run = _nvidia_smi(nvidia_smi, NVIDIA_SMI_QUERY)
    if run.returncode != 0 and "compute_cap" in run.stdout + run.stderr:
        run = _nvidia_smi(nvidia_smi, OLD_DRIVER_QUERY)
        with_capability = False
    else:
        with_capability = True
    if run.returncode != 0:
        said = (run.stderr.strip() or run.stdout.strip()).splitlines()
        raise GpuQueryError(f"nvidia-smi failed (exit {run.returncode}): {said[-1] if said else 'no output'}")
    return parse_nvidia_smi(run.stdout, with_capability)


def _nvidia_smi(nvidia_smi: str, query: str) -> subprocess.CompletedProcess[str]:
    try:
        command = [nvidia_smi, query, "--format=csv,noheader,nounits"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise GpuQueryError("nvidia-smi did not answer in 60 s") from None


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def driver_support(driver: str, cuda: str) -> tuple[bool, str]:
    """Can DRIVER run CUDA's runtime, and a note when only through minor-version compatibility."""
    floors = CUDA_MIN_DRIVER.get(cuda)
    if floors is None:
        return True, f"verlbox knows no driver minimum for CUDA {cuda}"
    have = _version(driver)
    if have is None:
        return False, f"driver version {driver!r} not understood"
    full, compatible = floors
    if have >= Version(full):
        return True, ""
    if have >= Version(compatible):
        return True, f"through CUDA minor-version compatibility (>= {compatible}), full support from {full}"
    return False, f"needs driver >= {compatible}, full support from {full}"


def recipe_finding(gpu: Gpu, recipes: list[RecipeHead]) -> Finding:
    """Which shipped recipes target this GPU's compute capability and run on its driver."""
    check = f"recipe for GPU {gpu.index}"
    if gpu.compute_capability == UNKNOWN_CAPABILITY:
        return Finding(
            check,
            FAILED,
            f"driver {gpu.driver} does not report compute capabilities, and verlbox does not know {gpu.name}'s",
            f"look it up in NVIDIA's list of CUDA GPUs, or upgrade the driver to >= 510 (Pascal: up to branch "
            f"{PASCAL_LAST_BRANCH})",
        )
    targeting = [recipe for recipe in recipes if gpu.compute_capability in recipe.target_gpus]
    if not targeting:
        targets = sorted({target for recipe in recipes for target in recipe.target_gpus})
        return Finding(
            check,
            FAILED,
            f"no shipped recipe targets compute capability {gpu.compute_capability} ({gpu.name}; "
            f"the shipped ones target {', '.join(targets)})",
            f"write a recipe with target_gpus: ['{gpu.compute_capability}'] (README: Recipes), "
            f"or use a GPU of compute capability {' or '.join(targets)}",
        )
    fits, misfits = [], []
    for recipe in targeting:
        runs, note = driver_support(gpu.driver, recipe.cuda.version)
        text = f"{recipe.name} (CUDA {recipe.cuda.version}{', ' + note if note else ''})"
        (fits if runs else misfits).append(text)
    if not fits:
        return Finding(
            check,
            FAILED,
            f"driver {gpu.driver} is too old for every recipe: {'; '.join(misfits)}",
            f"upgrade the NVIDIA driver (for Pascal, up to branch {PASCAL_LAST_BRANCH}, the last with Pascal support)",
        )
    detail = "; ".join(fits) + (f"; not {'; '.join(misfits)}" if misfits else "")
    return Finding(check, PASSED, detail)


def gpu_query_finding(problem: GpuQueryError) -> Finding:
    return Finding(
        "GPUs",
        FAILED,
        str(problem),
        f"install the NVIDIA driver so that `nvidia-smi` works (Pascal GPUs such as the P40: "
        f"branch {PASCAL_LAST_BRANCH} or older)",
    )


def gpu_findings(recipes: list[RecipeHead], gpus: list[Gpu]) -> list[Finding]:
    if not gpus:
        return [Finding("GPUs", FAILED, "nvidia-smi lists no GPU", "check that the GPU is seated and powered")]
    findings = []
    for gpu in gpus:
        memory = f"{gpu.memory_mib / 1024:.1f} GiB"
        findings.append(
            Finding(
                f"GPU {gpu.index}",
                PASSED,
                f"{gpu.name}, compute capability {gpu.compute_capability}, {memory}, driver {gpu.driver}",
            )
        )
        findings.append(recipe_finding(gpu, recipes))
    return _at_least_one_fit(findings)


def _at_least_one_fit(findings: list[Finding]) -> list[Finding]:
    """A GPU no recipe fits is only a warning while another GPU has a recipe: training can use that one."""
    verdicts = [finding for finding in findings if finding.check.startswith("recipe for ")]
    if not any(verdict.status == PASSED for verdict in verdicts):
        return findings
    return [Finding(f.check, WARNING, f.detail, f.fix) if f in verdicts and f.status == FAILED else f for f in findings]


# --- the one recipe to build ---


@dataclass(frozen=True)
class Recommendation:
    recipe: str
    reason: str

    @property
    def line(self) -> str:
        return f"recommended: verlbox build {self.recipe}: {self.reason}"


def _is_locked(recipe: RecipeHead) -> bool:
    return recipe.lock_path is not None and recipe.lock_path.is_file()


def _cuda(recipe: RecipeHead) -> Version:
    return _version(recipe.cuda.version) or Version("0")


def _runs_on(recipe: RecipeHead, gpus: list[Gpu]) -> list[Gpu]:
    """The GPUs RECIPE targets whose driver runs its CUDA."""
    return [
        gpu
        for gpu in gpus
        if gpu.compute_capability in recipe.target_gpus and driver_support(gpu.driver, recipe.cuda.version)[0]
    ]


def recommend(gpus: list[Gpu], recipes: list[RecipeHead]) -> Recommendation | None:
    """The recipe to build, by one rule. Of the recipes that run on the most GPUs here: a locked one first (an
    image of it was built and every package pinned from that build, so a build installs exactly what was
    built and tested before), then one whose CUDA the driver supports fully rather than through CUDA's
    minor-version compatibility, then the newer CUDA. None when no recipe runs on any GPU (the rows say why)."""
    runs_on = {recipe.name: _runs_on(recipe, gpus) for recipe in recipes}
    most = max(map(len, runs_on.values()), default=0)
    if most == 0:
        return None

    def rank(recipe: RecipeHead) -> tuple[bool, bool, Version]:
        full = all(driver_support(gpu.driver, recipe.cuda.version) == (True, "") for gpu in runs_on[recipe.name])
        return _is_locked(recipe), full, _cuda(recipe)

    *others, chosen = sorted((recipe for recipe in recipes if len(runs_on[recipe.name]) == most), key=rank)
    driver = runs_on[chosen.name][0].driver  # one host, one driver
    support = driver_support(driver, chosen.cuda.version)[1]
    runs = f"driver {driver} runs its CUDA {chosen.cuda.version}" + (f" {support}" if support else "")
    if _is_locked(chosen):
        reasons = [f"it is locked (built, and every package pinned from that build), and {runs}"]
    else:
        reasons = [f"{runs}; it has no lock: `verlbox build {chosen.name} --check` asks whether every pin is served"]
    for other in reversed(others):  # the next best first
        what = f"{other.name} (CUDA {other.cuda.version}{'' if _is_locked(other) else ', no lock'}) fits too"
        if _cuda(other) < _cuda(chosen):
            what += f", for a driver that cannot run CUDA {chosen.cuda.version}"
        reasons.append(what)
    targeted = {gpu.compute_capability for gpu in gpus}
    for recipe in recipes:  # aimed at these GPUs, but their driver is too old for it
        if not runs_on[recipe.name] and targeted & set(recipe.target_gpus):
            reasons.append(
                f"not {recipe.name}: CUDA {recipe.cuda.version} {driver_support(driver, recipe.cuda.version)[1]}"
            )
    return Recommendation(chosen.name, "; ".join(reasons))


def recommend_elsewhere(recipes: list[RecipeHead], why: str) -> Recommendation:
    """Where no GPU here can judge (WHY: none answers, or none runs a recipe): the recipe to build for a GPU
    host elsewhere, by the same rule's first and last steps (a locked one, then the newer CUDA), and the
    driver that host needs, each floor named for what it is."""
    chosen = max(recipes, key=lambda recipe: (_is_locked(recipe), _cuda(recipe)))
    cuda = chosen.cuda.version
    locked = "it is locked (built, and every package pinned from that build)" if _is_locked(chosen) else "no lock"
    floors = CUDA_MIN_DRIVER.get(cuda)
    driver = (
        f"from {floors[1]} through CUDA's minor-version compatibility, fully from {floors[0]}"
        if floors
        else "a driver verlbox has no floor for"
    )
    gpus = ", ".join(chosen.target_gpus)
    return Recommendation(
        chosen.name,
        f"{why}, so this host builds for another: {locked}; that host's GPU of compute capability {gpus} needs "
        f"a driver that runs CUDA {cuda} ({driver}; `verlbox doctor` there says)",
    )


# --- Docker engine, plugins, disk ---


def engine_finding() -> tuple[Finding, Any | None]:
    from verlbox.host.clients.engine import EngineError, client

    if shutil.which("docker") is None:
        return Finding(
            "Docker engine",
            FAILED,
            "no docker command on PATH",
            "install Docker Engine with its CLI (Debian: docker.io, or Docker's docker-ce packages)",
        ), None
    try:
        engine = client()
    except EngineError as exc:
        return Finding(
            "Docker engine",
            FAILED,
            str(exc),
            "start it (`sudo systemctl start docker`), or set DOCKER_HOST; "
            "'permission denied': add yourself to the docker group",
        ), None
    version = engine.version()
    return Finding("Docker engine", PASSED, f"Docker Engine {version['Version']} (API {version['ApiVersion']})"), engine


def _plugin_version(*words: str) -> str | None:
    if shutil.which("docker") is None:  # the engine row says how to install it
        return None
    run = subprocess.run(["docker", *words], capture_output=True, text=True, timeout=60, check=False)
    return run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else None


def buildx_finding() -> Finding:
    said = _plugin_version("buildx", "version")  # "github.com/docker/buildx 0.13.1 ..."
    if said is None:
        return Finding(
            "buildx",
            FAILED,
            "`docker buildx` is missing (verlbox builds with BuildKit)",
            "install the buildx plugin (Debian: docker-buildx, or Docker's docker-buildx-plugin)",
        )
    words = said.split()
    return Finding("buildx", PASSED, f"buildx {words[1] if len(words) > 1 else said}")


def compose_finding() -> Finding:
    said = _plugin_version("compose", "version", "--short")  # "2.26.1-4", "v2.27.0"
    if said is None:
        return Finding(
            "compose",
            FAILED,
            "`docker compose` (v2) is missing (`docker compose up train` and `verlbox shell` use it)",
            "install compose v2 (Debian: docker-compose 2.x, or Docker's docker-compose-plugin)",
        )
    release = re.match(r"v?(\d+\.\d+)", said)
    if release and Version(release.group(1)) < COMPOSE_RESET:
        return Finding(
            "compose",
            WARNING,
            f"compose {said}: `verlbox shell --no-gpu` needs >= {COMPOSE_RESET} (its `!reset` tag)",
            f"upgrade compose to >= {COMPOSE_RESET}",
        )
    return Finding("compose", PASSED, f"compose {said}")


def disk_finding(engine: Any) -> Finding:
    root = local_data_folder(engine)
    if root is None:
        return Finding("disk", SKIPPED, "the engine runs on another machine: its disk is not checked from here")
    free = shutil.disk_usage(root).free
    detail = f"{free / GIB:.1f} GiB free in {root} (Docker's data folder)"
    if free < BUILD_ROOM:
        return Finding(
            "disk",
            WARNING,
            f"{detail}; an image build needs about {BUILD_ROOM / GIB:.0f} GiB",
            "free space: `docker system df` shows what holds it, `docker buildx prune` frees BuildKit's cache",
        )
    return Finding("disk", PASSED, detail)


def host_findings() -> tuple[list[Finding], Recommendation]:
    engine_row, engine = engine_finding()
    findings = [engine_row, buildx_finding(), compose_finding()]
    if engine is None:
        findings.append(Finding("NVIDIA runtime", SKIPPED, "no Docker engine to ask"))
    else:
        findings += [nvidia_runtime_finding(runtime_facts(engine)), disk_finding(engine)]
    recipes = [load_recipe(name) for name in recipe_names()]
    try:
        gpus = query_gpus()
    except GpuQueryError as exc:
        return [*findings, gpu_query_finding(exc)], recommend_elsewhere(recipes, "no GPU answers here")
    chosen = recommend(gpus, recipes) or recommend_elsewhere(recipes, "no recipe runs on this host's GPUs")
    return findings + gpu_findings(recipes, gpus), chosen


def print_findings(findings: list[Finding], console: Console) -> None:
    table = Table("check", "result", "detail")
    for finding in findings:
        table.add_row(finding.check, f"[{COLOURS[finding.status]}]{finding.status}[/]", escape(finding.detail))
    console.print(table)
    for finding in findings:
        if finding.fix:
            console.print(f"{finding.check}: {finding.fix}", markup=False)


def doctor(args: argparse.Namespace) -> int:
    # piped output keeps every detail whole on one line: no wrapping at 80 columns, no ellipsis
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)
    findings, recommendation = host_findings()
    print_findings(findings, console)
    console.print(recommendation.line, markup=False)  # last, on every host: the line a user acts on
    return 1 if any(finding.status == FAILED for finding in findings) else 0
