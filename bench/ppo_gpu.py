"""PPO throughput and memory of a verlbox profile on a GPU, through the real `verlbox train` entrypoint.

Makes a random model of Qwen2.5-0.5B-Instruct's exact shape and synthetic GSM8K rows, then runs
verl 0.4.1 PPO with the recipe's profile (or the seeds' batch-1 settings), each process capped at
--gpu-memory-gib to emulate a 24 GB P40. Prints one JSON summary per run; the log goes to --out.

  python bench/ppo_gpu.py --out OUT --run profile:45 --run seeds:8 --kill-after-checkpoint 40
  python bench/ppo_gpu.py --out OUT --run ppo:4 --run grpo:4 --run grpo:4:actor_rollout_ref.rollout.n=8

`ppo` and `grpo` run those profiles as shipped (batch included) unless KEY=VALUE says otherwise, and
report responses per second (prompts x rollout.n); `ppo-before` and `grpo-before` run them with the
settings they shipped with before issue 31 (BEFORE_ISSUE_31), for a before/after in one call.

`profile-grpo` is `profile` with the GRPO profile (validation, saves, crashes and the resume as for PPO).

The rollout's decode parts (issue 53): `ppo-plain-decode` and `grpo-plain-decode` run the profiles with the
rollout as main shipped it before them (HF generate as verl calls it: no fold, no batch-width trim, no graph);
`ppo` and `grpo` run the fold and the trim as the profiles ship them; the graph is one more key, e.g.
`--run ppo:4:actor_rollout_ref.rollout.graph_decode=True`. Alternate the runs for a before/after.

Prompts: synthetic GSM8K rows whose question lengths follow the real GSM8K's (checks/fixtures.py,
GSM8K_QUESTION_WORDS; --data-seed picks the draw), or `--data DIR`, a folder `verlbox prepare-data` made
(train.parquet, validation.parquet), e.g. from openai/grade-school-math's jsonl. Every summary says which.

Issue 17's restarts: `--crash-after-checkpoint 2 --crash-after-checkpoint 4` interrupts verl (not
verlbox) once step 2, then step 4, is saved, so verlbox's supervisor restarts it and it resumes; a
`refuse` run then asks for another batch (32) over the same checkpoints and must be refused (exit 3)
before verl starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from verlbox.runtime.checks.fixtures import make_gsm8k_jsonl, make_model
from verlbox.runtime.training.data import parquet_rows, prepare_gsm8k
from verlbox.runtime.training.overrides import override_value
from verlbox.runtime.training.profile import load_profile
from verlbox.runtime.training.run_record import RUN_FILE, read_runs

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
# The profiles as they shipped before issue 31 (8eca8da): gradient checkpointing on, forward micro batches
# of 4, no padding trim, the prompt width 256 whatever the data. `ppo-before` and `grpo-before` run them.
BEFORE_ISSUE_31 = [
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.trim_padding=False",
    "actor_rollout_ref.ref.trim_padding=False",
    "data.max_prompt_length=256",
]
# The rollout as main shipped it before issue 53 (HF generate as verl calls it)
PLAIN_DECODE = [
    "actor_rollout_ref.rollout.fold_attention=False",
    "actor_rollout_ref.rollout.trim_padding=False",
    "actor_rollout_ref.rollout.graph_decode=False",
]
BEFORE = {
    "ppo-plain-decode": PLAIN_DECODE,
    "grpo-plain-decode": PLAIN_DECODE,
    "ppo-before": [
        *BEFORE_ISSUE_31,
        "critic.model.enable_gradient_checkpointing=True",
        "critic.forward_micro_batch_size_per_gpu=4",
        "critic.trim_padding=False",
    ],
    "grpo-before": BEFORE_ISSUE_31,
}
# run name -> the profile `train --profile` gets
PROFILE_RUNS = {
    "ppo": "p40",
    "grpo": "grpo",
    "plain": "p40",
    "ppo-before": "p40",
    "grpo-before": "grpo",
    "ppo-plain-decode": "p40",
    "grpo-plain-decode": "grpo",
}
# runs that save, may be killed or crashed after a save (--kill-after-checkpoint, --crash-after-checkpoint) and
# resume: `profile` with train's default profile (PPO), `profile-grpo` with GRPO's
SUPERVISED_RUNS = {"profile": None, "profile-grpo": "grpo"}
# `plain`: the PPO profile as verlbox ran it before issue 18 (verl's console as it is, no TensorBoard): the
# other half of the "with and without" comparison
PLAIN = {"env": {"VERLBOX_PROGRESS": "plain"}, "overrides": ["trainer.logger=[console]"]}
PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")
# Ray prefixes the trainer's lines with "(TaskRunner pid=...)"
_STEP = re.compile(r"step:(\d+) - (.*)$")


# the synthetic data's size: a train split to draw batches from, a test split for validation
SYNTHETIC_ROWS = {"train": 2048, "test": 256}
# the parquet files a --data folder must hold for `verlbox train`
DATA_FILES = ("train.parquet", "validation.parquet")


def prepare(
    workdir: Path, validation_rows: int = 256, data: Path | None = None, seed: int = 0
) -> tuple[Path, Path, str]:
    """The random model, the GSM8K parquet folder and a line saying which prompts it holds: DATA as given,
    else synthetic rows with GSM8K's question lengths drawn with SEED (written again each time: the same
    bytes, so a folder from an older bench, or another seed, is never taken for this one)."""
    model = workdir / "qwen2.5-0.5b-random"
    if not (model / "config.json").is_file():
        make_model(model, "qwen2.5-0.5b")
    if data is not None:
        data = data.resolve()  # train runs verl from its own folder
        missing = [name for name in DATA_FILES if not (data / name).is_file()]
        if missing:
            raise SystemExit(f"--data {data}: no {', '.join(missing)} (make the folder with `verlbox prepare-data`)")
        return model, data, f"GSM8K parquet folder {data} ({parquet_rows(data / 'train.parquet')} train rows)"
    folder = workdir / f"gsm8k-lengths-seed{seed}"
    raw = make_gsm8k_jsonl(
        workdir / f"gsm8k-lengths-seed{seed}-raw", SYNTHETIC_ROWS["train"], SYNTHETIC_ROWS["test"], seed, "gsm8k"
    )
    prepare_gsm8k(raw, folder, validation_size=validation_rows)
    said = f"synthetic GSM8K-length rows ({SYNTHETIC_ROWS['train']} train, {validation_rows} validation, seed {seed})"
    return model, folder, said


def disk_state(checkpoint_dir: Path) -> dict[str, object]:
    """The step folders with their sizes, the tracker and the free space: what a restart leaves."""
    folders = sorted(checkpoint_dir.glob("global_step_*"), key=lambda p: int(p.name.rpartition("_")[2]))
    tracker = checkpoint_dir / "latest_checkpointed_iteration.txt"
    return {
        "folders": {
            p.name: round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**30, 2) for p in folders
        },
        "tracker": tracker.read_text().strip() if tracker.is_file() else None,
        "free_gib": round(shutil.disk_usage(checkpoint_dir).free / 2**30, 1),
    }


def interrupt_verl(verlbox_pid: int) -> list[int]:
    """SIGINT to verl's driver, a child of `verlbox train`: verl fails (KeyboardInterrupt, Ray shut down by
    its exit hooks) while verlbox's supervisor lives on to restart it."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == verlbox_pid and b"verl.trainer.main_ppo" in command:
            pids.append(int(proc.name))
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    return pids


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
    crash_after_checkpoints: list[int],
    checkpoint_dir: Path,
    deadline: float,
    profile: str | None = None,
) -> dict[str, object]:
    chosen = ["--profile", profile] if profile else []
    command = [sys.executable, "-m", "verlbox.cli", "train", "--recipe", "p40-cu124", *chosen, "--", *overrides]
    steps: dict[int, dict[str, float]] = {}
    # with verlbox's compact progress the step lines are in the run folder's metrics file, not on stdout
    metrics_file = checkpoint_dir / "metrics.jsonl"
    metrics_seen = metrics_file.stat().st_size if metrics_file.is_file() else 0
    started = time.monotonic()
    killed = False
    crashes: list[dict[str, object]] = []
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
            saved = latest.read_text().strip() if latest.is_file() else None
            if saved in {str(step) for step in crash_after_checkpoints} - {c["at"] for c in crashes}:
                crashes.append({"at": saved, "disk": disk_state(checkpoint_dir), "pids": interrupt_verl(process.pid)})
            done = kill_after_checkpoint and saved == str(kill_after_checkpoint)
            if done or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                killed = True
                break
        process.wait()
    if metrics_file.is_file():
        with metrics_file.open() as written:
            written.seek(metrics_seen)
            for line in written:
                entry = json.loads(line)
                steps.setdefault(entry["step"], entry["metrics"])
    ordered = [steps[k] for k in sorted(steps)]
    # the first step warms up and a validation step also generates the validation set: neither is a step's cost
    plain = [s for s in ordered[1:] if not any(key.startswith("val-") for key in s)]
    timings = [s["timing_s/step"] for s in plain or ordered if "timing_s/step" in s]
    given = (load_profile(profile).overrides if profile else []) + overrides
    batch = int(override_value(overrides, "data.train_batch_size") or 0)
    answers = int(override_value(given, "actor_rollout_ref.rollout.n") or 1)
    median = statistics.median(timings) if timings else float("nan")
    reserved = [s.get("perf/max_memory_reserved_gb", float("nan")) for s in ordered]
    validated = [step for step in sorted(steps) if any(key.startswith("val-") for key in steps[step])]

    def median_of(key: str) -> float | None:
        values = [s[key] for s in plain or ordered if key in s]
        return round(statistics.median(values), 2) if values else None

    # the positions verl computes per step (every row padded to max prompt + max response) against real tokens;
    # the prompt width as train started verl (it lowers the profile's to the data's longest prompt)
    as_started = read_runs(checkpoint_dir)[-1].overrides if (checkpoint_dir / RUN_FILE).is_file() else given
    lengths = [int(override_value(as_started, f"data.max_{part}_length") or 0) for part in ("prompt", "response")]
    computed = batch * answers * sum(lengths)
    real = median_of("perf/total_num_tokens")
    return {
        "run": name,
        "exit": process.returncode,
        "killed": killed,
        "wall_s": round(time.monotonic() - started, 1),
        "steps": sorted(steps),
        "batch": batch,
        "median_step_s": round(median, 2),
        "samples_per_s": round(batch / median, 3),
        "responses_per_s": round(batch * answers / median, 3),
        "reserved_gb_per_step": [round(r, 2) for r in reserved],
        "allocated_gb_max": max((s.get("perf/max_memory_allocated_gb", 0) for s in ordered), default=None),
        "validated_at": validated,
        "phase_s": {phase: median_of(f"timing_s/{phase}") for phase in PHASES},
        "fp32_tflops_per_gpu": median_of("verlbox/fp32_tflops_per_gpu"),
        "max_prompt_length": lengths[0],
        "real_positions": f"{real:.0f} of {computed}" if real and computed else None,
        "crashes": crashes,
        "after": disk_state(checkpoint_dir) if checkpoint_dir.is_dir() else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verlbox-bench"))
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        help="NAME:STEPS[:KEY=VALUE,...] with NAME profile|profile-grpo|seeds|resume|refuse|ppo|grpo|plain|"
        "ppo-before|grpo-before|ppo-plain-decode|grpo-plain-decode",
    )
    parser.add_argument("--gpu-memory-gib", default="24")
    parser.add_argument("--kill-after-checkpoint", type=int, help="profile runs: SIGKILL once this step is saved")
    parser.add_argument(
        "--crash-after-checkpoint",
        type=int,
        action="append",
        default=[],
        help="profile runs: interrupt verl once this step is saved",
    )
    parser.add_argument("--save-freq", type=int, default=20)
    parser.add_argument("--test-freq", type=int, default=-1)
    parser.add_argument("--validation-rows", type=int, default=256, help="synthetic data: test rows validated")
    parser.add_argument("--data", type=Path, help="a prepared GSM8K folder to train on instead of synthetic rows")
    parser.add_argument("--data-seed", type=int, default=0, help="synthetic data: the draw of question lengths")
    parser.add_argument("--budget-s", type=float, default=540, help="stop everything after this many seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    model, data, prompts = prepare(args.workdir, args.validation_rows, args.data, args.data_seed)
    print(f"prompts: {prompts}", flush=True)
    checkpoints = args.workdir / "checkpoints"
    env = os.environ | {
        "VERLBOX_MODEL_DIR": str(model),
        "VERLBOX_DATA_DIR": str(data),
        "VERLBOX_CHECKPOINT_DIR": str(checkpoints),
        "VERLBOX_EXPERIMENT": "bench",
        "VERLBOX_GPU_MEMORY_GIB": args.gpu_memory_gib,
        "PYTHONUNBUFFERED": "1",
        "VERLBOX_RESTART_DELAY_S": "5",
    }
    summaries = []
    for number, spec in enumerate(args.run):
        name, steps, *extra = spec.split(":", 2)
        extras = extra[0].split(",") if extra else []
        common = [f"trainer.total_training_steps={steps}", f"trainer.test_freq={args.test_freq}", "ray_init.num_cpus=8"]
        profile = PROFILE_RUNS.get(name)
        if name == "seeds":
            overrides = [*SEEDS_BATCH_1, *common, "trainer.save_freq=-1", "trainer.resume_mode=disable"]
        elif profile:
            # a profile as shipped for one GPU (its batch unless EXTRA says), no saves, a fresh start each
            batch = f"data.train_batch_size={load_profile(profile).per_gpu['train_batch_size']}"
            given = [] if override_value(extras, "data.train_batch_size") else [batch]
            before = BEFORE.get(name, [])
            overrides = [*given, *common, "trainer.save_freq=-1", "trainer.resume_mode=disable", *before, *extras]
        else:
            batch = 32 if name == "refuse" else 16
            overrides = [f"data.train_batch_size={batch}", *common, f"trainer.save_freq={args.save_freq}", *extras]
        supervised = name in SUPERVISED_RUNS
        if supervised:
            profile = SUPERVISED_RUNS[name]
        kill = args.kill_after_checkpoint if supervised else None
        crashes = args.crash_after_checkpoint if supervised else []
        log = args.out / f"{number}-{name}.log"
        # the refusal comes before verl starts: it runs whatever the training left of the budget
        until = float("inf") if name == "refuse" else deadline
        if name == "plain":
            overrides = [*overrides, *PLAIN["overrides"]]
        # a profile run as shipped starts fresh in a folder of its own; the others share "bench" (resume, refuse)
        experiment = f"bench-{number}-{name}" if profile else "bench"
        run_env = env | {"VERLBOX_EXPERIMENT": experiment} | (PLAIN["env"] if name == "plain" else {})
        summary = run(name, overrides, run_env, log, kill, crashes, checkpoints / experiment, until, profile)
        summary["extra"] = extras
        summary["prompts"] = prompts
        if name == "refuse":
            summary["said"] = log.read_text().strip().splitlines()[-3:]
        if name == "resume":
            text = log.read_text()
            summary["resumed_from"] = re.findall(r"Resuming from (\S+)", text)
        summaries.append(summary)
        print(json.dumps(summary), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
