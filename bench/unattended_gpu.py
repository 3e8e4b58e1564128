"""The unattended cycle with real verl on a GPU machine without Docker (the lent H200, capped at --gpu-memory-gib):
what tests/test_compose_cycle.py does in CI with a fake verl, here through the real `verlbox train` and verl 0.4.1.

Two starts on one experiment folder, the recipe's PPO profile as shipped (its batch, prompts fitted to the data):
  1. `stop`: the console's reader leaves after train's first lines (stderr then goes to a closed pipe), verl runs
     on; SIGTERM reaches `verlbox train` (as `docker compose stop` sends it) while verl writes global_step_2. The
     stop must be held until that save is on disk, then end the run with 143; verl.log must have gone on after
     the console died, and say once that it did.
  2. `resume`: a new start resumes from global_step_2; once step 3 is logged verl is interrupted (a crash), the
     supervisor restarts it from global_step_2 again, and it runs to step 4, validates and saves: exit 0, no
     out-of-memory anywhere, the memory reserved per step below the cap.
The disk that fills mid-save is left to CI (a tmpfs there); this machine mounts no small disk.

  python bench/unattended_gpu.py --out OUT --data .device/gsm8k
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ppo_gpu import disk_state, interrupt_verl, prepare

from verlbox.runtime.training.profile import load_profile

PROFILE = "p40"
STEPS = 4
SAVE_EVERY = 2
STOPPED_DURING = f"global_step_{SAVE_EVERY}"
RESTART_DELAY_S = 5
# lines the console shows before its reader leaves: train's own first lines, before verl's step lines
CONSOLE_LINES = 6
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError")


def train_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verlbox.cli", "train", "--recipe", "p40-cu124", "--", *overrides]


def read_console(stream: object, log: Path, keep: int | None) -> None:
    """Copy the console's lines to LOG; with KEEP, close the pipe after that many lines, as a reader that left."""
    with log.open("w") as handle:
        for number, line in enumerate(stream, start=1):  # type: ignore[attr-defined]
            handle.write(line)
            handle.flush()
            if keep is not None and number >= keep:
                handle.write("=== the console's reader leaves here ===\n")
                stream.close()  # type: ignore[attr-defined]
                return


def stop_during_save(command: list[str], env: dict[str, str], folder: Path, out: Path, deadline: float) -> dict:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    reader = threading.Thread(target=read_console, args=(process.stdout, out / "1-stop.console", CONSOLE_LINES))
    reader.start()
    sent_at, tracker_when_sent = None, None
    tracker = folder / "latest_checkpointed_iteration.txt"
    while process.poll() is None and time.monotonic() < deadline:
        if sent_at is None and (folder / STOPPED_DURING).is_dir():
            tracker_when_sent = tracker.read_text().strip() if tracker.is_file() else None
            process.send_signal(signal.SIGTERM)
            sent_at = time.monotonic()
        time.sleep(0.1)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    code = process.wait()
    reader.join(timeout=10)
    verl_log = (folder / "verl.log").read_text(errors="replace")
    return {
        "exit": code,
        "stop_sent_with_tracker_at": tracker_when_sent,
        "stop_to_exit_s": round(time.monotonic() - sent_at, 1) if sent_at else None,
        "after": disk_state(folder),
        "console_failure_noted_in_verl_log": verl_log.count("the console failed"),
        "verl_log_steps": verl_log.count("step:"),
        "out_of_memory": any(word in verl_log for word in OUT_OF_MEMORY),
    }


def logged_steps(metrics: Path, since: int) -> list[dict]:
    """metrics.jsonl's entries written after byte SINCE: whole lines only (verl may be writing the last)."""
    if not metrics.is_file():
        return []
    with metrics.open("rb") as handle:
        handle.seek(since)
        lines = handle.read().decode().split("\n")[:-1]
    return [json.loads(line) for line in lines]


def resume_with_crash(command: list[str], env: dict[str, str], folder: Path, out: Path, deadline: float) -> dict:
    metrics = folder / "metrics.jsonl"
    seen = metrics.stat().st_size if metrics.is_file() else 0
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    reader = threading.Thread(target=read_console, args=(process.stdout, out / "2-resume.console", None))
    reader.start()
    crashed: list[int] = []
    while process.poll() is None and time.monotonic() < deadline:
        if not crashed and any(entry["step"] == STEPS - 1 for entry in logged_steps(metrics, seen)):
            crashed = interrupt_verl(process.pid)
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    code = process.wait()
    reader.join(timeout=10)
    steps = logged_steps(metrics, seen)
    console = (out / "2-resume.console").read_text(errors="replace")
    verl_log = (folder / "verl.log").read_text(errors="replace")
    return {
        "exit": code,
        "crashed_verl_pids": crashed,
        "resume_lines": [line.strip() for line in console.splitlines() if "verl resumes from" in line],
        "restart_lines": [line.strip() for line in console.splitlines() if "; restart " in line],
        "steps_logged": [entry["step"] for entry in steps],
        "validated_at": [e["step"] for e in steps if any(key.startswith("val-") for key in e["metrics"])],
        "reserved_gb_per_step": [e["metrics"].get("perf/max_memory_reserved_gb") for e in steps],
        "after": disk_state(folder),
        "out_of_memory": any(word in verl_log for word in OUT_OF_MEMORY),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verlbox-bench"))
    parser.add_argument("--data", type=Path, help="a prepared GSM8K folder (default: synthetic GSM8K-length rows)")
    parser.add_argument("--validation-rows", type=int, default=256, help="synthetic data: test rows validated")
    parser.add_argument("--gpu-memory-gib", default="24")
    parser.add_argument("--budget-s", type=float, default=540, help="stop everything after this many seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    model, data, prompts = prepare(args.workdir, args.validation_rows, args.data)
    checkpoints = args.workdir / "checkpoints"
    folder = checkpoints / "unattended"
    env = os.environ | {
        "VERLBOX_MODEL_DIR": str(model),
        "VERLBOX_DATA_DIR": str(data),
        "VERLBOX_CHECKPOINT_DIR": str(checkpoints),
        "VERLBOX_EXPERIMENT": folder.name,
        "VERLBOX_GPU_MEMORY_GIB": args.gpu_memory_gib,
        "VERLBOX_RESTART_DELAY_S": str(RESTART_DELAY_S),
        "PYTHONUNBUFFERED": "1",
    }
    batch = load_profile(PROFILE).per_gpu["train_batch_size"]
    overrides = [
        f"data.train_batch_size={batch}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={SAVE_EVERY}",
        f"trainer.test_freq={STEPS}",
        "ray_init.num_cpus=8",
    ]
    summary: dict[str, object] = {"prompts": prompts, "overrides": overrides, "cap_gib": args.gpu_memory_gib}
    stop = stop_during_save(train_command(overrides), env, folder, args.out, deadline)
    summary["stop"] = stop
    print(json.dumps({"stop": stop}), flush=True)
    resume = resume_with_crash(train_command(overrides), env, folder, args.out, deadline)
    summary["resume"] = resume
    print(json.dumps({"resume": resume}), flush=True)
    reserved = [r for r in resume["reserved_gb_per_step"] if r is not None]
    checks = {
        "stop held until the save was on disk, then 143": stop["exit"] == 143
        and stop["after"]["tracker"] == str(SAVE_EVERY)
        and stop["stop_sent_with_tracker_at"] != str(SAVE_EVERY),
        "verl.log went on after the console died, noted once": stop["console_failure_noted_in_verl_log"] == 1
        and stop["verl_log_steps"] >= 1,
        "resumed from the save at the start and after the crash": len(resume["resume_lines"]) == 1
        and STOPPED_DURING in resume["resume_lines"][0]
        and len(resume["restart_lines"]) == 1
        and f"resuming from {STOPPED_DURING}" in resume["restart_lines"][0],
        "ran to the end after the crash, validated and saved": resume["exit"] == 0
        and bool(resume["crashed_verl_pids"])
        and STEPS in resume["validated_at"]
        and resume["after"]["tracker"] == str(STEPS),
        "no out-of-memory, reserved under the cap": not stop["out_of_memory"]
        and not resume["out_of_memory"]
        and bool(reserved)
        and max(reserved) < float(args.gpu_memory_gib),
    }
    summary["checks"] = checks
    (args.out / "unattended.json").write_text(json.dumps(summary, indent=2))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}", flush=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
