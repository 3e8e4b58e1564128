"""The achieved fp32 rate of a step: the FLOP count from a model's config and verl's real token counts, shown
on the compact line and kept in metrics.jsonl (runtime/utilization.py documents the formula)."""

from __future__ import annotations

import pytest

from test_progress import recorded_lines, recorded_steps
from verlbox.runtime.training import progress, utilization
from verlbox.runtime.training.progress import Progress, RunWatch, read_metrics
from verlbox.runtime.training.utilization import PEAK_SHARE, TFLOPS_PER_GPU, ModelShape

# Qwen2.5-0.5B-Instruct's config.json, the keys the count reads
QWEN_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}
QWEN = ModelShape.from_config(QWEN_05B)
PPO_TIMINGS = ("gen", "old_log_prob", "values", "update_critic", "update_actor")


def test_the_counted_weights_are_the_model_s_published_size_less_embedding_biases_and_norms() -> None:
    """Qwen2.5-0.5B has 494,032,768 parameters: the matmul weights counted here, the tied embedding, and
    the q/k/v biases and RMSNorm weights, which cost no matmul FLOPs."""
    embedding = QWEN.vocab * QWEN.hidden
    biases = QWEN.layers * (QWEN.heads + 2 * QWEN.kv_heads) * QWEN.head_dim
    norms = (2 * QWEN.layers + 1) * QWEN.hidden
    assert QWEN.head_dim == 64
    assert QWEN.layer_weights + embedding + biases + norms == 494_032_768


def step_metrics(tokens: float, prompt: float, response: float, seconds: float, *timings: str) -> dict[str, float]:
    return {
        utilization.TOTAL_TOKENS: tokens,
        utilization.PROMPT_LENGTH: prompt,
        utilization.RESPONSE_LENGTH: response,
        "timing_s/step": seconds,
    } | {f"timing_s/{name}": 1.0 for name in timings}


def test_a_ppo_step_is_five_actor_and_four_critic_forwards_per_real_token() -> None:
    tokens, sequence = 18_688, 292.0
    metrics = step_metrics(tokens, 36, 256, 15.2, *PPO_TIMINGS)
    actor = 2 * QWEN.layer_weights + 2 * 24 * 896 * sequence + 2 * 151_936 * 896
    critic = 2 * QWEN.layer_weights + 2 * 24 * 896 * sequence
    assert utilization.step_flops(QWEN, metrics) == pytest.approx(tokens * (5 * actor + 4 * critic))
    # about 0.15 PFLOP: the 0.35 counted padding (32,768 positions) and gradient checkpointing's recompute
    assert utilization.step_flops(QWEN, metrics) == pytest.approx(1.48e14, rel=0.01)
    # GRPO (no critic) and a reference model for KL: the passes verl timed are the passes counted
    grpo = step_metrics(tokens, 36, 256, 15.2, "gen", "old_log_prob", "ref", "update_actor")
    assert utilization.step_flops(QWEN, grpo) == pytest.approx(tokens * 6 * actor)


def test_validation_and_saving_are_not_training_time_and_the_share_needs_a_known_card() -> None:
    metrics = step_metrics(10_000, 50, 150, 30.0, *PPO_TIMINGS) | {
        "timing_s/testing": 12.0,
        "timing_s/save_checkpoint": 8.0,
    }
    assert utilization.training_seconds(metrics) == 10.0
    on_two = utilization.step_utilization(QWEN, metrics, gpus=2, gpu_name="Tesla P40")
    expected = utilization.step_flops(QWEN, metrics) / 10.0 / 2 / 1e12
    assert on_two[TFLOPS_PER_GPU] == pytest.approx(expected)
    assert on_two[PEAK_SHARE] == pytest.approx(expected / 11.8)
    unknown = utilization.step_utilization(QWEN, metrics, gpus=1, gpu_name="Some Future GPU")
    assert set(unknown) == {TFLOPS_PER_GPU}
    assert utilization.describe(unknown) == f"{unknown[TFLOPS_PER_GPU]:.1f} TFLOP/s"
    assert utilization.step_utilization(QWEN, {"timing_s/step": 3.0}, 1, "Tesla P40") == {}  # no token counts


def test_every_recorded_step_shows_its_rate_on_the_line_and_keeps_it_in_the_metrics(tmp_path) -> None:
    """verl's real console (the lent H200, capped at 24 GiB): each training step's compact line carries the
    achieved rate against the H200's peak, and metrics.jsonl keeps both numbers beside verl's."""
    shown: list[str] = []
    watch = RunWatch(
        tmp_path, Progress(16, 24, shape=QWEN, gpus=1, gpu_name="NVIDIA H200"), lambda t: shown.append(str(t))
    )
    for line in recorded_lines():
        watch.take(line, attempt=1)
    records = read_metrics(tmp_path / progress.METRICS_FILE)
    trained = [record for record in records if progress.STEP_SECONDS in record.metrics]
    assert trained and len(trained) == len([s for _, s in recorded_steps() if progress.STEP_SECONDS in s])
    for record in trained:
        achieved = record.metrics[TFLOPS_PER_GPU]
        assert 0.1 < achieved < 67 and record.metrics[PEAK_SHARE] == pytest.approx(achieved / 67)
        line = next(text for text in shown if text.startswith(f"step {record.step}/"))
        assert f"{achieved:.1f} TFLOP/s ({record.metrics[PEAK_SHARE]:.0%} of fp32 peak)" in line


def test_the_report_draws_the_rate_against_the_card_s_peak(tmp_path) -> None:
    """metrics.jsonl as train now writes it (the recorded console, watched with the model's shape): the
    report's speed panel carries the rate per step and the peak of the card run.json names."""
    import shutil

    from test_progress import RECORDED
    from verlbox.host.runs.report import read_report, render_png

    shutil.copy(RECORDED.parent / "run.json", tmp_path / "run.json")
    watch = RunWatch(tmp_path, Progress(16, 24, shape=QWEN, gpus=1, gpu_name="NVIDIA H200"), lambda t: None)
    for line in recorded_lines():
        watch.take(line, attempt=1)
    report = read_report(tmp_path)
    assert report.tflops_per_gpu.steps == report.samples_per_s.steps and report.peak_tflops == 67.0
    rates = {r.step: r.metrics[TFLOPS_PER_GPU] for r in read_metrics(tmp_path / progress.METRICS_FILE) if r.step > 0}
    assert report.tflops_per_gpu.values == [rates[step] for step in report.tflops_per_gpu.steps]
    assert render_png(report)[:4] == b"\x89PNG"


def test_each_update_epoch_counts_and_unusable_counts_give_no_figure() -> None:
    metrics = step_metrics(1_000, 50, 150, 10.0, *PPO_TIMINGS)
    once = utilization.step_flops(QWEN, metrics)
    twice = utilization.step_flops(QWEN, metrics, {"actor": 2, "critic": 2})
    actor, critic = QWEN.forward_flops_per_token(200, True), QWEN.forward_flops_per_token(200, False)
    assert twice - once == pytest.approx(1_000 * 3 * (actor + critic))
    for broken in ({utilization.TOTAL_TOKENS: float("nan")}, {utilization.PROMPT_LENGTH: float("inf")}):
        assert utilization.step_utilization(QWEN, metrics | broken, 1, "Tesla P40") == {}
    assert utilization.step_utilization(QWEN, metrics | {"timing_s/step": float("nan")}, 1, "Tesla P40") == {}


def test_the_rollout_s_tokens_per_second_are_the_batch_s_response_tokens_over_the_gen_phase() -> None:
    """verl's recorded step 1: 16 responses of 256 tokens behind 36-token prompts (4,672 real tokens), gen
    8.619 s, so 4,096 generated tokens in 8.619 s; verl's own ms per response token says the same."""
    rate = utilization.generation_tokens_per_second
    metrics = step_metrics(4_672, 36, 256, 17.993) | {"timing_s/gen": 8.619, "timing_per_token_ms/gen": 2.104}
    assert utilization.generated_tokens(metrics) == pytest.approx(4_096)
    assert rate(metrics) == pytest.approx(4_096 / 8.619)
    assert rate(metrics) == pytest.approx(1000 / 2.104, rel=1e-3)
    # GRPO's rollout.n: 8 answers to each of 4 prompts are 32 rows in verl's batch and its token count
    grpo = step_metrics(32 * (90 + 200), 90, 200, 20.0) | {"timing_s/gen": 4.0}
    assert rate(grpo) == pytest.approx(32 * 200 / 4.0)
    # without usable token counts, verl's rounded ms per token; without a gen phase, nothing
    assert rate(metrics | {utilization.TOTAL_TOKENS: float("nan")}) == pytest.approx(1000 / 2.104)
    assert rate({"timing_per_token_ms/gen": 2.0}) == 500.0
    assert rate(step_metrics(4_672, 36, 256, 17.993)) is None
    assert rate(metrics | {"timing_s/gen": 0.0, "timing_per_token_ms/gen": 0.0}) is None


def test_the_line_carries_the_generation_rate_beside_the_tflops_or_alone() -> None:
    metrics = step_metrics(4_672, 36, 256, 17.993) | {"timing_s/gen": 8.619}
    assert utilization.describe(metrics) == "gen 475 tok/s"
    rated = metrics | {TFLOPS_PER_GPU: 8.26, PEAK_SHARE: 0.123}
    assert utilization.describe(rated) == "8.3 TFLOP/s (12% of fp32 peak)  gen 475 tok/s"
    assert utilization.describe({}) is None


def test_every_recorded_step_shows_its_generation_rate(tmp_path) -> None:
    """The recorded console's compact lines: each training step's generated tokens/s from its own metrics."""
    shown: list[str] = []
    watch = RunWatch(tmp_path, Progress(16, 24), lambda t: shown.append(str(t)))
    for line in recorded_lines():
        watch.take(line, attempt=1)
    steps = [(number, s) for number, s in recorded_steps() if "timing_s/gen" in s]
    assert steps
    for number, metrics in steps:
        prompt, response = metrics[utilization.PROMPT_LENGTH], metrics[utilization.RESPONSE_LENGTH]
        generated = metrics[utilization.TOTAL_TOKENS] * response / (prompt + response)
        rate = generated / metrics["timing_s/gen"]
        assert rate == pytest.approx(1000 / metrics["timing_per_token_ms/gen"], rel=1e-3)
        line = next(text for text in shown if text.startswith(f"step {number}/"))
        assert f"gen {rate:.0f} tok/s" in line
