"""The learning check on a GPU machine without Docker, with the sabotages that must fail it.

Each run is smoke's learning run (the tiny task through the real `verlbox train`, 40 steps); its run
folder (metrics.jsonl, verl.log, run.json) is copied to OUT/RUN for `verlbox report` on the host, and
one JSON line per run says its scores and verdict.

    python3 bench/learn_gpu.py --out OUT --run ppo --run grpo --run grpo:lr0 --run ppo:flip

Sabotages: `lr0` sets the actor's learning rate to 0 (the policy never moves); `flip` negates the
advantages inside verl's PPO policy loss (a copy of verl, patched, first on PYTHONPATH for that run
only), so the policy is pushed away from what the reward favours.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.checks.smoke import RUN_EXPERIMENT, SmokeContext, learning_run

LR_ZERO = ("actor_rollout_ref.actor.optim.lr=0",)
# the first statement of verl 0.4.1's compute_policy_loss, which both profiles use
POLICY_LOSS_START = "    negative_approx_kl = log_prob - old_log_prob\n"


def flipped_verl(folder: Path) -> Path:
    """A copy of the installed verl whose policy loss sees every advantage negated."""
    if (folder / "verl").is_dir():
        return folder
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    shutil.copytree(Path(spec.origin).parent, folder / "verl")
    algorithms = folder / "verl" / "trainer" / "ppo" / "core_algos.py"
    text = algorithms.read_text()
    assert POLICY_LOSS_START in text, "not verl 0.4.1's core_algos.py"
    algorithms.write_text(text.replace(POLICY_LOSS_START, "    advantages = -advantages\n" + POLICY_LOSS_START, 1))
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--recipe", default="p40-cu124")
    parser.add_argument("--run", action="append", required=True, help="ppo|grpo, optionally :lr0 or :flip")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="verlbox-learn-") as workdir:
        ctx = SmokeContext(load_recipe(args.recipe).image_spec(), Path(workdir))
        for name in args.run:
            algorithm, _, sabotage = name.partition(":")
            extra, path = (LR_ZERO if sabotage == "lr0" else ()), os.environ.get("PYTHONPATH", "")
            if sabotage == "flip":
                os.environ["PYTHONPATH"] = f"{flipped_verl(Path(workdir) / 'flipped')}:{path}"
            started = time.monotonic()
            try:
                run, verdict = learning_run(ctx, algorithm, name.replace(":", "-"), extra)
            finally:
                os.environ["PYTHONPATH"] = path
            folder = Path(workdir) / "checkpoints" / name.replace(":", "-") / RUN_EXPERIMENT
            if folder.is_dir():
                shutil.copytree(folder, args.out / name.replace(":", "-"), dirs_exist_ok=True)
            summary = {
                "run": name,
                "exit": run.returncode,
                "seconds": round(time.monotonic() - started, 1),
                "learned": verdict.learned,
                "verdict": verdict.describe(),
                "scores": [round(score, 4) for score in verdict.scores],
            }
            if run.returncode != 0:
                summary["tail"] = run.tail
            print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
