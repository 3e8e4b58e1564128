"""PPO throughput and memory of a verlbox profile on a GPU, through the real `verlbox train` entrypoint.

Makes a random model of Qwen2.5-0.5B-Instruct's exact shape and synthetic GSM8K rows, then runs
verl 0.4.1 PPO with the recipe's profile (or the seeds' batch-1 settings), each process capped at
--gpu-memory-gib to emulate a 24 GB P40. Prints one JSON summary per run; the log goes to --out.

  python bench/ppo_gpu.py --out OUT --run profile:45 --run seeds:8 --kill-after-checkpoint 40
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from verlbox.runtime.data import prepare_gsm8k
from verlbox.runtime.fixtures import make_gsm8k_jsonl, make_model

# The seeds' settings with their real meaning in verl 0.4.1: batch 1 everywhere, the same offload,
# precision and lengths as the profile, so the two differ only in how work is batched.
SEEDS_BATCH_1 = [
    "data.train_batch_size=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "+actor_rollout_ref.rollout.micro_batch_size=1",
]
# Ray prefixes the trainer's lines with "(TaskRunner pid=...)"
_STEP = re.compile(r"step:(\d+) - (.*)$")


def prepare(workdir: Path) -> tuple[Path, Path]:
    model, data = workdir / "qwen2.5-0.5b-random", workdir / "gsm8k"
    if not (model / "config.json").is_file():
        make_model(model, "qwen2.5-0.5b")
    if not (data / "train.parquet").is_file():
        prepare_gsm8k(make_gsm8k_jsonl(workdir / "gsm8k-raw", train_rows=2048, test_rows=256), data)
    return model, data


def _metrics(line: str) -> tuple[int, dict[str, float]] | None:
    match = _STEP.search(line.strip())
    if not match:
        return None
    values = {}
    for part in match.group(2).split(" - "):
        key, _, value = part.rpartition(":")
        try:
            values[key] = float(value)
        except ValueError:
            continue
    return int(match.group(1)), values


def run(
    name: str,
    overrides: list[str],
    env: dict[str, str],
    log: Path,
    kill_after_checkpoint: int | None,
    checkpoint_dir: Path,
    deadline: float,
) -> dict[str, object]:
    command = [sys.executable, "-m", "verlbox.cli", "train", "--recipe", "p40-cu124", "--", *overrides]
    steps: dict[int, dict[str, float]] = {}
    started = time.monotonic()
    killed = False
    with (
        log.open("a") as handle,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            handle.write(line)
            parsed = _metrics(line)
            if parsed:
                steps[parsed[0]] = parsed[1]
                print(
                    f"[{name}] step {parsed[0]}: {parsed[1].get('timing_s/step', 0):.1f} s, reserved "
                    f"{parsed[1].get('perf/max_memory_reserved_gb', 0):.1f} GiB",
                    flush=True,
                )
            latest = checkpoint_dir / "latest_checkpointed_iteration.txt"
            done = (
                kill_after_checkpoint and latest.is_file() and latest.read_text().strip() == str(kill_after_checkpoint)
            )
            if done or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                killed = True
                break
        process.wait()
    ordered = [steps[k] for k in sorted(steps)]
    timings = [s["timing_s/step"] for s in ordered[2:] if "timing_s/step" in s] or [
        s["timing_s/step"] for s in ordered if "timing_s/step" in s
    ]
    batch = int(next(o.split("=")[1] for o in overrides if o.startswith("data.train_batch_size=")))
    median = statistics.median(timings) if timings else float("nan")
    reserved = [s.get("perf/max_memory_reserved_gb", float("nan")) for s in ordered]
    return {
        "run": name,
        "exit": process.returncode,
        "killed": killed,
        "wall_s": round(time.monotonic() - started, 1),
        "steps": sorted(steps),
        "batch": batch,
        "median_step_s": round(median, 2),
        "samples_per_s": round(batch / median, 3),
        "reserved_gb_per_step": [round(r, 2) for r in reserved],
        "allocated_gb_max": max((s.get("perf/max_memory_allocated_gb", 0) for s in ordered), default=None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verlbox-bench"))
    parser.add_argument("--run", action="append", required=True, help="NAME:STEPS with NAME profile|seeds|resume")
    parser.add_argument("--gpu-memory-gib", default="24")
    parser.add_argument("--kill-after-checkpoint", type=int, help="profile run: SIGKILL once this step is saved")
    parser.add_argument("--save-freq", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=540, help="stop everything after this many seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    model, data = prepare(args.workdir)
    checkpoints = args.workdir / "checkpoints"
    env = os.environ | {
        "VERLBOX_MODEL_DIR": str(model),
        "VERLBOX_DATA_DIR": str(data),
        "VERLBOX_CHECKPOINT_DIR": str(checkpoints),
        "VERLBOX_EXPERIMENT": "bench",
        "VERLBOX_GPU_MEMORY_GIB": args.gpu_memory_gib,
        "PYTHONUNBUFFERED": "1",
    }
    summaries = []
    for spec in args.run:
        name, steps = spec.split(":")
        common = [f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "ray_init.num_cpus=8"]
        if name == "seeds":
            overrides = [*SEEDS_BATCH_1, *common, "trainer.save_freq=-1", "trainer.resume_mode=disable"]
        else:
            overrides = ["data.train_batch_size=16", *common, f"trainer.save_freq={args.save_freq}"]
        kill = args.kill_after_checkpoint if name == "profile" else None
        summary = run(name, overrides, env, args.out / f"{name}.log", kill, checkpoints / "bench", deadline)
        if name == "resume":
            text = (args.out / "resume.log").read_text()
            summary["resumed_from"] = re.findall(r"Resuming from (\S+)", text)
        summaries.append(summary)
        print(json.dumps(summary), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
