"""The image's `train` entrypoint: preflight, data on demand, then verl's main_ppo with the profile."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
import sys
from pathlib import Path

from rich.console import Console

from verlbox.errors import PreflightFailed, VerlboxError
from verlbox.runtime import preflight
from verlbox.runtime.data import prepare_gsm8k
from verlbox.runtime.memory_cap import SITECUSTOMIZE_DIR
from verlbox.runtime.overrides import Override, check_overrides, installed_verl_config_dir, override_int, override_value
from verlbox.runtime.patches import patch_set_for
from verlbox.runtime.profile import TrainingPlan
from verlbox.runtime.spec import ImageSpec

DEFAULT_RAW_GSM8K = "/data/gsm8k-raw"


def merge_overrides(profile: list[str], user: list[str]) -> list[str]:
    """The user's value wins for a key the profile sets, keeping the profile's `+` where it needed one."""
    merged: dict[str, Override] = {}
    for raw in profile:
        override = Override.parse(raw)
        merged[override.key] = override
    for raw in user:
        override = Override.parse(raw)
        previous = merged.get(override.key)
        prefix = override.prefix or (previous.prefix if previous else "")
        merged[override.key] = Override(
            f"{prefix}{override.key}={override.value}", prefix, override.key, override.value
        )
    return [override.raw for override in merged.values()]


def verified_overrides(plan: TrainingPlan, user: list[str]) -> list[str]:
    overrides = merge_overrides(plan.overrides, user)
    config_dir = installed_verl_config_dir()
    if config_dir is None:
        raise VerlboxError("verl is not installed here, so the overrides cannot be checked against its config")
    check_overrides(
        overrides,
        config_dir,
        patch_set_for(plan.spec.verl),
        plan.oldest_target,
        flash_attn_installed=importlib.util.find_spec("flash_attn") is not None,
        vllm_kernels_for=plan.spec.vllm_kernels_for,
    )
    return overrides


def train_environment(plan: TrainingPlan, environ: dict[str, str], gpu_memory_gib: float | None) -> dict[str, str]:
    env = dict(environ) | plan.environment
    if gpu_memory_gib:
        env["VERLBOX_GPU_MEMORY_GIB"] = f"{gpu_memory_gib:g}"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITECUSTOMIZE_DIR), environ.get("PYTHONPATH")]))
    return env


def train_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def ensure_data(overrides: list[str], environ: dict[str, str], console: Console) -> preflight.Check:
    files = [Path(v) for key in ("data.train_files", "data.val_files") if (v := override_value(overrides, key))]
    if all(path.is_file() for path in files):
        return preflight.Check("data", True, ", ".join(map(str, files)))
    raw = Path(environ.get("VERLBOX_GSM8K_SOURCE", DEFAULT_RAW_GSM8K))
    target = files[0].parent
    if not raw.exists():
        missing = next(path for path in files if not path.is_file())
        return preflight.Check(
            "data",
            False,
            f"{missing} is missing and there is no GSM8K download at {raw} to "
            f"make it from: run `verlbox prepare-data gsm8k --source DOWNLOAD --out {target}` "
            "or set VERLBOX_GSM8K_SOURCE",
        )
    written = prepare_gsm8k(raw, target)
    console.print(
        f"prepared GSM8K from {raw} into {target}: "
        + ", ".join(f"{name} {rows} rows" for name, (rows, _) in written.items())
    )
    return preflight.Check("data", True, f"prepared from {raw}")


def run_preflight(
    plan: TrainingPlan, overrides: list[str], environ: dict[str, str], facts: preflight.GpuFacts, console: Console
) -> list[preflight.Check]:
    gpus = override_int(overrides, "trainer.n_gpus_per_node", 1)
    checks = [
        preflight.check_gpu_visible(facts, gpus),
        preflight.check_compute_capability(facts, plan.spec.target_gpus),
        preflight.check_driver(facts, plan.spec.cuda),
        preflight.check_memory(facts, plan.profile.min_gpu_memory_gib),
        preflight.check_shared_memory(),
        preflight.check_model(Path(override_value(overrides, "actor_rollout_ref.model.path") or "")),
        ensure_data(overrides, environ, console),
    ]
    if not checks[0].ok:  # without a GPU the GPU checks below it only repeat the same news
        checks = [checks[0], *checks[4:]]
    return checks


def train(
    spec: ImageSpec, user_overrides: list[str], *, dry_run: bool, gpu_memory_gib: float | None, console: Console
) -> int:
    environ = dict(os.environ)
    plan = TrainingPlan(spec, environ)
    overrides = verified_overrides(plan, user_overrides)
    env = train_environment(plan, environ, gpu_memory_gib)
    command = train_command(overrides)
    if dry_run:
        changed = {k: v for k, v in env.items() if environ.get(k) != v}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items()))
        print(" \\\n    ".join([f"{prefix} {shlex.join(command[:3])}".strip(), *map(shlex.quote, command[3:])]))
        return 0
    for warning in preflight.dead_variables(environ):
        console.print(f"note: {warning}")
    facts = preflight.probe_gpu()
    if gpu_memory_gib:
        facts = dataclasses.replace(facts, memory_cap_gib=gpu_memory_gib)
    checks = run_preflight(plan, overrides, environ, facts, console)
    failed = [check for check in checks if not check.ok]
    if failed:
        raise PreflightFailed("\n".join(f"preflight {check.name}: {check.detail}" for check in failed))
    console.print(f"preflight: {len(checks)} checks passed ({checks[0].detail}); starting verl PPO")
    sys.stdout.flush()
    os.execvpe(command[0], command, env)
    return 0  # not reached: exec replaces this process
