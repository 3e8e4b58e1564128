"""How close a training step came to the GPU's fp32 limit: achieved TFLOP/s and its share of the card's peak.

verl's own `perf/mfu/*` divides by a bf16 tensor-core peak that a P40 does not have (it says 0.02 there).
This counts the model's useful work in a step instead, from the model's config and the step's real tokens:

- a forward pass costs, per real token, 2 FLOPs per weight of every layer's matmuls (attention's q, k, v,
  o and the MLP's gate, up, down), plus causal attention's 2 x layers x (heads x head_dim) x T (scores
  and the weighted sum, averaged over a sequence of T real tokens), plus 2 x vocab x hidden for the
  output logits where a pass computes them (the actor and the reference model, not the critic's value
  head); embedding look-ups cost nothing;
- a step is one forward of the actor over every real token for generation (prompt and response),
  one more for the old log-probs, one for the reference (when verl ran it), one critic forward for the
  values, and forward + backward (3 forwards) per update epoch (`ppo_epochs`), actor and critic;
- padding, recomputation (gradient checkpointing) and offload copies are not useful work: a profile
  that computes less of them reads higher here.
Real tokens are verl's own counts: perf/total_num_tokens (the attention mask's sum over the batch) and
prompt_length/mean + response_length/mean for T. Time is the step's less validation and saving.
The peak is the card's published fp32 rate (no tensor cores), per GPU, at boost clock.

Beside it, the rollout's speed: response tokens generated per second of verl's gen phase, all GPUs
together (the batch's real tokens times response_length/mean's share of a row, over timing_s/gen).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

TOTAL_TOKENS = "perf/total_num_tokens"
PROMPT_LENGTH = "prompt_length/mean"
RESPONSE_LENGTH = "response_length/mean"
NOT_TRAINING = ("timing_s/testing", "timing_s/save_checkpoint")
# verl's timing key -> (forward passes, the actor's shape: with logits; else the critic's); the updates'
# 3 (forward + backward) are per epoch
PASSES = {
    "timing_s/gen": (1, True),
    "timing_s/old_log_prob": (1, True),
    "timing_s/ref": (1, True),
    "timing_s/values": (1, False),
    "timing_s/update_critic": (3, False),
    "timing_s/update_actor": (3, True),
}
UPDATES = {"timing_s/update_actor": "actor", "timing_s/update_critic": "critic"}
# Published fp32 (non-tensor-core) peaks at boost clock, TFLOP/s, by the name nvidia-smi prints
PEAK_FP32_TFLOPS = {
    "Tesla P40": 11.8,
    "Tesla P4": 5.5,
    "Tesla P100-PCIE-16GB": 9.3,
    "Tesla P100-PCIE-12GB": 9.3,
    "Tesla P100-SXM2-16GB": 10.6,
    "Tesla M40": 6.8,
    "Tesla M40 24GB": 6.8,
    "Tesla V100-PCIE-16GB": 14.0,
    "Tesla V100-PCIE-32GB": 14.0,
    "Tesla V100-SXM2-16GB": 15.7,
    "Tesla V100-SXM2-32GB": 15.7,
    "Tesla T4": 8.1,
    "NVIDIA A100-SXM4-40GB": 19.5,
    "NVIDIA A100-SXM4-80GB": 19.5,
    "NVIDIA A100-PCIE-40GB": 19.5,
    "NVIDIA A100 80GB PCIe": 19.5,
    "NVIDIA H100 80GB HBM3": 67.0,
    "NVIDIA H100 PCIe": 51.0,
    "NVIDIA H200": 67.0,
}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """From a Hugging Face decoder's config.json (Qwen2, Llama and their kin name these keys alike)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config["vocab_size"]),
        )

    @property
    def layer_weights(self) -> int:
        """Matmul weights of all layers: q and o (hidden x heads*head_dim), k and v (kv heads), the MLP's three."""
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    def forward_flops_per_token(self, sequence: float, logits: bool) -> float:
        attention = 2 * self.layers * self.heads * self.head_dim * sequence
        return 2 * self.layer_weights + attention + (2 * self.vocab * self.hidden if logits else 0)


def read_shape(model_folder: Path) -> ModelShape | None:
    """The model folder's shape; None when its config cannot be read as a decoder's."""
    try:
        return ModelShape.from_config(json.loads((model_folder / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def step_flops(shape: ModelShape, metrics: dict[str, float], epochs: dict[str, int] | None = None) -> float | None:
    """The useful FLOPs of one logged step (all GPUs together); None when verl logged no usable token counts.
    EPOCHS: the updates' ppo_epochs by model ("actor", "critic"), 1 where not given."""
    tokens = metrics.get(TOTAL_TOKENS)
    lengths = (metrics.get(PROMPT_LENGTH), metrics.get(RESPONSE_LENGTH))
    if not tokens or not math.isfinite(tokens) or None in lengths or not all(map(math.isfinite, lengths)):
        return None
    sequence = lengths[0] + lengths[1]
    return sum(
        passes * (epochs or {}).get(UPDATES.get(key, ""), 1) * tokens * shape.forward_flops_per_token(sequence, logits)
        for key, (passes, logits) in PASSES.items()
        if key in metrics
    )


def training_seconds(metrics: dict[str, float]) -> float | None:
    """The step's time less validation and saving (work done for the run, not the step's own)."""
    seconds = metrics.get("timing_s/step")
    if not seconds:
        return None
    seconds -= sum(metrics.get(key, 0.0) for key in NOT_TRAINING)
    return seconds if math.isfinite(seconds) and seconds > 0 else None


# what train adds to each step's metrics (metrics.jsonl), beside verl's own
TFLOPS_PER_GPU = "verlbox/fp32_tflops_per_gpu"
PEAK_SHARE = "verlbox/fp32_peak_share"


def step_utilization(
    shape: ModelShape,
    metrics: dict[str, float],
    gpus: int,
    gpu_name: str | None,
    epochs: dict[str, int] | None = None,
) -> dict[str, float]:
    """TFLOPS_PER_GPU and, for a card in the table, PEAK_SHARE; nothing where the step cannot say."""
    flops, seconds = step_flops(shape, metrics, epochs), training_seconds(metrics)
    if flops is None or seconds is None or gpus < 1:
        return {}
    achieved = flops / seconds / gpus / 1e12
    peak = PEAK_FP32_TFLOPS.get(gpu_name or "")
    return {TFLOPS_PER_GPU: achieved} | ({PEAK_SHARE: achieved / peak} if peak else {})


GEN_SECONDS = "timing_s/gen"
# verl's timing_s/gen x 1000 / the batch's response tokens (compute_timing_metrics)
GEN_MS_PER_TOKEN = "timing_per_token_ms/gen"


def generated_tokens(metrics: dict[str, float]) -> float | None:
    """The response tokens the step's rollout generated, all GPUs together: verl's real-token count of the
    batch (every response, rollout.n included) times the response's share of a row's mean length."""
    tokens, prompt, response = (metrics.get(key) for key in (TOTAL_TOKENS, PROMPT_LENGTH, RESPONSE_LENGTH))
    if tokens is None or prompt is None or response is None or not prompt + response > 0:
        return None
    generated = tokens * response / (prompt + response)
    return generated if math.isfinite(generated) else None


def generation_tokens_per_second(metrics: dict[str, float]) -> float | None:
    """Generated tokens per second of the gen phase, all GPUs together; None when verl logged no gen phase.

    From the exact token count where verl logged it; else from its milliseconds per response token, which
    the console rounds to 3 decimals."""
    seconds, generated = metrics.get(GEN_SECONDS), generated_tokens(metrics)
    if seconds is not None and generated is not None and seconds > 0 and math.isfinite(seconds):
        return generated / seconds
    per_token = metrics.get(GEN_MS_PER_TOKEN)
    if per_token is not None and per_token > 0 and math.isfinite(per_token):
        return 1000 / per_token
    return None


def describe(metrics: dict[str, float]) -> str | None:
    """The step's achieved rate and its rollout's generated tokens/s, where verl's metrics say them."""
    parts = []
    if (achieved := metrics.get(TFLOPS_PER_GPU)) is not None:
        share = metrics.get(PEAK_SHARE)
        parts.append(f"{achieved:.1f} TFLOP/s" + (f" ({share:.0%} of fp32 peak)" if share is not None else ""))
    if (rate := generation_tokens_per_second(metrics)) is not None:
        parts.append(f"gen {rate:.0f} tok/s")
    return "  ".join(parts) or None
