"""Decode attention without transformers' copy of the KV cache per query head (runtime/training/decode.py:
fold_attention) and the batch-width trim (trim_padding), in the image: its torch and transformers, on the CPU.

The guard: transformers 4.51's sdpa_attention_forward expands every KV head to its group's query heads
(`repeat_kv`) in every layer at every step, a copy of the whole cache `groups` times over. Each one-token
forward pass is run under a dispatch mode that adds up the bytes of every tensor an op returns in storage
none of its inputs had, and that sum is held against the cache's size: an upgrade that brings the copy
back fails here, for HF generate (whose DynamicCache itself concatenates the cache once a step) and for the
static decoder (whose cache is written in place)."""

from __future__ import annotations

import json

import pytest

from conftest import docker

IN_IMAGE = r"""
import functools, json
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from verlbox.runtime.training import decode

found = {}
LOWEST = torch.finfo(torch.float32).min
KV_HEADS, HEAD_SIZE = 2, 16

def attention_case(groups, rows=4, width=23, mask_width=31):
    # one token's query over a cache whose rows are left-padded by 0, 3, 6 and 9 columns; the mask as wide as a
    # static cache's, wider than the keys given (transformers cuts it to them)
    module = type("Attention", (), {"num_key_value_groups": groups})()
    generator = torch.Generator().manual_seed(groups)
    query = torch.randn(rows, KV_HEADS * groups, 1, HEAD_SIZE, generator=generator)
    key, value = (torch.randn(rows, KV_HEADS, width, HEAD_SIZE, generator=generator) for _ in range(2))
    mask = torch.zeros(rows, 1, 1, mask_width)
    for row in range(rows):
        mask[row, ..., : row * 3] = LOWEST
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=HEAD_SIZE**-0.5)
    with decode.folded_decode_attention():
        folded = ALL_ATTENTION_FUNCTIONS["sdpa"]
        got, _ = folded(module, query, key, value, mask, scaling=HEAD_SIZE**-0.5)
    return {"replaced": folded is not sdpa_attention_forward, "shape": list(got.shape) == list(expected.shape),
            "contiguous": got.is_contiguous(), "difference": float((got - expected).abs().max()),
            "largest": float(expected.abs().max())}

found["attention"] = {groups: attention_case(groups) for groups in (1, 2, 7)}
found["restored"] = ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward

class NewStorage(TorchDispatchMode):
    # bytes of every tensor an op returns in storage none of its inputs had: what the ops allocated
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        new = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
               if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given}
        self.bytes += sum(new.values())
        return out

def counted_steps(model):
    # the bytes each one-token forward pass allocates, appended while MODEL decodes
    steps, forward = [], type(model).forward.__get__(model)
    @functools.wraps(forward)
    def counted(*args, **kwargs):
        if kwargs.get("input_ids") is None or kwargs["input_ids"].shape[1] != 1:
            return forward(*args, **kwargs)
        with NewStorage() as mode:
            out = forward(*args, **kwargs)
        steps.append(mode.bytes)
        return out
    model.forward = counted
    return steps

def grouped_model(groups):
    heads = KV_HEADS * groups
    config = Qwen2Config(vocab_size=256, hidden_size=heads * HEAD_SIZE, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=KV_HEADS, max_position_embeddings=1024,
                         initializer_range=0.5, tie_word_embeddings=True, eos_token_id=1, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()

ROWS, PROMPT, NEW, SHARED = 4, 200, 8, 30
def prompts(vocab, shared=0):
    # left-padded by 0, 5, 17 and 40 columns, and SHARED more in every row
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (ROWS, shared + PROMPT), generator=generator)
    mask = torch.ones_like(ids)
    for row, pads in enumerate((0, 5, 17, 40)):
        mask[row, : shared + pads] = 0
    return ids.masked_fill(mask == 0, 0), mask

def decoded(model, ids, mask, **keys):
    with torch.no_grad():
        return decode.rollout_generate(model, keys)(input_ids=ids, attention_mask=mask,
            generation_config=GenerationConfig(do_sample=False, num_beams=1), max_new_tokens=NEW, eos_token_id=[],
            pad_token_id=0, output_scores=False, return_dict_in_generate=True, use_cache=True).sequences

for groups in (2, 7):
    model = grouped_model(groups)
    ids, mask = prompts(model.config.vocab_size)
    # K and V of every layer at the decode's full width, fp32
    cache = 2 * model.config.num_hidden_layers * ROWS * KV_HEADS * (PROMPT + NEW) * HEAD_SIZE * 4
    runs = {}
    for static in (False, True):
        for fold in (False, True):
            steps = counted_steps(model)
            sequences = decoded(model, ids, mask, graph_decode=static, fold_attention=fold)
            runs[("static" if static else "generate") + ("+fold" if fold else "")] = {
                "steps": len(steps), "most_per_cache": round(max(steps) / cache, 3),
                "tokens": sequences[:, PROMPT:].tolist()}
    base = runs["generate"]["tokens"]
    found[f"groups {groups}"] = {
        name: {"steps": run["steps"], "most_per_cache": run["most_per_cache"], "same_tokens": run["tokens"] == base}
        for name, run in runs.items()}
    found[f"groups {groups}"]["distinct"] = len({token for row in base for token in row})

# the batch-width trim: SHARED padding columns in every row cut before the decode, put back after
model = grouped_model(7)
model.forward = type(model).forward.__get__(model)
ids, mask = prompts(model.config.vocab_size, shared=SHARED)
widths = []
generate = model.generate
def noted(*args, **kwargs):
    widths.append(kwargs["input_ids"].shape[1])
    return generate(*args, **kwargs)
model.generate = noted
full = decoded(model, ids, mask)
trimmed = {static: decoded(model, ids, mask, graph_decode=static, fold_attention=True, trim_padding=True)
           for static in (False, True)}
found["trim"] = {"decoded_widths": widths, "same": {str(static): bool(torch.equal(full, got))
                 for static, got in trimmed.items()}, "width": full.shape[1],
                 "cut_columns_kept": bool(torch.equal(trimmed[True][:, :SHARED], ids[:, :SHARED]))}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def measured(image: str) -> dict:
    result = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", IN_IMAGE)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("groups", ["1", "2", "7"])
def test_a_folded_one_token_query_gives_transformers_attention(measured: dict, groups: str) -> None:
    case = measured["attention"][groups]
    assert case["replaced"] and case["shape"] and case["contiguous"], case
    # the same sums in another order: fp32 rounding (a few units in the last place), where a wrong head or row
    # would differ by the values' own size
    assert case["difference"] <= 1e-5 * max(case["largest"], 1.0), case
    assert measured["restored"], "transformers' own sdpa function was not put back"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("groups", [2, 7])
def test_no_decode_step_copies_the_cache(measured: dict, groups: int) -> None:
    runs = measured[f"groups {groups}"]
    assert all(run["steps"] == 7 for name, run in runs.items() if name != "distinct"), runs
    # the measure sees the copy: without the fold a step allocates the cache `groups` times over, at least
    assert runs["generate"]["most_per_cache"] >= groups and runs["static"]["most_per_cache"] >= groups, runs
    # folded: generate's DynamicCache concatenates the cache once a step (its own, not the fold's), the static
    # cache is written in place; what else a step allocates is the activations of a few rows. One more copy of
    # the cache, even at 2 groups, crosses either line
    assert runs["generate+fold"]["most_per_cache"] < 2, runs
    assert runs["static+fold"]["most_per_cache"] < 1, runs


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("groups", [2, 7])
def test_folded_decoders_give_generates_greedy_tokens(measured: dict, groups: int) -> None:
    runs = measured[f"groups {groups}"]
    assert runs["distinct"] > 8, runs  # responses that vary: two decoders repeating one token would agree
    assert all(runs[name]["same_tokens"] for name in ("generate+fold", "static", "static+fold")), runs


@pytest.mark.docker
@pytest.mark.slow
def test_the_trim_decodes_over_the_batchs_own_width_and_gives_back_the_same_sequences(measured: dict) -> None:
    trim = measured["trim"]
    # generate ran twice: on the full width, then trimmed (the static decoder calls no generate)
    assert trim["decoded_widths"] == [30 + 200, 200], trim
    assert trim["same"] == {"False": True, "True": True} and trim["cut_columns_kept"], trim
