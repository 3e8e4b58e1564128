"""The rollout's checks: verl's patched HF rollout decodes each token at the position its log-prob pass
scores it at, and verlbox's static decoder gives HF generate's tokens (stepped eagerly on the CPU,
replayed from a captured CUDA graph on a GPU). Greedy decoding makes both exact: one right answer a token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROWS, PROMPT, RESPONSE = 6, 12, 24
LEFT_PADDING = (5, 0, 2, 7, 1, 3)
EOS, PAD = 1, 0
# verl's rollout as stock verl decodes (generate), and with verlbox's rollout keys (runtime/training/decode.py)
ROLLOUT_DECODERS: dict[str, dict[str, bool]] = {
    "generate": {},
    "generate with groups folded, over the batch's width": {"fold_attention": True, "trim_padding": True},
    "the static decoder, folded, over the batch's width": {
        "graph_decode": True,
        "fold_attention": True,
        "trim_padding": True,
    },
}
# left-padding columns added to every row for the rollout check: what trim_padding cuts and puts back
SHARED_PADDING = 4


def varied_model(model_dir: Path, device: str) -> Any:
    """The fixture model's shape with weights drawn wide: at its own small scale a random model repeats one
    token, and any two decoders would agree on that."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, attn_implementation="sdpa")
    config.initializer_range = 0.5
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).to(device).eval()


def left_padded_prompts(vocab_size: int, device: str) -> tuple[Any, Any, Any]:
    """(input_ids, attention_mask, position_ids) as verl lays prompts out: padding on the left, positions
    counted from the first real token."""
    import torch

    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(EOS + 2, vocab_size, (ROWS, PROMPT), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, pads in enumerate(LEFT_PADDING):
        attention_mask[row, :pads] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


def _share_as_scored(
    model: Any, input_ids: Any, attention_mask: Any, position_ids: Any, prompt_width: int = PROMPT
) -> tuple[int, int]:
    """How many response tokens are the ones greedy decoding would pick from the logits verl's log-prob
    pass computes (the whole sequence, positions advancing), of how many real response tokens."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    chosen = logits[:, prompt_width - 1 : -1].argmax(-1)
    real = attention_mask[:, prompt_width:].bool()
    return int((chosen == input_ids[:, prompt_width:])[real].sum()), int(real.sum())


def _widened(prompts: tuple[Any, Any, Any], columns: int) -> tuple[Any, Any, Any]:
    """PROMPTS with COLUMNS more padding on the left of every row, positions counted as verl counts them."""
    import torch

    input_ids, attention_mask, _ = prompts
    input_ids = torch.nn.functional.pad(input_ids, (columns, 0), value=PAD)
    attention_mask = torch.nn.functional.pad(attention_mask, (columns, 0), value=0)
    return input_ids, attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0)


def _with_positions(attention_mask: Any, position_ids: Any, response_width: int) -> tuple[Any, Any]:
    import torch

    from_last = torch.arange(1, response_width + 1, device=position_ids.device)
    return (
        torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1]).expand(-1, response_width)], dim=1),
        torch.cat([position_ids, position_ids[:, -1:] + from_last], dim=1),
    )


@contextmanager
def _cpu_cache_emptying() -> Iterator[None]:
    """verl's rollout empties the accelerator's cache after generating; on the CPU there is none to empty."""
    import torch

    had = hasattr(torch.cpu, "empty_cache")
    if not had:
        torch.cpu.empty_cache = lambda: None
    try:
        yield
    finally:
        if not had:
            del torch.cpu.empty_cache


def verl_rollout(model: Any, prompts: tuple[Any, Any, Any], keys: dict[str, bool]) -> Any:
    """Greedy responses from the installed (patched) verl's HFRollout, with the rollout KEYS set."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.workers.rollout.hf_rollout import HFRollout

    greedy = {"do_sample": False, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
    config = OmegaConf.create(
        {
            **greedy,
            "micro_batch_size": ROWS,
            "response_length": RESPONSE,
            "n": 1,
            "dtype": "float32",
            **keys,
            "val_kwargs": greedy,
        }
    )
    input_ids, attention_mask, position_ids = prompts
    batch = DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        meta_info={"eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False},
    )
    with _cpu_cache_emptying():
        return HFRollout(model, config).generate_sequences(batch).batch


def check_rollout_positions(model_dir: Path) -> str:
    """verl's patched rollout with each of ROLLOUT_DECODERS: every greedy token is the one the log-prob pass
    would pick, and verl gets the same tensors from each (every row padded on the left by SHARED_PADDING
    columns more, which the batch-width trim cuts). HF generate given verl's position_ids (what stock verl
    0.4.1 calls) is measured beside it."""
    import torch

    model = varied_model(model_dir, "cpu")
    prompts = left_padded_prompts(model.config.vocab_size, "cpu")
    input_ids, attention_mask, position_ids = prompts
    widened = _widened(prompts, SHARED_PADDING)
    outputs = {name: verl_rollout(model, widened, keys) for name, keys in ROLLOUT_DECODERS.items()}
    for name, batch in outputs.items():
        agreed, real = _share_as_scored(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["prompts"].size(1)
        )
        if agreed != real:
            raise AssertionError(f"verl's rollout ({name}): {agreed} of {real} tokens as its log-prob pass scores")
        # a TensorDict iterates over its rows: its keys are asked for by name
        expected = outputs["generate"]
        differing = [key for key in sorted(expected.keys()) if not torch.equal(expected[key], batch[key])]
        if differing:
            raise AssertionError(f"verl's rollout ({name}): {', '.join(differing)} differ from generate's")
    with torch.no_grad():
        stock = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            do_sample=False,
            max_new_tokens=RESPONSE,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
    stock_agreed, stock_real = _share_as_scored(
        model, stock, *_with_positions(attention_mask, position_ids, stock.size(1) - PROMPT)
    )
    return (
        f"all {real} greedy tokens are what verl's log-prob pass picks, with {', with '.join(ROLLOUT_DECODERS)} "
        f"(the same tensors); generate given position_ids, as stock verl calls it: {stock_agreed} of {stock_real}"
    )


def check_graph_decode(model_dir: Path) -> str:
    """On the GPU: the captured decode's greedy tokens are HF generate's, token for token."""
    import torch
    from transformers import GenerationConfig

    from verlbox.runtime.training import decode

    model = varied_model(model_dir, "cuda")
    input_ids, attention_mask, _ = left_padded_prompts(model.config.vocab_size, "cuda")
    with torch.no_grad():
        expected = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=RESPONSE,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
    # the graph captures the folded attention, as the rollout runs it with fold_attention
    with torch.no_grad(), decode.folded_decode_attention():
        decoded = decode.generate(
            model,
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=GenerationConfig(do_sample=False, num_beams=1),
            max_new_tokens=RESPONSE,
            eos_token_id=EOS,
            pad_token_id=PAD,
            graphs=True,
        )
    if not decoded.graphed:
        raise AssertionError(f"the decode step was not captured: {decoded.fallback or 'it ran eagerly'}")
    got = decoded.sequences[:, : expected.size(1)]
    if not torch.equal(got, expected):
        differing = int((got != expected).any(dim=1).sum())
        raise AssertionError(f"{differing} of {ROWS} greedy rows differ from HF generate's")
    return (
        f"{ROWS} left-padded rows, {RESPONSE} greedy tokens each from one captured decode step (query groups "
        "folded): HF generate's"
    )
