"""The smoke checks an image runs on itself: a CPU tier (CI, every change) and a GPU tier (--gpu).

They run inside the image (`verlbox smoke-checks`) or in any Python environment that has the stack,
which is how the GPU tier ran on a GPU machine without Docker.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.version import Version

from verlbox.runtime.checks import learn, rollout
from verlbox.runtime.checks.fixtures import make_gsm8k_jsonl, make_model, make_tokenizer
from verlbox.runtime.gpu import has_code_for
from verlbox.runtime.steps.apex_build import SOURCE_RECORD, fatbin_architectures
from verlbox.runtime.steps.apex_facts import ApexFacts, apex_facts
from verlbox.runtime.training import preflight, prompt_lengths, run_record
from verlbox.runtime.training.data import prepare_gsm8k, to_verl_row, write_parquet
from verlbox.runtime.training.overrides import compose, installed_verl_config_dir, merge_overrides, override_value
from verlbox.runtime.training.patches import PatchState, patch_set_for, verify
from verlbox.runtime.training.profile import TrainingPlan, profile_names
from verlbox.runtime.training.progress import METRICS_FILE, StepRecord, read_metrics, validation_reward
from verlbox.runtime.training.spec import SPEC_VARIABLE, ImageSpec
from verlbox.runtime.training.train import verified_overrides


@dataclass(frozen=True)
class CheckResult:
    tier: str
    name: str
    status: str  # passed, failed, skipped
    detail: str


class Skip(Exception):
    """The check cannot apply here; the message says why."""


def pin_matches(installed: str, pinned: str) -> bool:
    """A pin without a local label (2.6.0) accepts any build of it (2.6.0+cu124); one with a label needs it."""
    have, want = Version(installed), Version(pinned)
    return have.public == want.public and (want.local is None or have.local == want.local)


@dataclass(frozen=True)
class RealModel:
    """A user's own model and GSM8K parquet folder, for the learning check on real data (`--model`)."""

    model: Path
    data: Path
    steps: int = 10


class SmokeContext:
    """Shared, lazily made inputs: fixtures in one temporary folder, the composed profile config."""

    def __init__(self, spec: ImageSpec, workdir: Path, real: RealModel | None = None) -> None:
        self.spec = spec
        self.workdir = workdir
        self.real = real

    @cached_property
    def plan(self) -> TrainingPlan:
        return TrainingPlan(self.spec, {})

    @cached_property
    def site_packages(self) -> Path:
        spec = importlib.util.find_spec("verl")
        if spec is None or spec.origin is None:
            return Path(sysconfig.get_paths()["purelib"])
        return Path(spec.origin).parents[1]

    @cached_property
    def spec_file(self) -> Path:
        """The spec as a file, for the `verlbox train` subprocesses (inside an image it is the baked one)."""
        path = self.workdir / "image-spec.json"
        path.write_text(self.spec.model_dump_json())
        return path

    @cached_property
    def model_dir(self) -> Path:
        return make_model(self.workdir / "tiny-qwen2", "tiny")

    @cached_property
    def task_dir(self) -> Path:
        return learn.make_task(self.workdir / "learn-task")

    @cached_property
    def data_dir(self) -> Path:
        raw = make_gsm8k_jsonl(self.workdir / "gsm8k-raw", train_rows=16, test_rows=8)
        prepare_gsm8k(raw, self.workdir / "gsm8k")
        return self.workdir / "gsm8k"

    def composed(self) -> object:
        """The profile's config with the tiny model in place of the real one."""
        overrides = merge_overrides(
            self.plan.overrides,
            [f"actor_rollout_ref.model.path={self.model_dir}", f"critic.model.path={self.model_dir}"],
        )
        config_dir = installed_verl_config_dir()
        assert config_dir is not None
        return compose(config_dir, overrides)


# ---- CPU tier -------------------------------------------------------------------------------------


def check_pins(ctx: SmokeContext) -> str:
    import torch

    pins = ctx.spec.pins
    installed = {"python": "{}.{}".format(*sys.version_info[:2]), "cuda": torch.version.cuda or "none"}
    wrong = []
    for component, pinned in pins.items():
        if component in ("python", "cuda"):
            ok = installed[component] == pinned
        elif component == "cudnn":
            found = subprocess.run(
                ["dpkg-query", "-W", "-f", "${Version}", "libcudnn8"], capture_output=True, text=True, check=False
            ).stdout.strip()
            installed[component] = found or "absent"
            ok = found.split("-", 1)[0] == pinned
        elif component == "apex":
            installed[component] = apex_source_commit()
            ok = installed[component] == pinned
        else:
            try:
                installed[component] = importlib.metadata.version(component)
            except importlib.metadata.PackageNotFoundError:
                installed[component] = "absent"
                ok = False
            else:
                ok = pin_matches(installed[component], pinned)
        if not ok:
            wrong.append(f"{component} {installed[component]} (recipe pins {pinned})")
    if wrong:
        raise AssertionError("; ".join(wrong))
    loads = torch_cudnn()
    if "cudnn" in pins:
        loads += f"; apt's libcudnn8 {installed['cudnn']} (held) is beside it, and torch does not load it"
    try:
        loads += ", NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        loads += ", no NCCL"
    return f"{len(pins)} pins match; {loads}"


def cudnn_version(number: int) -> str:
    """cuDNN's version integer as major.minor.patch (cuDNN 9 counts major in 10000s, cuDNN 8 in 1000s)."""
    major, rest = (number // 10000, number % 10000) if number >= 90000 else (number // 1000, number % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def torch_cudnn() -> str:
    """Which cuDNN torch loads and where from: its own pip package (nvidia-cudnn-cu1X), or another file."""
    import torch

    number = torch.backends.cudnn.version()  # loads the library
    if number is None:
        return "torch has no cuDNN"
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").is_file() else ""
    loaded = sorted({line.split()[-1] for line in maps.splitlines() if "/libcudnn" in line.split()[-1]})
    origin = "a library this process does not show"
    if loaded:
        origin = loaded[0]
        if "/site-packages/nvidia/cudnn/" in origin:
            owners = [d for d in importlib.metadata.distributions() if d.metadata["Name"].startswith("nvidia-cudnn-")]
            if owners:
                origin = f"pip's {owners[0].metadata['Name']} {owners[0].version} ({Path(origin).name})"
    return f"torch loads cuDNN {cudnn_version(number)} from {origin}"


def apex_source_record() -> dict | None:
    """What the installed Apex's build stage recorded in its dist-info (commit, nvcc, patches), if any."""
    try:
        record = importlib.metadata.distribution("apex").read_text(SOURCE_RECORD)
    except importlib.metadata.PackageNotFoundError:
        return None
    return json.loads(record) if record is not None else {}


def apex_source_commit() -> str:
    """The commit the installed Apex was compiled from, as its build stage recorded it in the dist-info."""
    record = apex_source_record()
    if record is None:
        return "absent"
    if not record:
        return "installed without a source record"
    return str(record.get("commit", "unknown"))


def _apex_facts(ctx: SmokeContext) -> ApexFacts:
    if ctx.spec.apex_commit is None:
        raise Skip(f"recipe {ctx.spec.name} builds no Apex")
    return apex_facts(ctx.spec.apex_commit)


def _applied_apex_patches() -> list[str]:
    return list((apex_source_record() or {}).get("build_patches", []))


def check_apex_extensions(ctx: SmokeContext) -> str:
    facts = _apex_facts(ctx)
    import torch  # noqa: F401  (the extensions link against torch's libraries)

    importlib.import_module("apex")
    applied = _applied_apex_patches()
    built = facts.built_extensions(applied)
    broken = []
    for name in built:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            broken.append(f"{name} ({exc})")
    if broken:
        raise AssertionError("Apex extension modules that do not load: " + "; ".join(broken))
    skipped = facts.skipped_extensions(applied)
    detail = f"apex and its {len(built)} extension modules load (built with --cpp_ext --cuda_ext)"
    return detail + (f"; not built, no code for the targets: {', '.join(skipped)}" if skipped else "")


def check_apex_machine_code(ctx: SmokeContext) -> str:
    """Read each CUDA extension's fatbin: machine code (SASS) for every target GPU, or a named exception."""
    facts = _apex_facts(ctx)
    built = facts.built_cuda_extensions(_applied_apex_patches())
    missing: list[str] = []
    excepted: list[str] = []
    for name in built:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            missing.append(f"{name}: not installed")
            continue
        sass = fatbin_architectures(Path(spec.origin))["sass"]
        lacking = [cc for cc in ctx.spec.target_gpus if not has_code_for(cc, sass)]
        if lacking and name in facts.fixed_architectures:
            excepted.append(f"{name} has {' '.join(sass) or 'no SASS'} ({facts.fixed_architectures[name].why})")
        elif lacking:
            missing.append(f"{name}: no machine code for {', '.join(lacking)} (has {' '.join(sass) or 'none'})")
    if missing:
        raise AssertionError("; ".join(missing))
    detail = f"{len(built) - len(excepted)} CUDA extensions hold SASS for {', '.join(ctx.spec.target_gpus)}"
    return detail + (f"; exception: {'; '.join(excepted)}" if excepted else "")


def check_dependencies(ctx: SmokeContext) -> str:
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(result.stdout.strip().replace("\n", "; "))
    return "pip check: no broken requirements"


def check_patches(ctx: SmokeContext) -> str:
    statuses = verify(ctx.site_packages, patch_set_for(ctx.spec.verl))
    bad = [s for s in statuses if s.state is not PatchState.APPLIED]
    if bad:
        raise AssertionError(
            "; ".join(f"patch {s.patch.id} ({s.patch.file}) is {s.state.value}: {s.detail}" for s in bad)
        )
    return f"{len(statuses)} patches applied in {ctx.site_packages / 'verl'}"


_IMPORT_AS_ON_CUDA = (
    "import verl.utils.device as d; d.is_cuda_available = True; "
    "import verl.workers.actor.dp_actor, verl.workers.critic.dp_critic"
)


def check_no_flash_attn(ctx: SmokeContext) -> str:
    if importlib.util.find_spec("flash_attn") is not None:
        raise AssertionError("flash_attn is installed (its Triton kernels and FA2 do not run below CC 8.0)")
    # dp_actor/dp_critic import flash_attn only when CUDA is present: pretend it is, in a fresh interpreter
    result = subprocess.run([sys.executable, "-c", _IMPORT_AS_ON_CUDA], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(result.stderr.strip().splitlines()[-1])
    return "flash_attn absent; dp_actor and dp_critic import as they would on a CUDA machine"


def check_arch_list(ctx: SmokeContext) -> str:
    import torch

    archs = torch._C._cuda_getArchFlags().split() if torch.version.cuda else []
    missing = [cc for cc in ctx.spec.target_gpus if not has_code_for(cc, archs)]
    if missing:
        raise AssertionError(f"torch has no code for CC {', '.join(missing)} (it has: {' '.join(archs) or 'none'})")
    return f"targets {', '.join(ctx.spec.target_gpus)} covered by {' '.join(archs)}"


def check_profile(ctx: SmokeContext) -> str:
    plans = [TrainingPlan(ctx.spec, {}, profile=name) for name in profile_names()]
    counts = [f"{plan.profile.name} {len(verified_overrides(plan, []))}" for plan in plans]
    return f"every profile's overrides compose with verl's ppo_trainer.yaml ({', '.join(counts)})"


def check_gsm8k_dataset(ctx: SmokeContext) -> str:
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer(ctx.workdir / "tokenizer", 256))
    config = ctx.composed()
    dataset = RLHFDataset(data_files=[str(ctx.data_dir / "train.parquet")], tokenizer=tokenizer, config=config.data)
    item = dataset[0]
    truth = item["reward_model"]["ground_truth"]
    if len(dataset) != 16 or "," in truth or item["input_ids"].numel() != config.data.max_prompt_length:
        raise AssertionError(f"unexpected dataset: {len(dataset)} rows, ground truth {truth!r}")
    return f"{len(dataset)} rows read by verl's RLHFDataset; ground truth {truth!r}"


def check_prompt_length_fit(ctx: SmokeContext) -> str:
    """The length train fits data.max_prompt_length to is the one verl's own filter counts: at it verl keeps every
    prompt, one token shorter it drops the longest."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    folder = ctx.workdir / "prompt-lengths"
    folder.mkdir()
    questions = ["Natalia sold 5 clips" + " apples" * extra + " ?" for extra in range(9)]
    rows = [to_verl_row(question, "#### 5", "train", index) for index, question in enumerate(questions)]
    write_parquet(rows, folder / "train.parquet")
    said: list[str] = []
    lengths = prompt_lengths.measure([folder / "train.parquet"], ctx.model_dir, "prompt", said.append)
    again = prompt_lengths.measure([folder / "train.parquet"], ctx.model_dir, "prompt", said.append)
    if len(said) != 1 or again != lengths:
        raise AssertionError(f"the record was not reused: {said}")
    tokenizer = AutoTokenizer.from_pretrained(ctx.model_dir)
    data_config = OmegaConf.to_container(ctx.composed().data)  # type: ignore[attr-defined]

    def kept(width: int) -> int:
        config = OmegaConf.create(data_config | {"max_prompt_length": width, "filter_overlong_prompts": True})
        return len(RLHFDataset(data_files=[str(folder / "train.parquet")], tokenizer=tokenizer, config=config))

    longest = lengths.longest
    if (kept(longest), kept(longest - 1)) != (len(rows), len(rows) - 1):
        raise AssertionError(f"verl keeps {kept(longest)} at {longest} tokens, {kept(longest - 1)} at one fewer")
    return f"{len(rows)} prompts, the longest {longest} tokens: verl keeps all at {longest}, drops it at {longest - 1}"


def _ppo_batch(vocab_size: int, batch: int = 2, prompt: int = 8, response: int = 4) -> object:
    import torch
    from verl import DataProto

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab_size, (batch, prompt + response), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(prompt + response).expand(batch, -1).clone()
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": input_ids[:, prompt:],
        }
    )


def _cpu_actor_critic(ctx: SmokeContext) -> tuple[Any, Any, Any]:
    """verl's own actor and critic classes (DataParallelPPOActor/Critic) on the plain fp32 modules of the
    profile's config: FSDP wrapping needs a GPU. Returns (config, actor, critic)."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM
    from verl.utils.model import load_valuehead_model, update_model_config
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.critic.dp_critic import DataParallelPPOCritic

    config = ctx.composed()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{ctx.workdir / 'process-group'}", rank=0, world_size=1)
    model_config = config.actor_rollout_ref.model
    attention = model_config.override_config.attn_implementation
    actor_config = AutoConfig.from_pretrained(model_config.path, attn_implementation=attention)
    update_model_config(actor_config, {"pad_token_id": 0})
    actor = AutoModelForCausalLM.from_pretrained(model_config.path, torch_dtype=torch.float32, config=actor_config)
    critic_config = AutoConfig.from_pretrained(
        config.critic.model.path, attn_implementation=config.critic.model.override_config.attn_implementation
    )
    critic_config.num_labels = 1
    critic = load_valuehead_model(config.critic.model.path, torch.float32, critic_config, False)
    loaded = {f"{name} {m.dtype} {m.config._attn_implementation}" for name, m in (("actor", actor), ("critic", critic))}
    if loaded != {f"actor torch.float32 {attention}", f"critic torch.float32 {attention}"}:
        raise AssertionError(f"models loaded as {sorted(loaded)}")
    return (
        config,
        DataParallelPPOActor(config.actor_rollout_ref.actor, actor),
        DataParallelPPOCritic(config.critic, critic, None),
    )


def check_actor_critic_cpu(ctx: SmokeContext) -> str:
    import torch

    _, actor, critic = _cpu_actor_critic(ctx)
    batch = _ppo_batch(actor.actor_module.config.vocab_size).batch
    # compute_log_prob/compute_values are wrapped in verl's GPUMemoryLogger, which reads CUDA memory
    # counters; their per-micro-batch step is the same computation and runs on the CPU.
    _, log_probs = actor._forward_micro_batch(batch, 1.0)
    values = critic._forward_micro_batch(batch)
    if not (torch.isfinite(log_probs).all() and torch.isfinite(values).all()):
        raise AssertionError("non-finite log-probs or values")
    return (
        f"actor log-prob mean {log_probs.mean().item():.3f}, critic value mean {values.mean().item():.3f} "
        "(fp32 on CPU through verl's DataParallelPPOActor/Critic._forward_micro_batch: the public "
        "compute_log_prob/compute_values read GPU memory counters, and FSDP wrapping needs a GPU)"
    )


def _left_right_padded_batch(vocab_size: int) -> object:
    """Two rows as verl lays them out: prompts padded on the left, responses on the right; the first two
    prompt columns and the last three response columns are padding in both rows."""
    import torch

    real = torch.tensor(
        [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]]
    )
    batch = _ppo_batch(vocab_size, prompt=8, response=8).batch
    batch["attention_mask"] = real
    batch["position_ids"] = (real.cumsum(-1) - 1).clamp(min=0)
    batch["input_ids"] = batch["input_ids"] * real
    batch["responses"] = batch["input_ids"][:, 8:]
    return batch


def check_padding_trim(ctx: SmokeContext) -> str:
    """The patched actor and critic with the profile's trim_padding against the same classes without it:
    the same log-probs, entropy and values at every real response position, zeros where columns were cut,
    and the same gradient of the actor's summed log-probs (what its update backpropagates through)."""
    import torch

    from verlbox.runtime.training.padding import PaddingTrim

    config, actor, critic = _cpu_actor_critic(ctx)
    sections = (config.actor_rollout_ref.actor, config.critic)
    if not all(section.get("trim_padding") for section in sections):
        raise AssertionError("the profile does not set trim_padding for the actor and the critic")
    batch = _left_right_padded_batch(actor.actor_module.config.vocab_size)
    trim = PaddingTrim.of(batch["attention_mask"], 8)
    if (trim.left, trim.right) != (2, 3):
        raise AssertionError(f"expected 2 prompt and 3 response columns cut, PaddingTrim says {trim}")
    response_mask = batch["attention_mask"][:, 8:].bool()

    def outputs() -> dict[str, Any]:
        actor.actor_module.zero_grad(set_to_none=True)
        entropy, log_probs = actor._forward_micro_batch(batch, 1.0, calculate_entropy=True)
        (log_probs * response_mask).sum().backward()
        parameters = actor.actor_module.parameters()
        gradient = torch.cat([p.grad.flatten() for p in parameters if p.grad is not None])
        values = critic._forward_micro_batch(batch)
        return {
            "log-probs": log_probs.detach(),
            "entropy": entropy.detach(),
            "values": values.detach(),
            "gradient": gradient,
        }

    trimmed = outputs()
    try:
        for section in sections:
            section.trim_padding = False
        full = outputs()
    finally:
        for section in sections:
            section.trim_padding = True
    differences = {}
    for name, cut in trimmed.items():
        whole = full[name]
        if name == "gradient":
            differences[name] = ((cut - whole).abs().max() / whole.abs().max().clamp(min=1e-12)).item()
            continue
        if cut.shape != whole.shape or cut[:, -trim.right :].abs().max().item() != 0:
            raise AssertionError(f"trimmed {name}: shape {tuple(cut.shape)}, cut columns not zero")
        differences[name] = (cut - whole)[response_mask].abs().max().item()
    said = ", ".join(f"{name} {difference:.1e}" for name, difference in differences.items())
    if max(differences.values()) > 1e-4:
        raise AssertionError(f"trimmed and full differ at real positions: {said}")
    cut = f"{trim.left} prompt and {trim.right} response columns of 16 cut"
    return f"{cut}; largest differences: {said} (the gradient's relative)"


def check_rollout_positions(ctx: SmokeContext) -> str:
    return rollout.check_rollout_positions(ctx.model_dir)


def check_dry_run(ctx: SmokeContext) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "verlbox.cli", "train", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {SPEC_VARIABLE: str(ctx.spec_file)},
    )
    missing = [o for o in ctx.plan.overrides if o not in result.stdout]
    if result.returncode != 0 or "verl.trainer.main_ppo" not in result.stdout or missing:
        raise AssertionError(result.stderr.strip() or f"dry run lacks {missing[:3]}")
    return f"prints python -m verl.trainer.main_ppo with all {len(ctx.plan.overrides)} profile overrides"


# ---- GPU tier -------------------------------------------------------------------------------------


def _gpu_facts() -> preflight.GpuFacts:
    facts = preflight.probe_gpu()
    if not facts.devices:
        raise Skip("no CUDA GPU visible")
    return facts


def _from_preflight(check: preflight.Check) -> str:
    if not check.ok:
        raise AssertionError(check.detail)
    return check.detail


def check_cuda_visible(ctx: SmokeContext) -> str:
    return _from_preflight(preflight.check_gpu_visible(_gpu_facts(), 1))


def check_gpu_capability(ctx: SmokeContext) -> str:
    return _from_preflight(preflight.check_compute_capability(_gpu_facts(), ctx.spec.target_gpus))


def check_gpu_driver(ctx: SmokeContext) -> str:
    return _from_preflight(preflight.check_driver(_gpu_facts(), ctx.spec.cuda))


def check_fp32_matmul(ctx: SmokeContext) -> str:
    import torch

    _gpu_facts()
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(1024, 1024, dtype=torch.float64), torch.randn(1024, 1024, dtype=torch.float64)
    product = (a.float().cuda() @ b.float().cuda()).double().cpu()
    error = ((product - a @ b).abs().max() / (a @ b).abs().max()).item()
    if not error < 1e-4:
        raise AssertionError(f"fp32 matmul relative error {error:.2e}")
    return f"1024x1024 fp32 matmul on {torch.cuda.get_device_name()}: max relative error {error:.1e}"


def check_graph_decode(ctx: SmokeContext) -> str:
    _gpu_facts()
    return rollout.check_graph_decode(ctx.model_dir)


def check_apex(ctx: SmokeContext) -> str:
    _apex_facts(ctx)
    _gpu_facts()
    from verlbox.runtime.steps.apex_kernels import compare_kernels

    checks = compare_kernels()
    wrong = [f"{c.kernel} {c.dtype}: {c.max_error:.2e} > {c.tolerance:.0e}" for c in checks if not c.ok]
    if wrong:
        raise AssertionError("Apex kernels differ from torch: " + "; ".join(wrong))
    worst = max(checks, key=lambda c: c.max_error / c.tolerance if c.tolerance else 0)
    closest = f"{worst.kernel} {worst.dtype} {worst.max_error:.1e}"
    return f"{len(checks)} fused-kernel comparisons match torch (closest to its bound: {closest})"


_LOSSES = ("actor/pg_loss", "critic/vf_loss")
# what every two-step run sets: the tiny model's batches, short sequences, no saves or validation
_TWO_STEPS = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "data.max_response_length=16",
    "trainer.total_training_steps=2",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "ray_init.num_cpus=4",
]
RUN_EXPERIMENT = "smoke"


@dataclass(frozen=True)
class TrainRun:
    returncode: int
    steps: list[StepRecord]
    tail: str


def train_run(
    ctx: SmokeContext, profile: str, run: str, data_dir: Path, overrides: list[str], model_dir: Path | None = None
) -> TrainRun:
    """PROFILE through the real `verlbox train` (on the tiny model unless MODEL_DIR); each step's metrics as
    train recorded them (the run folder's metrics.jsonl: the console shows one compact line per step)."""
    _gpu_facts()
    checkpoints = ctx.workdir / "checkpoints" / run
    env = os.environ | {
        "VERLBOX_MODEL_DIR": str(model_dir or ctx.model_dir),
        "VERLBOX_DATA_DIR": str(data_dir),
        "VERLBOX_CHECKPOINT_DIR": str(checkpoints),
        "VERLBOX_EXPERIMENT": RUN_EXPERIMENT,
        SPEC_VARIABLE: str(ctx.spec_file),
    }
    command = ["train", "--profile", profile, "--gpus-per-node", "1", "--", *overrides]
    result = subprocess.run(
        [sys.executable, "-m", "verlbox.cli", *command],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=900,
    )
    metrics = checkpoints / RUN_EXPERIMENT / METRICS_FILE
    steps = read_metrics(metrics) if metrics.is_file() else []
    tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:])
    return TrainRun(result.returncode, steps, tail)


def losses_of(steps: list[StepRecord]) -> list[tuple[str, float]]:
    """The actor's and critic's losses of each recorded step, in order."""
    return [(name, step.metrics[name]) for step in steps for name in _LOSSES if name in step.metrics]


def _two_steps(ctx: SmokeContext, profile: str, overrides: list[str], losses_per_step: int) -> str:
    """Two steps of PROFILE on the tiny model; its losses recorded and finite."""
    run = train_run(ctx, profile, profile, ctx.data_dir, [*_TWO_STEPS, *overrides])
    losses = losses_of(run.steps)
    if run.returncode != 0 or len(losses) < 2 * losses_per_step:
        raise AssertionError(f"exit {run.returncode}, {len(losses)} losses recorded: {run.tail}")
    if not all(math.isfinite(value) for _, value in losses):
        raise AssertionError(f"non-finite losses: {losses}")
    # the profile's prompt width lowered to the data's longest prompt (the fixture's prompts are all one length)
    started = run_record.read_runs(ctx.workdir / "checkpoints" / profile / RUN_EXPERIMENT)[-1]
    width = int(override_value(started.overrides, prompt_lengths.KEY) or 0)
    longest = max(step.metrics.get("prompt_length/max", 0) for step in run.steps)
    if width != longest:
        raise AssertionError(f"{prompt_lengths.KEY}={width}, but the longest prompt verl saw had {longest:g} tokens")
    return f"2 steps of profile {profile} at {prompt_lengths.KEY}={width}, finite losses: " + ", ".join(
        f"{n}={v:.4g}" for n, v in losses
    )


def check_ppo_two_steps(ctx: SmokeContext) -> str:
    overrides = [
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "+actor_rollout_ref.rollout.micro_batch_size=4",
    ]
    return _two_steps(ctx, ctx.spec.profile, overrides, losses_per_step=2)


def check_grpo_two_steps(ctx: SmokeContext) -> str:
    # 2 prompts x 2 answers: the smallest group GRPO accepts; no critic, so one loss per step. The graph
    # decode on, so verl's FSDP rollout runs it (its answers repeated per prompt) whatever the profile ships.
    overrides = [
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "+actor_rollout_ref.rollout.micro_batch_size=2",
        "+actor_rollout_ref.rollout.graph_decode=True",
    ]
    return _two_steps(ctx, "grpo", overrides, losses_per_step=1)


def learning_run(
    ctx: SmokeContext, algorithm: str, run: str, extra: tuple[str, ...] = ()
) -> tuple[TrainRun, learn.Verdict]:
    """ALGORITHM's profile (the image's PPO profile, or grpo) on the learnable task, 40 steps; EXTRA
    overrides come after the task's (a sabotage, say)."""
    profile = ctx.spec.profile if algorithm == "ppo" else algorithm
    overrides = [*learn.TASK_OVERRIDES, *learn.ALGORITHM_OVERRIDES[algorithm], *extra]
    result = train_run(ctx, profile, run, ctx.task_dir, overrides)
    scores = [step.metrics[learn.SCORE] for step in result.steps if learn.SCORE in step.metrics]
    return result, learn.judge(scores)


def _learns(ctx: SmokeContext, algorithm: str) -> str:
    run, verdict = learning_run(ctx, algorithm, f"learn-{algorithm}")
    if run.returncode != 0 or not verdict.learned:
        raise AssertionError(f"exit {run.returncode}, {verdict.describe()}: {run.tail}")
    return verdict.describe()


def check_real_model(ctx: SmokeContext) -> str:
    """The image's PPO profile as shipped on the user's model and GSM8K, a few steps, validated before and
    after: what it reports is the user's to judge (a short run need not move a real model far)."""
    if ctx.real is None:
        raise Skip("no --model given")
    steps = ctx.real.steps
    overrides = [
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.val_before_train=True",
        "trainer.save_freq=-1",
    ]
    run = train_run(ctx, ctx.spec.profile, "real-model", ctx.real.data, overrides, ctx.real.model)
    validated = [(step.step, score) for step in run.steps if (score := validation_reward(step.metrics)) is not None]
    if run.returncode != 0 or len(validated) < 2:
        raise AssertionError(f"exit {run.returncode}, {len(validated)} validations recorded: {run.tail}")
    (first_step, before), (last_step, after) = validated[0], validated[-1]
    return (
        f"{ctx.real.model.name}: validation reward {before:.3f} (step {first_step}) -> {after:.3f} (step {last_step})"
    )


def check_ppo_learns(ctx: SmokeContext) -> str:
    return _learns(ctx, "ppo")


def check_grpo_learns(ctx: SmokeContext) -> str:
    return _learns(ctx, "grpo")


CPU_CHECKS: list[tuple[str, Callable[[SmokeContext], str]]] = [
    ("pins match the recipe", check_pins),
    ("dependencies consistent", check_dependencies),
    ("Apex extensions load", check_apex_extensions),
    ("Apex machine code for targets", check_apex_machine_code),
    ("verl patch set applied", check_patches),
    ("no flash_attn", check_no_flash_attn),
    ("torch arch list covers targets", check_arch_list),
    ("profile composes with verl", check_profile),
    ("GSM8K prep + verl dataset", check_gsm8k_dataset),
    ("prompt length fitted as verl counts", check_prompt_length_fit),
    ("actor log-prob + critic value (CPU)", check_actor_critic_cpu),
    ("padding trim keeps outputs (CPU)", check_padding_trim),
    ("rollout decodes at scored positions (CPU)", check_rollout_positions),
    ("train --dry-run", check_dry_run),
]
GPU_CHECKS: list[tuple[str, Callable[[SmokeContext], str]]] = [
    ("CUDA visible", check_cuda_visible),
    ("compute capability", check_gpu_capability),
    ("driver", check_gpu_driver),
    ("fp32 matmul", check_fp32_matmul),
    ("Apex fused kernels", check_apex),
    ("graph decode = generate (greedy)", check_graph_decode),
    ("2-step PPO (tiny model)", check_ppo_two_steps),
    ("2-step GRPO (tiny model)", check_grpo_two_steps),
]
# --learn: minutes on one GPU, so asked for
LEARN_CHECKS: list[tuple[str, Callable[[SmokeContext], str]]] = [
    ("PPO learns (tiny task)", check_ppo_learns),
    ("GRPO learns (tiny task)", check_grpo_learns),
    ("PPO on your model (GSM8K)", check_real_model),
]


def run_smoke(spec: ImageSpec, gpu: bool, learn_too: bool = False, real: RealModel | None = None) -> list[CheckResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="verlbox-smoke-") as workdir:
        ctx = SmokeContext(spec, Path(workdir), real)
        tiers = [("cpu", CPU_CHECKS)] + ([("gpu", GPU_CHECKS)] if gpu else [])
        tiers += [("gpu", LEARN_CHECKS)] if gpu and learn_too else []
        for tier, checks in tiers:
            for name, check in checks:
                try:
                    results.append(CheckResult(tier, name, "passed", check(ctx)))
                except Skip as skip:
                    results.append(CheckResult(tier, name, "skipped", str(skip)))
                except Exception as exc:  # a check's failure is a result to report, whatever raised it
                    results.append(CheckResult(tier, name, "failed", f"{type(exc).__name__}: {exc}"))
        if not gpu:
            results.append(CheckResult("gpu", "GPU tier", "skipped", "not requested (--gpu)"))
        elif not learn_too:
            results.append(CheckResult("gpu", "learning (tiny task)", "skipped", "not requested (--learn)"))
    return results


def results_json(results: list[CheckResult]) -> str:
    return json.dumps([asdict(result) for result in results], indent=2)
