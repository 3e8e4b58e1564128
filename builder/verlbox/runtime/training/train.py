"""The image's `train` entrypoint: preflight, model and data on demand, then verl's main_ppo with the profile."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from verlbox import __version__
from verlbox.errors import PreflightFailed, RunHalted, UsageError, VerlboxError
from verlbox.runtime.training import (
    checkpoints,
    cluster,
    environment,
    hub,
    preflight,
    progress,
    prompt_lengths,
    run_record,
    supervisor,
    utilization,
)
from verlbox.runtime.training import console as console_guard
from verlbox.runtime.training.data import prepare_gsm8k
from verlbox.runtime.training.memory_cap import SITECUSTOMIZE_DIR
from verlbox.runtime.training.overrides import (
    OverrideError,
    check_overrides,
    merge_overrides,
    override_int,
    override_value,
    verl_config_dir,
)
from verlbox.runtime.training.patches import patch_set_for
from verlbox.runtime.training.profile import Topology, TrainingPlan, batch_problems
from verlbox.runtime.training.save_watch import SaveWatch
from verlbox.runtime.training.spec import ImageSpec

DEFAULT_RAW_GSM8K = "/data/gsm8k-raw"
MODEL_KEY = "actor_rollout_ref.model.path"
DATA_KEYS = ("data.train_files", "data.val_files")
# compose mounts the run folder's models/ and data/ here: a failed fetch names the folder as the host sees it
RUN_FOLDER_MOUNTS = {Path("/models"): "models", Path("/data"): "data"}
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
RAY_OVERRIDE_JOB_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
PROGRESS_MODE = "VERLBOX_PROGRESS"
CLUSTER_WAIT = "VERLBOX_CLUSTER_WAIT_S"
NVIDIA_SMI_TIMEOUT_S = 60
# `nvidia-smi -L`: "GPU 0: Tesla P40 (UUID: GPU-...)"; MIG devices are indented lines under their GPU
LISTED_GPU = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[^)\s]+)\)")
# a MIG instance, listed under its GPU when MIG is on: CUDA_VISIBLE_DEVICES may name it by this UUID
LISTED_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


def data_files(overrides: list[str]) -> list[Path]:
    """The parquet files verl trains and validates on, as the overrides name them."""
    return [Path(v) for key in DATA_KEYS if (v := override_value(overrides, key))]


def verified_overrides(plan: TrainingPlan, user: list[str]) -> list[str]:
    overrides = merge_overrides(plan.overrides, user)
    config = check_overrides(
        overrides,
        verl_config_dir(plan.spec.verl),
        patch_set_for(plan.spec.verl),
        plan.oldest_target,
        flash_attn_installed=importlib.util.find_spec("flash_attn") is not None,
        vllm_kernels_for=plan.spec.vllm_kernels_for,
    )
    from omegaconf import OmegaConf

    world_size = OmegaConf.select(config, "trainer.n_gpus_per_node") * OmegaConf.select(config, "trainer.nnodes")
    problems = batch_problems(lambda key: OmegaConf.select(config, key, default=None), world_size)
    if problems:
        raise OverrideError("\n".join(problems))
    return overrides


def visible_gpus(environ: Mapping[str, str]) -> tuple[int, str]:
    """The GPUs verl's CUDA will see here, and how they were counted: those the driver's nvidia-smi lists (in a
    container, the runtime has mounted only those compose reserved, so NVIDIA_VISIBLE_DEVICES is not read again,
    and the CUDA images set it to `all` whatever was reserved), narrowed by CUDA_VISIBLE_DEVICES. Not torch:
    `train` supervises the run for its whole life, and torch's import would stay in it for nothing."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"no GPU counted here: nvidia-smi -L could not run ({exc})"
    if listing.returncode != 0:
        said = (listing.stderr or listing.stdout).strip().splitlines()
        return 0, f"no GPU counted here: nvidia-smi -L failed ({said[-1] if said else f'exit {listing.returncode}'})"
    lines = listing.stdout.splitlines()
    gpus = [match.group(1) for line in lines if (match := LISTED_GPU.match(line))]
    migs = [match.group(1) for line in lines if (match := LISTED_MIG.match(line))]
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    count = len(gpus) if chosen is None else cuda_visible(chosen, gpus, migs)
    return count, f"{count} GPU(s) visible here"


def cuda_visible(setting: str, gpus: list[str], migs: Sequence[str] = ()) -> int:
    """How many of GPUS (their UUIDs) CUDA_VISIBLE_DEVICES=SETTING leaves to CUDA, as CUDA reads it: entries up to
    the first that names none of them, each an index or the start of one UUID; a GPU named twice leaves none. A MIG
    instance (MIGS) counts as one device, and CUDA 11 and 12 enumerate one MIG instance at most."""
    chosen: list[str] = []
    for entry in (part.strip() for part in setting.split(",")):
        matches = [gpu for gpu in gpus if gpu.startswith(entry)] if entry.startswith("GPU-") else []
        if entry.startswith("MIG-") and not any(found.startswith("MIG-") for found in chosen):
            matches = [mig for mig in migs if mig.startswith(entry)]
        if entry.isdigit() and int(entry) < len(gpus):
            matches = [gpus[int(entry)]]
        if len(matches) != 1:
            break
        if matches[0] in chosen:
            return 0
        chosen.append(matches[0])
    return len(chosen)


def resolve_topology(
    gpus_per_node: int | None, nodes: int | None, user: list[str], environ: dict[str, str], console: Console
) -> Topology:
    """Flags (or the user's trainer.* overrides) win; else the Ray cluster at RAY_ADDRESS, else this machine."""
    gpus_per_node = gpus_per_node or _user_int(user, "trainer.n_gpus_per_node")
    nodes = nodes or _user_int(user, "trainer.nnodes")
    address = environ.get("RAY_ADDRESS")
    if not address and (nodes or 1) > 1:
        raise UsageError(f"{nodes} nodes need a Ray cluster: set RAY_ADDRESS to its head (docs/cluster.md)")
    if gpus_per_node and (nodes or not address):
        return Topology(gpus_per_node, nodes or 1, "given")
    if address:
        if nodes:
            wait_s = environment.number(environ, CLUSTER_WAIT, 600, minimum=0)
            cluster.wait_for_nodes(nodes, wait_s, console)
        found = cluster.cluster_topology(address)
    else:
        count, counted = visible_gpus(environ)
        found = Topology(max(count, 1), 1, counted)
    if gpus_per_node or nodes:
        return Topology(
            gpus_per_node or found.gpus_per_node, nodes or found.nodes, f"given; the rest from {found.source}"
        )
    return found


def _user_int(user: list[str], key: str) -> int | None:
    value = override_int(user, key, 0)
    if value < 0:
        raise OverrideError(f"{key}={value}: expected a positive number")
    return value or None


def train_environment(
    plan: TrainingPlan, environ: dict[str, str], gpu_memory_gib: float | None, run_folder: Path | None = None
) -> dict[str, str]:
    # the model and data are on disk by now (prepare_inputs): verl and transformers never need the hub
    worker_env = dict(plan.environment) | {"HF_HUB_OFFLINE": "1"}
    if run_folder:  # verl's tensorboard logger writes here, beside the checkpoints, not under its working folder
        worker_env["TENSORBOARD_DIR"] = str(run_folder / progress.TENSORBOARD_FOLDER)
    if gpu_memory_gib:
        worker_env["VERLBOX_GPU_MEMORY_GIB"] = f"{gpu_memory_gib:g}"
        worker_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITECUSTOMIZE_DIR), environ.get("PYTHONPATH")]))
    env = dict(environ) | worker_env
    if environ.get("RAY_ADDRESS"):
        env[RAY_JOB_CONFIG] = ray_job_config(environ.get(RAY_JOB_CONFIG), worker_env)
        # verl's ray.init sets TOKENIZERS_PARALLELISM too: without this Ray refuses the shared key
        # ("Failed to merge the Job's runtime env"); with it verl's value wins, as when verl starts Ray
        env[RAY_OVERRIDE_JOB_ENV] = "1"
    return env


def ray_job_config(existing: str | None, worker_env: dict[str, str]) -> str:
    """In a running Ray cluster verl's workers start from each node's raylet, not from this process, so
    they would miss the profile's variables (and the memory cap). Ray merges the env_vars of this job
    config (what `ray job submit` uses) into those verl passes to ray.init."""
    config = json.loads(existing or "{}")
    config.setdefault("runtime_env", {}).setdefault("env_vars", {}).update(worker_env)
    return json.dumps(config)


def train_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def run_folder_path(folder: Path) -> str:
    """FOLDER as `verlbox fetch --out` takes it in the run folder on the host (compose's mounts undone)."""
    for mount, name in RUN_FOLDER_MOUNTS.items():
        if folder.is_relative_to(mount):
            return str(name / folder.relative_to(mount))
    return str(folder)


def provide(name: str, source: hub.Source, folder: Path, environ: dict[str, str], console: Console) -> preflight.Check:
    """FOLDER holding SOURCE: fetched from the hub when missing or empty, else checked against its record."""

    def say(text: str) -> None:
        console.print(text, markup=False)

    try:
        detail = hub.ensure(source, folder, hub.Hub.from_environment(environ), say, shown_as=run_folder_path(folder))
    except VerlboxError as exc:
        return preflight.Check(name, False, str(exc))
    say(f"{name}: {detail}")
    return preflight.Check(name, True, detail)


def provide_model(overrides: list[str], environ: dict[str, str], console: Console) -> preflight.Check:
    folder = Path(override_value(overrides, MODEL_KEY) or "")
    return provide("model", hub.source_from_environment("model", environ), folder, environ, console)


def raw_gsm8k_folder(environ: dict[str, str]) -> Path:
    return Path(environ.get("VERLBOX_GSM8K_SOURCE") or DEFAULT_RAW_GSM8K)


def ensure_data(overrides: list[str], environ: dict[str, str], console: Console) -> preflight.Check:
    """verl's parquet files, made from the raw GSM8K download (fetched first when missing) unless already there."""
    files = data_files(overrides)
    raw = raw_gsm8k_folder(environ)
    if all(path.is_file() for path in files):  # opened, not only found: a half-copied file is rebuilt or named
        return preflight.check_data(files, raw, lambda text: console.print(text, markup=False))
    download = provide("data", hub.source_from_environment("data", environ), raw, environ, console)
    if not download.ok:
        return download
    target = files[0].parent
    written = prepare_gsm8k(raw, target)
    console.print(
        f"prepared GSM8K from {raw} into {target}: "
        + ", ".join(f"{name} {rows} rows" for name, (rows, _) in written.items())
    )
    return preflight.Check("data", True, f"prepared from {raw}")


def fit_prompt_length(overrides: list[str], user: list[str], say: Callable[[str], None]) -> list[str]:
    """The profile's data.max_prompt_length lowered to the data's longest prompt; a value the user gave is kept."""
    if override_value(user, prompt_lengths.KEY) is not None:
        return overrides
    files = data_files(overrides)
    model = Path(override_value(overrides, MODEL_KEY) or "")
    prompt_key = override_value(overrides, "data.prompt_key") or "prompt"
    remote_code = (override_value(overrides, "data.trust_remote_code") or "").lower() == "true"
    return prompt_lengths.fitted(overrides, prompt_lengths.measure(files, model, prompt_key, say, remote_code), say)


def prepare_inputs(overrides: list[str], environ: dict[str, str], console: Console) -> list[preflight.Check]:
    """What verl reads, in place before it starts: the model and GSM8K fetched from the hub on first start
    (or checked against what was fetched), then GSM8K made into verl's parquet files."""
    return [provide_model(overrides, environ, console), ensure_data(overrides, environ, console)]


def inputs_ready(overrides: list[str], environ: dict[str, str], console: Console) -> list[preflight.Check]:
    """The inputs in place, and the model checked for every file verl loads or saves with it (on a cluster
    too: a model without generation_config.json fails at the first save, at step 25 of every restart)."""
    model, data = prepare_inputs(overrides, environ, console)
    # a model that is there also has to load; one that could not be fetched is news enough
    if model.ok:
        model = preflight.check_model(Path(override_value(overrides, MODEL_KEY) or ""))
    return [model, data]


def run_preflight(
    plan: TrainingPlan, overrides: list[str], environ: dict[str, str], facts: preflight.GpuFacts, console: Console
) -> list[preflight.Check]:
    """The checks that need no model first: a machine that cannot train is news before a 1 GB download,
    which follows only when they pass (with the model's own check after it)."""
    gpu = preflight.check_gpu_visible(facts, plan.topology.gpus_per_node)
    if not gpu.ok:  # without a GPU the GPU checks only repeat the same news
        return [gpu, preflight.check_shared_memory()]
    checks = [
        gpu,
        preflight.check_compute_capability(facts, plan.spec.target_gpus),
        preflight.check_driver(facts, plan.spec.cuda),
        preflight.check_memory(facts, plan.profile.min_gpu_memory_gib),
        preflight.check_shared_memory(),
    ]
    if not all(check.ok for check in checks):
        return checks
    return [*checks, *inputs_ready(overrides, environ, console)]


def run_cluster_preflight(
    plan: TrainingPlan, overrides: list[str], environ: dict[str, str], memory_cap_gib: float | None, console: Console
) -> list[preflight.Check]:
    """The head's own checks, then every node's facts, gathered by one Ray task on each."""
    topology, spec = plan.topology, plan.spec
    checks = [preflight.check_shared_memory(), *inputs_ready(overrides, environ, console)]
    paths = [override_value(overrides, key) or "" for key in (MODEL_KEY, *DATA_KEYS)]
    folder = Path(override_value(overrides, "trainer.default_local_dir") or "")
    try:
        with cluster.marker_in(folder) as (marker, token):
            nodes = cluster.probe_nodes(marker, paths, memory_cap_gib)
    except OSError as exc:
        return [*checks, preflight.Check("shared checkpoints", False, f"the head cannot write to {folder}: {exc}")]
    answered = [node for node in nodes if not node.error]
    return [
        *checks,
        preflight.check_cluster_probe(nodes),
        preflight.check_cluster_gpus(answered, topology.gpus_per_node, topology.nodes),
        preflight.check_cluster_compute_capability(answered, spec.target_gpus),
        preflight.check_cluster_driver(answered, spec.cuda),
        preflight.check_cluster_memory(answered, plan.profile.min_gpu_memory_gib),
        preflight.check_same_image(answered, spec.recipe_hash),
        preflight.check_shared_checkpoints(answered, str(folder), token),
        preflight.check_node_files(answered),
    ]


def train(
    spec: ImageSpec,
    user_overrides: list[str],
    *,
    dry_run: bool,
    gpu_memory_gib: float | None,
    console: Console,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    profile: str | None = None,
) -> int:
    # a console that dies before verl starts must not end train either (rich would exit 1, and no hold)
    console = console_guard.GuardedConsole(console)  # type: ignore[assignment]

    def say(line: str) -> None:
        console.print(line, markup=False)

    environ = dict(os.environ)
    policy = supervisor.RestartPolicy.from_environment(environ)
    progress_mode(environ)  # a typo is said before the preflight, not after it
    address = environ.get("RAY_ADDRESS")
    if address:
        cluster.connect(address)
    with contextlib.ExitStack() as experiment:
        try:
            topology = resolve_topology(gpus_per_node, nodes, user_overrides, environ, console)
            plan = TrainingPlan(spec, environ, topology, profile)
            overrides = checkpoints.keep_two_at_least(verified_overrides(plan, user_overrides), say)
            console.print(f"training on {topology.describe()}: {topology.world_size} GPU(s)")
            if dry_run:
                width = override_value(overrides, prompt_lengths.KEY)
                if width and override_value(user_overrides, prompt_lengths.KEY) is None:
                    say(f"{prompt_lengths.KEY}={width} at most: at start it is lowered to the data's longest prompt")
                checkpoints.check_resume(overrides, plan.profile.name, environ, say, dry_run=True)
                checkpoints.prepare(overrides, environ, say, dry_run=True)
                print_dry_run(plan, overrides, environ, gpu_memory_gib)
                return 0
            # a second `train` on this experiment is refused, naming the first, before its GPU probe touches the
            # first's GPUs (the folder is verl's default_local_dir, which the prompt-width fit leaves as it is)
            folder = checkpoints.Settings.from_overrides(overrides).local_folder
            experiment.enter_context(run_record.one_train(folder, say))
            for warning in preflight.dead_variables(environ):
                console.print(f"note: {warning}")
            facts = None if address else local_gpu_facts(gpu_memory_gib)
            checks = (
                run_cluster_preflight(plan, overrides, environ, gpu_memory_gib, console)
                if facts is None
                else run_preflight(plan, overrides, environ, facts, console)
            )
        finally:
            if address:
                cluster.disconnect()
        failed = [check for check in checks if not check.ok]
        if failed:
            raise PreflightFailed("\n".join(f"preflight {check.name}: {check.detail}" for check in failed))
        overrides = fit_prompt_length(overrides, user_overrides, say)
        passed = f"preflight: {len(checks)} checks passed ({checks[0].detail})"
        return supervised_run(plan, overrides, environ, facts, gpu_memory_gib, console, policy, passed, say)


def supervised_run(
    plan: TrainingPlan,
    overrides: list[str],
    environ: dict[str, str],
    facts: preflight.GpuFacts | None,
    gpu_memory_gib: float | None,
    console: Console,
    policy: supervisor.RestartPolicy,
    passed: str,
    say: Callable[[str], None],
) -> int:
    """verl under the supervisor, once the preflight passed and the experiment folder is this run's."""
    # a resume with other settings refused before anything changes; then the tracker verl resumes from, the saves
    # it forgot, the room its next saves need: all after the checks, so a machine that cannot train changes nothing
    checkpoints.check_resume(overrides, plan.profile.name, environ, say, dry_run=False)
    checkpoints.prepare(overrides, environ, say, dry_run=False)
    console.print(f"{passed}; starting verl: {plan.profile.description}")
    folder = checkpoints.Settings.from_overrides(overrides).local_folder
    watch = run_watch(folder, overrides, environ, facts, console)
    # from here a dead console must end neither the reader nor the supervisor (its restarts say lines)
    guard = console.guard if isinstance(console, console_guard.GuardedConsole) else console_guard.ConsoleGuard()
    say = (watch.console if watch else guard).guarding(say)
    log = run_record.RunLog(folder, new_run(plan, overrides, environ, facts, gpu_memory_gib), say) if folder else None

    def before_restart(after: str, from_step: int | None) -> None:
        if log:
            log.restarted(after, from_step)
        # a crash can cut a save short: the tracker is repaired and the room checked again before verl resumes
        checkpoints.prepare(overrides, environ, say, dry_run=False)

    sys.stdout.flush()
    # from here no line waits for the console: one that blocks (a stalled terminal, `| less`) must not stall verl
    console_guard.start_relay()
    outcome = "error in verlbox"
    try:
        code = supervisor.supervise(
            train_command(overrides),
            train_environment(plan, environ, gpu_memory_gib, folder),
            policy,
            newest_step=lambda: checkpoints.newest_step(overrides),
            before_restart=before_restart,
            say=say,
            watch=watch,
        )
        outcome = "finished" if code == 0 else f"stopped ({supervisor.describe_exit(code)})"
        return code
    except RunHalted:
        outcome = "halted (crash loop)"
        raise
    except checkpoints.DiskFull:
        outcome = "halted (disk full)"
        raise
    finally:
        if log:
            try:
                log.ended(outcome, checkpoints.newest_step(overrides))
            except (VerlboxError, OSError) as exc:  # a full disk must not hide how the run ended
                say(f"run record: could not note the end ({exc})")
            halted = sys.exc_info()[1]
            if log.unwritten and isinstance(halted, VerlboxError):  # the hold tries it again (commands.train)
                halted.pending_write = log.write_pending  # type: ignore[attr-defined]
        console_guard.settle()  # the run's last lines reach the console before train goes on, unless it blocks


def check_settings(environ: Mapping[str, str]) -> None:
    """The settings compose passed from .env, checked as train's first step: a bad one is named with its key and
    where it was set (exit 2), not met later as a GPU reserved by a 0, a preflight failure or a client's error
    deep in a download. The profile and the memory cap are checked as they are read (commands.train)."""
    environment.check_gpu_count(environ)
    hub.Hub.from_environment(environ)
    supervisor.RestartPolicy.from_environment(environ)
    progress_mode(environ)
    environment.number(environ, CLUSTER_WAIT, 600, minimum=0)


def progress_mode(environ: Mapping[str, str]) -> str:
    mode = environ.get(PROGRESS_MODE) or "compact"
    if mode not in ("compact", "plain"):
        raise UsageError(
            f"{environment.setting(environ, PROGRESS_MODE, mode)}: expected compact (the default) or plain "
            "(verl's own lines)"
        )
    return mode


def run_watch(
    folder: Path | None,
    overrides: list[str],
    environ: dict[str, str],
    facts: preflight.GpuFacts | None,
    console: Console,
) -> progress.RunWatch | None:
    """The compact step line and verl's log in the run folder; VERLBOX_PROGRESS=plain: verl's console as it is,
    still read for its save marker (a stop during a save is held in both)."""
    if folder is None:
        return None
    plain_mode = progress_mode(environ) == "plain"
    limit = None
    if facts and facts.devices:
        limit = facts.memory_cap_gib or min(device.total_gib for device in facts.devices)

    def show(line: Text | str) -> None:
        if plain_mode and isinstance(line, str):  # byte for byte, colours too (rich would strip them)
            console.file.write(line + "\n")
            console.file.flush()
        else:
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    steps = progress.Progress(
        progress.responses_per_step(overrides),
        limit,
        shape=utilization.read_shape(Path(model)) if (model := override_value(overrides, MODEL_KEY)) else None,
        gpus=override_int(overrides, "trainer.n_gpus_per_node", 1) * override_int(overrides, "trainer.nnodes", 1),
        gpu_name=facts.devices[0].name if facts and facts.devices else None,
        epochs={
            "actor": override_int(overrides, "actor_rollout_ref.actor.ppo_epochs", 1),
            "critic": override_int(overrides, "critic.ppo_epochs", 1),
        },
    )
    load_contents = checkpoints.Settings.from_overrides(overrides).load_contents
    if "console" not in (override_value(overrides, "trainer.logger") or "console"):
        console.print(
            "trainer.logger has no console: verl prints no step lines, so there is no compact line and no "
            "metrics.jsonl (its loggers keep the figures); saves and stops work as with it"
        )
    return progress.RunWatch(
        None if plain_mode else folder,
        steps,
        show,
        saves=SaveWatch(folder, load_contents),
        guard=console.guard if isinstance(console, console_guard.GuardedConsole) else None,
    )


def new_run(
    plan: TrainingPlan,
    overrides: list[str],
    environ: dict[str, str],
    facts: preflight.GpuFacts | None,
    gpu_memory_gib: float | None,
) -> run_record.Run:
    """This start's provenance: the image's recipe and patch set, every override, the GPUs, model and data."""
    model = Path(override_value(overrides, MODEL_KEY) or "")
    fetched = hub.recorded(model)  # None for a folder filled by hand
    data_fetched = hub.recorded(raw_gsm8k_folder(environ))
    devices = facts.devices if facts else []
    return run_record.Run(
        started=run_record.now(),
        recipe=plan.spec.name,
        recipe_hash=plan.spec.recipe_hash,
        lock_hash=plan.spec.lock_hash,
        patch_set_hash=patch_set_for(plan.spec.verl).content_hash,
        verlbox=__version__,
        image=environ.get("VERLBOX_IMAGE") or None,
        profile=plan.profile.name,
        overrides=overrides,
        gpus=[run_record.Gpu(name=d.name, capability=d.compute_capability, memory_gib=d.total_gib) for d in devices],
        memory_cap_gib=gpu_memory_gib,
        driver=facts.driver_version if facts else None,
        model=str(model),
        # a record without a commit: copied from a plain folder (fetch --from)
        model_commit=(fetched.commit or None) if fetched else None,
        data_commit=(data_fetched.commit or None) if data_fetched else None,
        data=run_record.file_hashes(data_files(overrides)),
    )


def print_dry_run(
    plan: TrainingPlan, overrides: list[str], environ: dict[str, str], gpu_memory_gib: float | None
) -> None:
    env = train_environment(plan, environ, gpu_memory_gib, checkpoints.Settings.from_overrides(overrides).local_folder)
    command = train_command(overrides)
    changed = {k: v for k, v in env.items() if environ.get(k) != v}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items()))
    print(" \\\n    ".join([f"{prefix} {shlex.join(command[:3])}".strip(), *map(shlex.quote, command[3:])]))


def local_gpu_facts(gpu_memory_gib: float | None) -> preflight.GpuFacts:
    facts = preflight.probe_gpu()
    return dataclasses.replace(facts, memory_cap_gib=gpu_memory_gib) if gpu_memory_gib else facts


def run_local_preflight(
    plan: TrainingPlan, overrides: list[str], environ: dict[str, str], gpu_memory_gib: float | None, console: Console
) -> list[preflight.Check]:
    return run_preflight(plan, overrides, environ, local_gpu_facts(gpu_memory_gib), console)
