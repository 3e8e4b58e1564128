"""Checks run before training: each failure is one sentence, not a Ray traceback ten minutes later.

The GPU is probed once into GpuFacts; every check is a plain function of facts, so tests can feed
the facts of a GPU they do not have.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.version import Version

from verlbox.errors import PreflightFailed
from verlbox.files import unreadable_folder
from verlbox.runtime.gpu import CUDA_MIN_DRIVER, UnsupportedGpu, capability_for, has_code_for
from verlbox.runtime.training import data


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class GpuDevice:
    name: str
    compute_capability: str
    total_gib: float
    free_gib: float


@dataclass(frozen=True)
class GpuFacts:
    devices: list[GpuDevice]
    compiled_archs: list[str]
    driver_cuda: str | None  # CUDA version the driver supports, e.g. "12.4"
    driver_version: str | None  # NVIDIA driver, e.g. "550.54.14"
    memory_cap_gib: float | None = None


def probe_gpu() -> GpuFacts:
    """The GPU facts, asked by a short-lived child process: torch's mem_get_info makes a CUDA context (about
    500 MiB of the GPU), which would otherwise stay with `train`, the process that supervises the whole run."""
    probe = "from verlbox.runtime.training.preflight import print_gpu_facts; print_gpu_facts()"
    try:  # from /: `python -c` puts its folder first on sys.path, and /workspace is the user's
        child = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd="/", timeout=300
        )
    except subprocess.TimeoutExpired:
        raise PreflightFailed("the GPU probe (torch in a child process) gave no answer in 300 s") from None
    try:
        data = json.loads(child.stdout.strip().splitlines()[-1])
        return GpuFacts(**(data | {"devices": [GpuDevice(**device) for device in data["devices"]]}))
    except (IndexError, ValueError, TypeError, KeyError):
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise PreflightFailed(f"the GPU probe (torch in a child process) failed: {last}") from None


def print_gpu_facts() -> None:
    """The child's side of probe_gpu: the facts as one JSON line."""
    print(json.dumps(asdict(probe_gpu_here())))


def probe_gpu_here() -> GpuFacts:
    import torch

    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            free, total = torch.cuda.mem_get_info(index)
            devices.append(
                GpuDevice(properties.name, f"{properties.major}.{properties.minor}", total / 2**30, free / 2**30)
            )
    driver_cuda = _driver_cuda_version() if devices else None
    cap = os.environ.get("VERLBOX_GPU_MEMORY_GIB")
    return GpuFacts(
        devices,
        torch._C._cuda_getArchFlags().split() if torch.version.cuda else [],
        driver_cuda,
        _nvidia_driver_version(),
        float(cap) if cap else None,
    )


def _driver_cuda_version() -> str | None:
    """The CUDA version the installed driver supports, from libcuda itself (cuDriverGetVersion)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    encoded = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(encoded)) != 0:
        return None
    return f"{encoded.value // 1000}.{encoded.value % 1000 // 10}"


def _nvidia_driver_version() -> str | None:
    version_file = Path("/proc/driver/nvidia/version")
    if not version_file.is_file():
        return None
    words = version_file.read_text().split()
    return next((word for word in words if word.count(".") >= 1 and word.replace(".", "").isdigit()), None)


def check_gpu_visible(facts: GpuFacts, gpus_needed: int) -> Check:
    if len(facts.devices) >= gpus_needed:
        names = ", ".join(f"{d.name} (CC {d.compute_capability})" for d in facts.devices)
        return Check("GPU visible", True, names)
    return Check(
        "GPU visible",
        False,
        f"training needs {gpus_needed} GPU(s) but {len(facts.devices)} are visible: "
        "run the container with the GPU reserved (docker compose does; docker run needs --gpus all) "
        "and the NVIDIA container toolkit installed on the host",
    )


def check_compute_capability(facts: GpuFacts, targets: list[str]) -> Check:
    oldest = min(targets, key=Version)
    for device in facts.devices:
        cc = device.compute_capability
        try:
            capability_for(cc)
        except UnsupportedGpu as exc:
            return Check("compute capability", False, f"{device.name}: {exc}")
        if Version(cc) < Version(oldest):
            return Check(
                "compute capability",
                False,
                f"{device.name} has compute capability {cc}, older than this image's target {oldest}",
            )
        if facts.compiled_archs and not has_code_for(cc, facts.compiled_archs):
            return Check(
                "compute capability",
                False,
                f"the installed torch has no code for {device.name} (CC {cc}; it has {' '.join(facts.compiled_archs)})",
            )
    detail = f"targets {', '.join(targets)}"
    newer = [d for d in facts.devices if d.compute_capability not in targets]
    if newer:
        detail += (
            f"; {newer[0].name} is CC {newer[0].compute_capability}: the profile made for "
            f"{oldest} (fp32, sdpa, HF rollout) still runs there, only not at that GPU's best"
        )
    return Check("compute capability", True, detail)


def check_driver(facts: GpuFacts, image_cuda: str) -> Check:
    full, compatible = CUDA_MIN_DRIVER.get(image_cuda, ("?", "?"))
    driver = facts.driver_version or "unknown"
    if facts.driver_cuda is None:
        return Check(
            "driver", False, f"no NVIDIA driver answers; this image needs one for CUDA {image_cuda} (>= {full})"
        )
    have, need = Version(facts.driver_cuda), Version(image_cuda)
    if have >= need:
        return Check("driver", True, f"driver {driver} supports CUDA {facts.driver_cuda} >= {image_cuda}")
    if have.major == need.major:
        return Check(
            "driver",
            True,
            f"driver {driver} supports CUDA {facts.driver_cuda} < {image_cuda}: runs "
            f"through minor-version compatibility (>= {compatible}); upgrade to >= {full} for full support",
        )
    return Check(
        "driver",
        False,
        f"driver {driver} supports CUDA {facts.driver_cuda} only; this image needs "
        f"CUDA {image_cuda}: install driver >= {full} (or use a recipe built for CUDA {facts.driver_cuda})",
    )


def check_memory(facts: GpuFacts, min_gib: float) -> Check:
    for device in facts.devices:
        usable = min(device.free_gib, facts.memory_cap_gib or device.free_gib)
        if usable < min_gib:
            return Check(
                "GPU memory",
                False,
                f"{device.name} has {usable:.1f} GiB free; the profile needs "
                f"{min_gib:g} GiB: stop other GPU processes or use a smaller batch",
            )
    capped = f" (capped at {facts.memory_cap_gib:g} GiB per process)" if facts.memory_cap_gib else ""
    return Check(
        "GPU memory", True, ", ".join(f"{d.free_gib:.1f} of {d.total_gib:.1f} GiB free" for d in facts.devices) + capped
    )


# verl 0.4.1 loads config.json and the tokenizer when it starts, but falls back to a generation config made
# from config.json when generation_config.json is missing; its FSDP checkpoint manager then reads that file
# again at every save (GenerationConfig.from_pretrained(model path)), so such a folder trains until the
# first checkpoint and dies there.
GENERATION_CONFIG = "generation_config.json"
# the JSON files of a model folder that transformers parses, when the folder has them
MODEL_JSON_FILES = (
    "config.json",
    GENERATION_CONFIG,
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def _refill(model_dir: Path) -> str:
    return (
        f"empty {model_dir} and `train` fetches the model, or fill it on a connected machine with "
        f"`verlbox fetch model --out {model_dir}` (README: Model and data)"
    )


def _model_file_problems(model_dir: Path) -> list[str]:
    """One sentence per file verl needs that is missing or does not parse, before transformers is asked."""
    problems: list[str] = []
    if not (model_dir / GENERATION_CONFIG).is_file():
        problems.append(
            f"{model_dir} has no {GENERATION_CONFIG}, which verl reads at every checkpoint save: copy it from "
            f"the model's repository, or {_refill(model_dir)}"
        )
    for name in MODEL_JSON_FILES:
        path = model_dir / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                problems.append(f"{path} does not load as JSON ({exc}): {_refill(model_dir)}")
    return problems


def check_model(model_dir: Path) -> Check:
    if problem := unreadable_folder(model_dir):
        return Check("model", False, problem)
    if not (model_dir / "config.json").is_file():
        return Check("model", False, f"no model in {model_dir} (no config.json): {_refill(model_dir)}")
    if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("pytorch_model*.bin")):
        return Check("model", False, f"{model_dir} has a config.json but no weights (*.safetensors)")
    problems = _model_file_problems(model_dir)
    if problems:
        return Check("model", False, "; ".join(problems))
    try:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        config = AutoConfig.from_pretrained(model_dir)
        AutoTokenizer.from_pretrained(model_dir)
        GenerationConfig.from_pretrained(model_dir)  # what verl's checkpoint save calls
    except Exception as exc:  # any loader failure is the user's model folder, reported in one line
        return Check("model", False, f"{model_dir} does not load with transformers: {exc}")
    return Check("model", True, f"{model_dir} ({config.model_type})")


def _row_counts(files: list[Path]) -> tuple[dict[Path, int], dict[Path, str]]:
    """Each file's row count, read from its footer, or why verl could not read it."""
    rows: dict[Path, int] = {}
    unreadable: dict[Path, str] = {}
    for path in files:
        try:
            rows[path] = data.parquet_rows(path)
        except data.DataError as exc:
            unreadable[path] = str(exc)
    return rows, unreadable


def _data_fix(path: Path, source: Path) -> str:
    if path.name not in data.PREPARED:
        return f"copy it again (verlbox makes only {', '.join(data.PREPARED)})"
    return (
        f"delete it and `train` makes it again (fetching GSM8K into {source} first), or make it with "
        f"`verlbox prepare-data gsm8k --source DIR --out {path.parent}`"
    )


def check_data(files: list[Path], source: Path, say: Callable[[str], None]) -> Check:
    """verl's parquet files open and hold rows: a half-copied file passes an existence check, not verl's loader.

    An unreadable file of those prepare_gsm8k writes is made again from the raw GSM8K download at SOURCE when
    that is there (prepare_gsm8k replaces files through a temporary one, so the broken file is no obstacle);
    every other unreadable file is one sentence."""
    rows, unreadable = _row_counts(files)
    folders = sorted({path.parent for path in unreadable if path.name in data.PREPARED})
    if folders and source.is_dir() and any(source.iterdir()):
        for folder in folders:
            try:
                written = data.prepare_gsm8k(source, folder)
            except data.DataError as exc:
                return Check("data", False, f"{folder} has unreadable files; making them again from {source}: {exc}")
            why = "; ".join(problem for path, problem in unreadable.items() if path.parent == folder)
            made = ", ".join(f"{name} {count} rows" for name, (count, _) in written.items())
            say(f"{why}: made {folder} again from {source} ({made})")
        rows, unreadable = _row_counts(files)
    if unreadable:
        return Check("data", False, "; ".join(f"{why}: {_data_fix(path, source)}" for path, why in unreadable.items()))
    return Check("data", True, ", ".join(f"{path} ({count} rows)" for path, count in rows.items()))


def check_shared_memory(minimum_gib: float = 1.0, shm: Path = Path("/dev/shm")) -> Check:
    if not shm.is_dir():
        return Check("shared memory", True, "no /dev/shm (not in a container)")
    stats = os.statvfs(shm)
    size = stats.f_blocks * stats.f_frsize / 2**30
    if size < minimum_gib:
        return Check(
            "shared memory",
            False,
            f"/dev/shm is {size * 1024:.0f} MiB; Ray needs more: start the "
            "container with --shm-size=10g (compose.yaml sets it)",
        )
    return Check("shared memory", True, f"/dev/shm {size:.1f} GiB")


DEAD_VARIABLES = {
    "VLLM_DTYPE": "vLLM never reads it; the rollout dtype is actor_rollout_ref.rollout.dtype",
    "TRITON_MAX_SHARED_MEMORY": "Triton never reads it; the P40 profile runs no Triton kernels",
}


def dead_variables(environ: dict[str, str]) -> list[str]:
    return [f"{name} is set but {why}" for name, why in DEAD_VARIABLES.items() if name in environ]


@dataclass(frozen=True)
class NodeFacts:
    """What one Ray node reported about itself (cluster.probe_nodes gathers these on every node)."""

    name: str  # hostname and IP, as the user would look for the machine
    gpu: GpuFacts | None = None
    recipe_hash: str | None = None  # of the verlbox image the node runs; None outside one
    marker: str | None = None  # what the node read from the head's marker file; None: not there
    missing: tuple[str, ...] = ()  # model and data paths the node does not have
    error: str | None = None  # the probe itself failed there


def _per_node(name: str, nodes: list[NodeFacts], check: Callable[[NodeFacts], Check], ok_detail: str) -> Check:
    """One check over every node: one sentence naming each node that fails it."""
    failures = [f"{node.name}: {result.detail}" for node in nodes if not (result := check(node)).ok]
    return Check(name, not failures, "; ".join(failures) if failures else ok_detail)


def check_cluster_probe(nodes: list[NodeFacts]) -> Check:
    failed = [f"{node.name} ({node.error})" for node in nodes if node.error]
    if failed:
        return Check(
            "cluster probe",
            False,
            f"verlbox's probe failed on {', '.join(failed)}: start every node from the same verlbox image",
        )
    return Check("cluster probe", True, f"{len(nodes)} node(s) answered")


def check_cluster_gpus(nodes: list[NodeFacts], gpus_per_node: int, nnodes: int) -> Check:
    """verl places n_gpus_per_node workers on each of nnodes nodes, so enough nodes need that many GPUs."""
    # a list, not a dict by name: several nodes may share one host (and so one name)
    counts = [(node.name, len(node.gpu.devices) if node.gpu else 0) for node in nodes]
    fit = [name for name, count in counts if count >= gpus_per_node]
    seen = ", ".join(f"{name} {count}" for name, count in counts)
    if len(fit) >= nnodes:
        return Check("cluster GPUs", True, f"{nnodes} x {gpus_per_node} GPU(s) needed; GPUs per node: {seen}")
    return Check(
        "cluster GPUs",
        False,
        f"training needs {nnodes} node(s) with {gpus_per_node} GPU(s) each but the Ray cluster has "
        f"{len(fit)} (GPUs per node: {seen}): start ray-worker on the other hosts, or pass --nodes/--gpus-per-node",
    )


def _on_gpu_nodes(name: str, nodes: list[NodeFacts], single_host: Callable[[GpuFacts], Check], summary: str) -> Check:
    """A single-host GPU check, run on every node that has GPUs; failures name the node."""
    with_gpus = [node for node in nodes if node.gpu and node.gpu.devices]
    return _per_node(name, with_gpus, lambda node: single_host(node.gpu), summary)  # type: ignore[arg-type]


def check_cluster_compute_capability(nodes: list[NodeFacts], targets: list[str]) -> Check:
    return _on_gpu_nodes(
        "cluster compute capability",
        nodes,
        lambda gpu: check_compute_capability(gpu, targets),
        f"every node's GPUs run this image's code (targets {', '.join(targets)})",
    )


def check_cluster_driver(nodes: list[NodeFacts], image_cuda: str) -> Check:
    return _on_gpu_nodes(
        "cluster driver",
        nodes,
        lambda gpu: check_driver(gpu, image_cuda),
        f"every node's driver runs CUDA {image_cuda}",
    )


def check_cluster_memory(nodes: list[NodeFacts], min_gib: float) -> Check:
    return _on_gpu_nodes(
        "cluster GPU memory", nodes, lambda gpu: check_memory(gpu, min_gib), f"every GPU has {min_gib:g} GiB free"
    )


def check_same_image(nodes: list[NodeFacts], recipe_hash: str) -> Check:
    others = [
        f"{node.name} ({node.recipe_hash or 'no verlbox image'})" for node in nodes if node.recipe_hash != recipe_hash
    ]
    if others:
        return Check(
            "same image",
            False,
            f"the head runs recipe hash {recipe_hash[:12]} but {', '.join(others)} differ: "
            "start every node from the same image (VERLBOX_IMAGE in each host's .env)",
        )
    return Check("same image", True, f"every node runs recipe hash {recipe_hash[:12]}")


def check_shared_checkpoints(nodes: list[NodeFacts], folder: str, token: str) -> Check:
    """verl's ranks each save a shard into one folder and read them all back to resume: it must be shared."""
    blind = [node.name for node in nodes if node.marker != token]
    if blind:
        return Check(
            "shared checkpoints",
            False,
            f"{', '.join(blind)} cannot see the file the head wrote into {folder}: mount one shared folder "
            "(NFS, say) at the same path on every host (VERLBOX_CHECKPOINTS)",
        )
    return Check("shared checkpoints", True, f"{folder} is the same folder on {len(nodes)} node(s)")


def check_node_files(nodes: list[NodeFacts]) -> Check:
    """verl's trainer and workers may land on any node and read the model and data there."""
    lacking = [f"{node.name} lacks {', '.join(node.missing)}" for node in nodes if node.missing]
    if lacking:
        return Check("node files", False, "; ".join(lacking) + ": copy or mount them at the same path on every host")
    return Check("node files", True, "model and data are present on every node")
