"""Scale-out on a GPU machine: one GPU before/after the batch change, two GPUs on one node, two Ray nodes.

Every run goes through the real `verlbox train` with RAY_ADDRESS set, so the cluster preflight and the
topology detection run too. Ray nodes are started here, one per GPU set, WITHOUT the per-process memory
cap or the profile's variables in their environment (unless --cap-in-nodes): `train` hands both to
every Ray worker through Ray's job config, and each run records what its workers got (read from
/proc/PID/environ of the `ray::` processes) next to the raylets' own environment.

  python bench/scale_gpu.py --out OUT --phase single --phase pair     # 1 GPU (old vs new batch) || 2 GPUs
  python bench/scale_gpu.py --out OUT --phase nodes                   # 2 Ray nodes, SIGKILL, resume

single: the old per-GPU batch (16) on GPU 0 and the new one (64) on GPU 1, at the same time, each its
own Ray head. pair: one Ray head holding both GPUs (pair-nooffload: the same with FSDP offload off).
nodes: a head with GPU 0 and a worker with GPU 1; first a Ray job with train's environment asks one GPU
task on each node to allocate 25 GiB (refused under the 24 GiB cap; then again without the job config,
where it must succeed), then `train --nodes 2` (batch 32, 64-token responses), SIGKILLed once step 5 is
saved, then restarted to resume up to step 10.

Prompts as in ppo_gpu.py: synthetic rows with GSM8K's question lengths (--data-seed), or --data DIR (a
prepared GSM8K folder); each summary says which.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ppo_gpu import _metrics, prepare

from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training.memory_cap import SITECUSTOMIZE_DIR
from verlbox.runtime.training.profile import Topology, TrainingPlan
from verlbox.runtime.training.train import RAY_JOB_CONFIG, train_environment

SKIP_STEPS = 2  # warm-up steps left out of the medians (--skip-steps)
OLD_SINGLE_GPU = [
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.rollout.micro_batch_size=16",
]
NO_OFFLOAD = [
    f"{section}.fsdp_config.{what}_offload=False"
    for section in ("actor_rollout_ref.actor", "critic.model")
    for what in ("param", "optimizer")
]
# what a worker must get from train (the profile's allocator setting, the cap) and where it came from
WATCHED = ("PYTORCH_CUDA_ALLOC_CONF", "VERLBOX_GPU_MEMORY_GIB", "CUDA_VISIBLE_DEVICES")


def process_environments() -> list[dict[str, object]]:
    """The raylets' and the busy Ray workers' environments on this host (one row per distinct kind)."""
    rows: dict[tuple[object, ...], dict[str, object]] = {}
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        raylet = title.endswith("/raylet")
        if not (raylet or title.startswith("ray::")) or "IDLE" in title:
            continue
        env = dict(item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item)
        row: dict[str, object] = {"process": "raylet" if raylet else title.split(".")[0][:60]}
        row |= {key: env.get(key) for key in WATCHED}
        row["memcap_on_PYTHONPATH"] = str(SITECUSTOMIZE_DIR) in env.get("PYTHONPATH", "").split(os.pathsep)
        rows.setdefault(tuple(row.values()), row | {"count": 0})["count"] += 1  # type: ignore[operator]
    return sorted(rows.values(), key=lambda row: str(row["process"]))


class Run:
    """One `verlbox train` process: its log, its per-step metrics, and a SIGKILL once a step is saved."""

    def __init__(self, name: str, words: list[str], env: dict[str, str], out: Path, batch: int) -> None:
        self.name, self.batch = name, batch
        self.log = out / f"{name}.log"
        self.steps: dict[int, dict[str, float]] = {}
        self.topology = ""
        self.killed = False
        self.environments: list[dict[str, object]] = []
        self.started = time.monotonic()
        command = [sys.executable, "-m", "verlbox.cli", "train", *words]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log.open("a") as handle:
            for line in self.process.stdout:
                handle.write(line)
                if line.startswith("training on "):
                    self.topology = line.strip()
                if parsed := _metrics(line):
                    if not self.steps:  # verl's workers are all up and busy by the first step
                        self.environments = process_environments()
                    self.steps[parsed[0]] = parsed[1]
                    print(f"[{self.name}] step {parsed[0]}: {parsed[1].get('timing_s/step', 0):.1f} s", flush=True)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.killed = True

    def wait(self, deadline: float, saved: Path | None = None, step: int | None = None) -> dict[str, object]:
        while self.process.poll() is None:
            done = saved is not None and saved.is_file() and saved.read_text().strip() == str(step)
            if done or time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(1)
        self.process.wait()
        self.reader.join(timeout=10)
        return self.summary()

    def summary(self) -> dict[str, object]:
        ordered = [self.steps[k] for k in sorted(self.steps)]
        steady = [s["timing_s/step"] for s in ordered[SKIP_STEPS:] if "timing_s/step" in s]
        median = statistics.median(steady) if steady else float("nan")
        gen = [s.get("timing_s/gen", float("nan")) for s in ordered[SKIP_STEPS:]]
        return {
            "run": self.name,
            "topology": self.topology,
            "exit": self.process.returncode,
            "killed": self.killed,
            "wall_s": round(time.monotonic() - self.started, 1),
            "steps": sorted(self.steps),
            "batch": self.batch,
            "median_step_s": round(median, 2),
            "median_gen_s": round(statistics.median(gen), 2) if gen else None,
            "samples_per_s": round(self.batch / median, 3),
            "reserved_gb_max": max((s.get("perf/max_memory_reserved_gb", 0) for s in ordered), default=None),
            "allocated_gb_max": max((s.get("perf/max_memory_allocated_gb", 0) for s in ordered), default=None),
            "step_s": {k: round(self.steps[k].get("timing_s/step", float("nan")), 2) for k in sorted(self.steps)},
            "environments": self.environments,
        }


def ray(*words: str, env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "ray.scripts.scripts", *words]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"ray {' '.join(words)}: exit {done.returncode}: {done.stderr[-2000:]}")


@dataclass(frozen=True)
class Env:
    train: dict[str, str]  # what `verlbox train` is started with (RAY_ADDRESS added per run)
    nodes: dict[str, str]  # what `ray start` is started with, so what the raylets hand their workers


def start_node(gpus: str, port: int, env: dict[str, str], head: int | None = None) -> str:
    """A Ray node holding `gpus`; distinct ports, since several nodes share this host."""
    node_env = env | {"CUDA_VISIBLE_DEVICES": gpus}
    offset = port - 6380
    # each node its own worker port range: with Ray's default one, two clusters' drivers both took 10002
    workers = ["--min-worker-port", str(10002 + 1000 * offset), "--max-worker-port", str(10999 + 1000 * offset)]
    ports = [
        "--dashboard-agent-listen-port",
        str(52365 + offset),
        *workers,
        "--num-cpus",
        "12",
        "--disable-usage-stats",
    ]
    if head is None:
        ray("start", "--head", "--port", str(port), "--include-dashboard", "false",
            "--ray-client-server-port", str(23001 + offset), *ports, env=node_env)  # fmt: skip
    else:
        ray("start", "--address", f"127.0.0.1:{head}", *ports, env=node_env)
    return f"127.0.0.1:{head or port}"


def common(steps: int, save_freq: int = -1) -> list[str]:
    resume = "auto" if save_freq > 0 else "disable"
    return [f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", f"trainer.save_freq={save_freq}",
            f"trainer.resume_mode={resume}"]  # fmt: skip


def run_env(base: dict[str, str], address: str, experiment: str) -> dict[str, str]:
    return base | {"RAY_ADDRESS": address, "VERLBOX_EXPERIMENT": experiment}


def phase_single(env: Env, out: Path, steps: int, budget: float) -> list[dict[str, object]]:
    old_at, new_at = start_node("0", 6380, env.nodes), start_node("1", 6381, env.nodes)
    deadline = time.monotonic() + budget
    old = Run("1gpu-batch16", ["--", *common(steps), *OLD_SINGLE_GPU], run_env(env.train, old_at, "old"), out, 16)
    new = Run("1gpu-batch64", ["--", *common(steps)], run_env(env.train, new_at, "new"), out, 64)
    return [new.wait(deadline), old.wait(deadline)]


def phase_pair(env: Env, out: Path, steps: int, budget: float, offload: bool = True) -> list[dict[str, object]]:
    address = start_node("0,1", 6382, env.nodes)
    name, words = ("2gpu-1node", []) if offload else ("2gpu-1node-nooffload", NO_OFFLOAD)
    pair = Run(name, ["--", *common(steps), *words], run_env(env.train, address, name), out, 128)
    return [pair.wait(time.monotonic() + budget)]


# A Ray job as verl's main_ppo starts one (ray.init with its runtime_env), one GPU task per node
CAP_PROBE = """
import json, os, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}}, logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1, max_calls=1)
def look():
    import torch
    try:
        torch.empty(25 * 2**30, dtype=torch.uint8, device="cuda")
        result = "allocated"
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError
        result = "refused: " + " ".join(str(exc).split())[:400]
    env = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "VERLBOX_GPU_MEMORY_GIB", "CUDA_VISIBLE_DEVICES")}
    return {"node": ray.get_runtime_context().get_node_id()[:8], **env,
            "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None), "25 GiB": result}

nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
refs = [look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes]
print(json.dumps(ray.get(refs, timeout=120)))
"""


def probe_cap(env: Env, address: str, gib: float) -> dict[str, object]:
    """Each node's GPU task, once in a job with train's environment (its job config) and once without."""
    spec = load_recipe("p40-cu124").image_spec()
    with_config = train_environment(TrainingPlan(spec, {}, Topology(1, 2)), run_env(env.train, address, "p"), gib)
    results: dict[str, object] = {}
    without = run_env(env.train, address, "p")  # train's own input: no job config in it
    for name, job_env in [("train's environment", with_config), ("no job config", without)]:
        done = subprocess.run([sys.executable, "-c", CAP_PROBE], env=job_env, capture_output=True, text=True,
                              timeout=240, check=False)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        results[name] = json.loads(lines[-1]) if done.returncode == 0 and lines else done.stderr[-1500:]
        print(f"[cap probe] {name}: {results[name]}", flush=True)
    return {"run": "cap-probe", "job_config": json.loads(with_config[RAY_JOB_CONFIG]), **results}


def phase_nodes(env: Env, out: Path, checkpoints: Path, budget: float, gib: float) -> list[dict[str, object]]:
    shutil.rmtree(checkpoints / "nodes", ignore_errors=True)  # a rerun on a warm machine starts at step 1
    address = start_node("0", 6383, env.nodes)
    start_node("1", 6384, env.nodes, head=6383)
    deadline = time.monotonic() + budget
    probe = probe_cap(env, address, gib)
    # a correctness run (placement over two nodes, SIGKILL, resume): short responses keep it inside one call
    words = ["--nodes", "2", "--", *common(10, save_freq=5), "data.train_batch_size=32", "data.max_response_length=64"]
    saved = checkpoints / "nodes" / "latest_checkpointed_iteration.txt"
    first = Run("2nodes-killed", words, run_env(env.train, address, "nodes"), out, 32).wait(deadline, saved, 5)
    second = Run("2nodes-resumed", words, run_env(env.train, address, "nodes"), out, 32)
    summary = second.wait(deadline)
    summary["resumed_from"] = [line for line in second.log.read_text().splitlines() if "Resuming from" in line][-1:]
    return [probe, first, summary]


def main() -> int:
    global SKIP_STEPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verlbox-bench"))
    parser.add_argument(
        "--phase", action="append", choices=["single", "pair", "pair-nooffload", "nodes"], required=True
    )
    parser.add_argument("--steps", type=int, default=5, help="steps of each throughput run")
    parser.add_argument("--budget-s", type=float, action="append", help="per phase, in --phase order")
    parser.add_argument("--gpu-memory-gib", default="24")
    parser.add_argument("--data", type=Path, help="a prepared GSM8K folder to train on instead of synthetic rows")
    parser.add_argument("--data-seed", type=int, default=0, help="synthetic data: the draw of question lengths")
    parser.add_argument("--skip-steps", type=int, default=SKIP_STEPS, help="warm-up steps left out of the medians")
    parser.add_argument(
        "--cap-in-nodes", action="store_true", help="also put the cap in the Ray nodes' environment (the old way)"
    )
    args = parser.parse_args()
    SKIP_STEPS = args.skip_steps
    args.out.mkdir(parents=True, exist_ok=True)
    model, data, prompts = prepare(args.workdir, data=args.data, seed=args.data_seed)
    print(f"prompts: {prompts}", flush=True)
    spec = args.workdir / "image-spec.json"
    spec.write_text(load_recipe("p40-cu124").image_spec().model_dump_json())
    checkpoints = args.workdir / "checkpoints"
    base = os.environ | {
        "VERLBOX_MODEL_DIR": str(model),
        "VERLBOX_DATA_DIR": str(data),
        "VERLBOX_CHECKPOINT_DIR": str(checkpoints),
        "VERLBOX_IMAGE_SPEC": str(spec),
        "PYTHONUNBUFFERED": "1",
    }
    # train reads the cap from VERLBOX_GPU_MEMORY_GIB and hands it (and the profile's variables) to Ray's workers
    train_env = base | {"VERLBOX_GPU_MEMORY_GIB": args.gpu_memory_gib}
    nodes_env = {k: v for k, v in base.items() if k not in ("VERLBOX_GPU_MEMORY_GIB", "PYTORCH_CUDA_ALLOC_CONF")}
    if args.cap_in_nodes:
        nodes_env |= {
            "VERLBOX_GPU_MEMORY_GIB": args.gpu_memory_gib,
            "PYTHONPATH": os.pathsep.join([str(SITECUSTOMIZE_DIR), os.environ.get("PYTHONPATH", "")]),
        }
    env = Env(train_env, nodes_env)
    summaries: list[dict[str, object]] = []
    budgets = args.budget_s or [250.0] * len(args.phase)
    for phase, budget in zip(args.phase, budgets, strict=True):
        before = len(summaries)
        try:
            if phase == "single":
                summaries += phase_single(env, args.out, args.steps, budget)
            elif phase.startswith("pair"):
                summaries += phase_pair(env, args.out, args.steps, budget, offload=phase == "pair")
            else:
                summaries += phase_nodes(env, args.out, checkpoints, budget, float(args.gpu_memory_gib))
        finally:
            ray("stop", "--force", env=base)
        for summary in summaries[before:]:
            summary["prompts"] = prompts
        # after every phase: a call cut short still brings back what finished
        (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))
        brief = [{k: v for k, v in s.items() if k != "environments"} for s in summaries[before:]]
        print(json.dumps(brief), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
