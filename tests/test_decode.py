"""verlbox's static-KV-cache decoder (runtime/training/decode.py) and the rollout's positions, in the image:
its torch, transformers and patched verl, on the CPU (the captured graph itself is the GPU tier's check)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import docker

IN_IMAGE = r"""
import functools, json, tempfile
import torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import GenerationConfig
from verlbox.runtime.checks import rollout
from verlbox.runtime.checks.fixtures import make_model
from verlbox.runtime.training import decode

folder = tempfile.mkdtemp()
model = rollout.varied_model(make_model(__import__("pathlib").Path(folder) / "tiny", "tiny"), "cpu")
ids, mask, positions = rollout.left_padded_prompts(model.config.vocab_size, "cpu")
P, T = rollout.PROMPT, rollout.RESPONSE
found = {}

def hf(**settings):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=T, pad_token_id=0, **settings)

def ours(config, module=model, **settings):
    with torch.no_grad():
        static = decode.rollout_generate(module, {"graph_decode": True})
        return static(input_ids=ids, attention_mask=mask, generation_config=config,
            max_new_tokens=T, pad_token_id=0, output_scores=False, return_dict_in_generate=True, use_cache=True,
            **settings)

def same(expected, got):
    width = max(expected.size(1), got.size(1))
    pad = lambda t: torch.nn.functional.pad(t, (0, width - t.size(1)), value=0)
    return bool(torch.equal(pad(expected), pad(got)))

greedy = GenerationConfig(do_sample=False, num_beams=1)
expected = hf(do_sample=False, eos_token_id=1)
got = ours(greedy, eos_token_id=1)
found["greedy"] = {"same": same(expected, got.sequences), "graphed": got.graphed, "fallback": got.fallback,
                   "distinct": len(set(expected[:, P:].flatten().tolist()))}

# two EOS ids, one of them a token greedy decoding emits early: rows end at different steps
eos = int(expected[0, P + 2])
expected = hf(do_sample=False, eos_token_id=[eos, 1])
got = ours(greedy, eos_token_id=[eos, 1])
ended = (expected[:, P:] == eos).any(dim=1)
found["eos"] = {"same": same(expected, got.sequences), "rows_ended": int(ended.sum()),
                "pad_after_eos": bool((got.sequences[0, P + 3:] == 0).all())}

# sampling with top_k=1 is greedy, for every answer of every prompt
got = ours(GenerationConfig(do_sample=True, top_k=1, temperature=0.7, num_return_sequences=2), eos_token_id=1)
expected = hf(do_sample=False, eos_token_id=1)
found["top_k_1"] = {"rows": got.sequences.size(0),
                    "same": same(expected, got.sequences[0::2]) and same(expected, got.sequences[1::2])}

# sampling with top_k=5: every sampled token is among the 5 likeliest where it was drawn
torch.manual_seed(3)
got = ours(GenerationConfig(do_sample=True, top_k=5, top_p=1.0, temperature=1.3), eos_token_id=[])
sequence = got.sequences
full_mask = torch.cat([mask, torch.ones_like(sequence[:, P:])], dim=1)
full_positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
with torch.no_grad():
    logits = model(input_ids=sequence, attention_mask=full_mask, position_ids=full_positions).logits[:, P - 1 : -1]
top5 = logits.topk(5, dim=-1).indices
drawn = sequence[:, P:]
found["top_k_5"] = {"in_top": bool((top5 == drawn.unsqueeze(-1)).any(-1).all()),
                    "not_all_argmax": bool((drawn != top5[..., 0]).any()), "width": sequence.size(1)}

# under FSDP (gloo, one rank): whole weights held, the wrappers swapped out for the decode and put back
dist.init_process_group("gloo", init_method=f"file://{folder}/process-group", rank=0, world_size=1)
expected = hf(do_sample=False, eos_token_id=1)  # before wrapping: a wrapped layer run alone would make itself a root
layer = type(model.model.layers[0])
wrapped = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer}),
               device_id=torch.device("cpu"))
with FSDP.summon_full_params(wrapped, writeback=False, recurse=True):
    got = ours(greedy, module=wrapped, eos_token_id=1)
found["fsdp"] = {"same": same(expected, got.sequences),
                 "wrapped_after": type(wrapped.module.model.layers[0]).__name__}

# a bf16 autocast (a bf16 rollout dtype) is generate's, said in one line
with torch.autocast("cpu", dtype=torch.bfloat16):
    got = ours(greedy, eos_token_id=1)
found["autocast"] = {"fallback": got.fallback, "graphed": got.graphed, "rows": got.sequences.size(0)}

# verl's patched HFRollout with each decoder, and generate given verl's position_ids (stock verl 0.4.1)
found["rollout"] = rollout.check_rollout_positions(__import__("pathlib").Path(folder) / "tiny")
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def decoded(image: str) -> dict:
    result = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", IN_IMAGE)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.docker
@pytest.mark.slow
def test_greedy_static_decode_gives_generates_tokens(decoded: dict) -> None:
    greedy = decoded["greedy"]
    # the wide-drawn weights make responses that vary (a decoder that repeats one token would not pass)
    assert greedy["same"] and greedy["distinct"] > 10, greedy
    assert greedy["graphed"] is False and greedy["fallback"] is None  # the CPU steps eagerly, with no fallback


@pytest.mark.docker
@pytest.mark.slow
def test_rows_end_at_their_own_eos_and_are_padded_after(decoded: dict) -> None:
    eos = decoded["eos"]
    assert eos["same"] and eos["pad_after_eos"] and eos["rows_ended"] >= 1, eos


@pytest.mark.docker
@pytest.mark.slow
def test_sampling_runs_generates_processors_and_repeats_answers_per_prompt(decoded: dict) -> None:
    assert decoded["top_k_1"] == {"rows": 12, "same": True}
    top_k_5 = decoded["top_k_5"]
    assert top_k_5["in_top"] and top_k_5["not_all_argmax"], top_k_5
    # no EOS: the decode ran to max_new_tokens
    assert top_k_5["width"] == 12 + 24


@pytest.mark.docker
@pytest.mark.slow
def test_fsdp_wrapped_model_decodes_on_whole_weights_and_keeps_its_wrappers(decoded: dict) -> None:
    assert decoded["fsdp"] == {"same": True, "wrapped_after": "FullyShardedDataParallel"}


@pytest.mark.docker
@pytest.mark.slow
def test_an_autocast_rollout_falls_back_to_generate_saying_why(decoded: dict) -> None:
    autocast = decoded["autocast"]
    assert autocast["graphed"] is False and autocast["rows"] == 6
    assert "autocast" in (autocast["fallback"] or ""), autocast


@pytest.mark.docker
@pytest.mark.slow
def test_verls_rollout_decodes_each_token_at_the_position_it_is_scored_at(decoded: dict) -> None:
    """Stock verl 0.4.1 handed generate the prompts' position_ids, which transformers 4.51 never advances:
    most tokens were not what verl's own log-prob pass would pick. The patched rollout: all of them."""
    said = decoded["rollout"]
    assert said.startswith("all ") and "the same tensors" in said, said
    assert "the static decoder, folded, over the batch's width" in said, said
    stock = re.search(r"as stock verl calls it: (\d+) of (\d+)", said)
    assert stock, said
    agreed, real = map(int, stock.groups())
    assert agreed < real / 2, said
