"""A task a working RL loop learns in minutes, and the check that it did: proof that the patched verl learns.

Random weights and GSM8K give a reward of 0 at every step, so a run on them shows that PPO runs, not that
it improves anything. This task is made on the spot (no download): the tiny random Qwen2-shaped model of
`fixtures`, prompts of a few words, and a rule reward, the share of the response's words that are filler
tokens `t100`..`t199` of its tokenizer. A uniform policy scores about 0.39 (100 of 256 tokens); a loop that
samples, scores, computes advantages and updates the policy drives it above 0.8 in 40 steps (measured in
docs/benchmarks.md). A loop that does not learn (learning rate 0, a flipped advantage sign) stays at or
below where it started.

verl calls `compute_score` through `custom_reward_function` (path: this file, name: compute_score).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from verlbox.runtime.checks.fixtures import WORDS
from verlbox.runtime.training.data import PREPARED, write_parquet

DATA_SOURCE = "verlbox/fillers"
# tokens of the tiny model's tokenizer (fixtures.make_tokenizer names its fillers t<index> up to 255)
FILLERS = frozenset(f"t{index}" for index in range(100, 200))

# What a run needs beyond its profile: the task's files, its reward, short sequences, a learning rate a
# tiny model moves at, no saves or validation (they cost time and prove nothing here).
STEPS = 40
TASK_OVERRIDES = [
    f"custom_reward_function.path={Path(__file__).resolve()}",
    "custom_reward_function.name=compute_score",
    "data.max_prompt_length=32",
    "data.max_response_length=16",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "critic.optim.lr=1e-3",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    f"trainer.total_training_steps={STEPS}",
    # verl stops at the end of its epochs first: one step an epoch is enough to reach STEPS
    f"trainer.total_epochs={STEPS}",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "ray_init.num_cpus=4",
]
# per algorithm: the batch (prompts; GRPO answers each 4 times) and its mini and micro batches
ALGORITHM_OVERRIDES = {
    "ppo": [
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "critic.ppo_micro_batch_size_per_gpu=8",
        "+actor_rollout_ref.rollout.micro_batch_size=32",
    ],
    "grpo": [
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "+actor_rollout_ref.rollout.micro_batch_size=64",
    ],
}
SCORE = "critic/score/mean"
# a pass: the last steps' mean score at least this, and at least RISE above the first step's. Measured on
# the H200 (docs/benchmarks.md): working loops ended at 0.83 (PPO) and 0.86 (GRPO), broken ones (learning
# rate 0, advantages negated) at 0.39 or below: the bar sits between, with room on both sides.
PASS_SCORE, RISE, LAST = 0.7, 0.25, 5


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: object = None) -> float:
    """The share of the response's words that are fillers (0 for an empty response)."""
    words = solution_str.split()
    return sum(word in FILLERS for word in words) / len(words) if words else 0.0


def make_task(directory: Path, rows: int = 256, seed: int = 0) -> Path:
    """The task's parquet files (train, test, validation) in verl's row format."""
    rng = random.Random(seed)
    prompts = [" ".join(rng.choices(WORDS, k=rng.randint(3, 8))) for _ in range(rows)]
    table = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "fillers",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"split": "train", "index": index},
        }
        for index, prompt in enumerate(prompts)
    ]
    directory.mkdir(parents=True, exist_ok=True)
    for name in PREPARED:
        write_parquet(table, directory / name)
    return directory


@dataclass(frozen=True)
class Verdict:
    learned: bool
    first: float
    last: float
    scores: list[float]

    def describe(self) -> str:
        rule = f"pass: last {LAST} steps >= {PASS_SCORE} and >= first + {RISE}"
        return f"score {self.first:.3f} -> {self.last:.3f} over {len(self.scores)} steps ({rule})"


def judge(scores: list[float]) -> Verdict:
    """Whether a run's per-step scores show learning (too few steps never do)."""
    if len(scores) < 2 * LAST:
        return Verdict(False, scores[0] if scores else 0.0, scores[-1] if scores else 0.0, scores)
    first, last = scores[0], sum(scores[-LAST:]) / LAST
    return Verdict(last >= PASS_SCORE and last >= first + RISE, first, last, scores)
