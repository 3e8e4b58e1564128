"""Decoding for verl's HF rollout: a static KV cache and one decode step captured in a CUDA graph.

HF `generate` spends most of a small model's decode step launching kernels from Python. Here the
cache is allocated once for the whole response (batch x (prompt + max_new_tokens)), the prompt is
run eagerly, and one decode step (embedding to logits, every layer, the cache write) is captured
in a `torch.cuda.CUDAGraph` and replayed for every token: no torch.compile, no Triton, so Pascal
runs it. What happens between steps stays HF's own: the logits processors that `generate` would
build from the same generation config (temperature, top-k, top-p and any the model's config adds),
softmax and `torch.multinomial` (or argmax), EOS and pad handling.

Positions advance with the response, as verl's log-prob pass computes them (transformers 4.51's
`generate` kept a given `position_ids` at the last prompt position for every new token).

Weights: under FSDP the caller holds every weight whole (`summon_full_params(recurse=True)`) and
the decode runs the wrapped modules directly, so no collective runs between steps and each rank
stops when its own rows have ended. The graph is captured once per call: the weights move between
calls (parameter offload) and the cache is freed after, so nothing stays on the GPU for the update.

Anything the graph cannot do (no CUDA, a bf16 autocast, a capture that fails) is one line and HF
`generate`, so a rollout never fails for the sake of speed.

Two more parts, each its own rollout key, apply to either decoder (`rollout_generate`, which verl's patched
HF rollout calls):

- fold_attention: transformers 4.51's `sdpa_attention_forward` copies every KV head once per query head of
  its group (`repeat_kv`) in every layer at every step: for Qwen2.5-0.5B (14 query heads over 2 KV heads)
  each decoded token first writes a 7x copy of the whole cache, then reads it. For a one-token query the
  copy is avoidable exactly: a group's query heads become query rows of its KV head, so SDPA reads each KV
  head once, in place (the mask, one row per sequence, broadcasts over them). Longer queries (the prompt
  pass, training) keep transformers' own path: there the copy is the size of the query itself, and torch
  2.6's SDPA avoids it (`enable_gqa`) in its flash kernel, which needs sm80 and half precision; its math
  kernel repeats the heads itself, and its memory-efficient kernel (a P40's in fp32) is not known to take
  grouped heads (bench/decode_gpu.py asks the device), so on a P40 it would gain nothing known.
- trim_padding: the prompts are decoded over the batch's own longest prompt: columns that are padding in
  every row are dropped before and put back after, so verl gets the same tensors, shaped as before.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessorList, StaticCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

log = logging.getLogger(__name__)

# Rows that ended are checked this often, not every token: each check waits for the GPU, and
# steps decoded after every row ended only append pad, which verl appends anyway.
STOP_CHECK_EVERY = 8
# warm-up passes before capture, on a side stream, as torch's CUDA graph notes ask
WARMUP_STEPS = 2
# the rollout keys verl's patched HF rollout reads (each off unless set), in the order rollout_generate takes them
ROLLOUT_KEYS = ("graph_decode", "fold_attention", "trim_padding")


@dataclass(frozen=True)
class Decoded:
    sequences: torch.Tensor  # (rows, prompt + generated): the prompt, then the response padded with pad
    graphed: bool  # the decode steps were replays of one captured graph
    fallback: str | None  # why HF generate ran where the static decode was asked for, or None


@contextmanager
def unwrapped(module: nn.Module) -> Iterator[nn.Module]:
    """The model with every FSDP wrapper replaced by the module it wraps, for as long as the caller holds
    the full weights; the wrappers are put back after, whatever happens."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FSDP):
                swapped.append((parent, name, child))
                setattr(parent, name, child._fsdp_wrapped_module)
    try:
        yield module._fsdp_wrapped_module if isinstance(module, FSDP) else module
    finally:
        for parent, name, child in reversed(swapped):
            setattr(parent, name, child)


def rollout_generate(module: nn.Module, config: Mapping[str, Any]) -> Callable[..., Decoded]:
    """A stand-in for `module.generate` taking the keywords verl's HF rollout passes it, decoding as the
    rollout CONFIG's keys (ROLLOUT_KEYS) ask: the static decoder or HF generate, groups folded or not,
    prompts trimmed to the batch's longest or not. The sequences come back as wide as the prompts came."""
    graph, fold, trim = (bool(config.get(key, False)) for key in ROLLOUT_KEYS)

    def decode(*, input_ids: torch.Tensor, attention_mask: torch.Tensor, **settings: Any) -> Decoded:
        cut = shared_left_padding(attention_mask) if trim else 0
        ids, mask = input_ids[:, cut:], attention_mask[:, cut:]
        with folded_decode_attention() if fold else nullcontext():
            if graph:
                decoded = generate(module, input_ids=ids, attention_mask=mask, **settings)
            else:
                sequences = module.generate(input_ids=ids, attention_mask=mask, **settings).sequences
                decoded = Decoded(sequences, graphed=False, fallback=None)
        return dataclasses.replace(decoded, sequences=with_columns(input_ids[:, :cut], decoded.sequences))

    return decode


def shared_left_padding(attention_mask: torch.Tensor) -> int:
    """How many leading columns are padding in every row (left-padded prompts); the last column always stays."""
    used = attention_mask.bool().any(dim=0)
    # one wait for the device per generate call: the width decides every step's shapes
    first = int(used.long().argmax()) if bool(used.any()) else used.numel() - 1
    return min(first, used.numel() - 1)


def with_columns(columns: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
    """SEQUENCES (prompts x answers rows, in generate's order: a prompt's answers adjacent) with the prompts'
    cut leading COLUMNS put back in front."""
    if not columns.size(1):
        return sequences
    answers = sequences.size(0) // columns.size(0)
    return torch.cat([columns.repeat_interleave(answers, dim=0).to(sequences.dtype), sequences], dim=1)


class _FoldedSdpa:
    """transformers' "sdpa" attention function, with one-token queries of grouped heads folded: the
    query's heads (batch, kv_heads x groups, 1, dim) viewed as (batch, kv_heads, groups, dim), so each KV
    head is read once by its group's rows and never copied. Head h belongs to KV head h // groups, the order
    repeat_kv expands in. Anything else runs transformers' own function."""

    def __init__(self, sdpa: Callable[..., tuple[torch.Tensor, None]]):
        self.sdpa = sdpa

    def __call__(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        rows, heads, length, size = query.shape
        kv_heads = key.shape[1]
        groups = getattr(module, "num_key_value_groups", 1)
        # a mask per head, or one not (batch, 1, query, key): not the layout the fold broadcasts
        mask_per_row = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1)
        if length != 1 or groups == 1 or kv_heads * groups != heads or is_causal or not mask_per_row:
            return self.sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
        mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[-2]]
        output = nn.functional.scaled_dot_product_attention(
            query.reshape(rows, kv_heads, groups, size),
            key.contiguous(),  # a cache is contiguous already: no copy (transformers' own call does the same)
            value.contiguous(),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
        )
        return output.reshape(rows, 1, heads, size), None


@contextmanager
def folded_decode_attention() -> Iterator[None]:
    """transformers' "sdpa" attention folds one-token queries (_FoldedSdpa) for as long as this lasts; its
    own function is put back after. Models look the function up by name at every forward, so this reaches
    HF generate and the static decoder alike, and the captured graph records the folded kernels."""
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if isinstance(sdpa, _FoldedSdpa):
        yield
        return
    AttentionInterface.register("sdpa", _FoldedSdpa(sdpa))
    try:
        yield
    finally:
        AttentionInterface.register("sdpa", sdpa)


def generate(
    module: nn.Module,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    generation_config: GenerationConfig,
    max_new_tokens: int,
    eos_token_id: int | list[int],
    pad_token_id: int,
    do_sample: bool | None = None,
    graphs: bool | None = None,
    **ignored: object,  # verl's output_scores, return_dict_in_generate, use_cache: what this always does
) -> Decoded:
    """What `module.generate(...)` returns as `.sequences` for verl's left-padded prompts, decoded with a
    static cache. `graphs` captures the decode step; by default where the prompts are on a CUDA device."""
    settings = {"max_new_tokens": max_new_tokens, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    if do_sample is not None:
        settings["do_sample"] = do_sample
    if graphs is None:
        graphs = input_ids.device.type == "cuda"
    with unwrapped(module) as model:
        config, _ = model._prepare_generation_config(generation_config, **settings)
        fallback = _unsupported(model, config, input_ids, graphs)
        if fallback is not None:
            log.warning("verlbox decode: %s; HF generate runs instead", fallback)
            sequences = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                return_dict_in_generate=True,
                use_cache=True,
            ).sequences
            return Decoded(sequences, graphed=False, fallback=fallback)
        rows = config.num_return_sequences or 1
        if rows > 1:
            input_ids = input_ids.repeat_interleave(rows, dim=0)
            attention_mask = attention_mask.repeat_interleave(rows, dim=0)
        return _static_decode(model, config, input_ids, attention_mask, graphs=graphs)


def _unsupported(model: nn.Module, config: GenerationConfig, input_ids: torch.Tensor, graphs: bool) -> str | None:
    if (config.num_beams or 1) > 1:
        return "beam search is not decoded here"
    if config.stop_strings or config.max_time:
        return "stop_strings and max_time are generate's own stopping rules"
    if not getattr(model, "_supports_static_cache", False):
        return f"{type(model).__name__} has no static KV cache in this transformers"
    device = input_ids.device
    if graphs and device.type != "cuda":
        return f"CUDA graphs need a CUDA device, the prompts are on {device.type}"
    if torch.is_autocast_enabled(device.type):
        return "the rollout runs under an autocast (a bf16 rollout dtype); the graph decode runs in the weights' dtype"
    return None


def _static_decode(
    model: nn.Module,
    config: GenerationConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    graphs: bool,
) -> Decoded:
    device = input_ids.device
    rows, prompt_width = input_ids.shape
    new_tokens = config.max_new_tokens
    width = prompt_width + new_tokens
    # as generate's _prepare_generated_length: the processors that read them (a forced EOS, min_new_tokens)
    # count from the prompt's width
    config.max_length = width
    if config.min_new_tokens:
        config.min_length = prompt_width + config.min_new_tokens
    model._prepare_special_tokens(config, True, device=device)
    processors = model._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=prompt_width,
        encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device=device,
        model_kwargs={"attention_mask": attention_mask},
    )
    eos = config._eos_token_tensor if config._eos_token_tensor is not None else input_ids.new_empty(0)
    pad = config._pad_token_tensor if config._pad_token_tensor is not None else eos[0]

    sequences = torch.full((rows, width), int(pad), dtype=input_ids.dtype, device=device)
    sequences[:, :prompt_width] = input_ids
    # the mask of the whole response: every generated column counts, the causal mask hides the future
    full_mask = torch.ones((rows, width), dtype=attention_mask.dtype, device=device)
    full_mask[:, :prompt_width] = attention_mask
    real_prompt_tokens = attention_mask.sum(-1, keepdim=True).to(torch.long)
    prompt_positions = (attention_mask.cumsum(-1) - 1).clamp(min=0).to(torch.long)

    cache = StaticCache(config=model.config, max_batch_size=rows, max_cache_len=width, device=device, dtype=model.dtype)
    logits = model(
        input_ids=input_ids,
        attention_mask=full_mask,
        position_ids=prompt_positions,
        past_key_values=cache,
        cache_position=torch.arange(prompt_width, device=device),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1, :]

    step = _DecodeStep(model, cache, full_mask, rows, device)
    unfinished = torch.ones(rows, dtype=torch.bool, device=device)
    graphed = False
    for generated in range(new_tokens):
        column = prompt_width + generated
        token = _choose(processors, sequences[:, :column], logits, config.do_sample)
        token = torch.where(unfinished, token, pad)
        sequences[:, column] = token
        unfinished &= ~torch.isin(token, eos)
        if generated + 1 == new_tokens:
            break
        if (generated + 1) % STOP_CHECK_EVERY == 0 and not bool(unfinished.any()):
            break
        step.feed(token, real_prompt_tokens + generated, column)
        if graphs and not step.captured and step.capture_failed is None:
            logits = step.run_and_capture()
            graphed = step.captured
        else:
            logits = step.run()
    if step.capture_failed is not None:
        log.warning("verlbox decode: the decode step could not be captured (%s); it ran eagerly", step.capture_failed)
    return Decoded(sequences, graphed=graphed, fallback=None)


def _choose(
    processors: LogitsProcessorList, sequences: torch.Tensor, logits: torch.Tensor, sample: bool
) -> torch.Tensor:
    # as HF's _sample: the processors see fp32 scores and every token so far
    scores = processors(sequences, logits.to(dtype=torch.float32, copy=True))
    if sample:
        return torch.multinomial(nn.functional.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    return torch.argmax(scores, dim=-1)


class _DecodeStep:
    """One token for every row, from static inputs the loop fills in place, so a captured graph
    replays it with the next token."""

    def __init__(self, model: nn.Module, cache: StaticCache, mask: torch.Tensor, rows: int, device: torch.device):
        self.model, self.cache, self.mask = model, cache, mask
        self.token = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_logits: torch.Tensor | None = None
        self.capture_failed: str | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def feed(self, token: torch.Tensor, position: torch.Tensor, cache_position: int) -> None:
        self.token.copy_(token.view(-1, 1))
        self.position.copy_(position)
        self.cache_position.fill_(cache_position)

    def _forward(self) -> torch.Tensor:
        return self.model(
            input_ids=self.token,
            attention_mask=self.mask,
            position_ids=self.position,
            past_key_values=self.cache,
            cache_position=self.cache_position,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]

    def run(self) -> torch.Tensor:
        if self.graph is None:
            return self._forward()
        self.graph.replay()
        return self.graph_logits

    def run_and_capture(self) -> torch.Tensor:
        """This step eagerly on a side stream (the warm-up; it writes the same cache entries each time),
        then captured: capturing runs nothing, so the cache holds exactly this step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                logits = self._forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a watchdog thread of NCCL's (a Ray worker's process group) that queries an event
            # meanwhile must not invalidate the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                graph_logits = self._forward()
        except Exception as exc:  # whatever the capture met, the decode goes on eagerly
            self.capture_failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return logits
        self.graph, self.graph_logits = graph, graph_logits
        return logits
