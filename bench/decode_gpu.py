"""HF `generate` as verl 0.4.1 calls it against verlbox's decode parts (runtime/training/decode.py), each on and
off, in one process on a GPU.

The model is a random one of Qwen2.5-0.5B-Instruct's exact shape (checks/fixtures.py), fp32 with sdpa and
no autocast, as verlbox's fp32 profiles run the rollout. The rollout batches are the profiles' per GPU: PPO's
64 prompts, and GRPO's 32 prompts x 4 answers (128 rows, each prompt repeated, as verl's HF rollout asks
for num_return_sequences=4). Each is decoded for 256 new tokens by sampling (temperature 1, top_k 0, top_p 1:
verl's rollout settings) and greedily.

Prompts are left-padded to the data's longest prompt, as verl pads every prompt to data.max_prompt_length
and train lowers that to the data's longest. Their
lengths in tokens are GSM8K's: a prompt's words (question plus verl's 12-word instruction) times
TOKENS_PER_WORD plus TEMPLATE_TOKENS, with question lengths drawn from the real distribution
(fixtures.GSM8K_QUESTION_WORDS, --seed) or counted in --data DIR's train.parquet (a folder `verlbox
prepare-data` made, e.g. from openai/grade-school-math's jsonl). Token ids are random: the model is too.

The decodes (DECODES; --decode picks some), each through the rollout's own entry (decode.rollout_generate)
with its keys: `hf` is generate as stock verl 0.4.1 calls it; `fold` folds each KV group's query heads into
the query axis for one-token steps (fold_attention: no copy of the cache per query head); `width` decodes
over the batch's own longest prompt (trim_padding); `graph` is the static KV cache with the captured step
(graph_decode). Each configuration runs every decode in turn, the order rotated each repeat (A B C, B C A,
...), and reports the median of --repeats: seconds, generated tokens per second (up to each row's first
EOS), peak memory reserved (torch.cuda.max_memory_reserved after emptying the cache and a reset: the 2 GB of
weights included), the speed-up over `hf` and, for greedy, whether each gave `hf`'s tokens. The static
decode's own account (graphed, or why it fell back to HF) is reported beside its figures. The header says
which SDPA kernels of this device accept grouped KV heads (enable_gqa) with a mask, for the prompt pass
and training, which keep transformers' copy.

  python bench/decode_gpu.py --json OUT/decode.json
  python bench/decode_gpu.py --data DIR --gpu-memory-gib 24 --repeats 2 --json OUT/decode.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verlbox.runtime.checks.fixtures import make_model, sample_question_words
from verlbox.runtime.training.data import INSTRUCTION

if TYPE_CHECKING:  # torch is imported in main: --help and an import check run without it
    import torch

# Qwen2.5's tokenizer gives GSM8K's text about 1.4 tokens per whitespace word (it splits numbers into digits)
TOKENS_PER_WORD = 1.4
# Qwen2.5-Instruct's chat template around the user's message: its default system message with its markers
# (about 20 tokens) and the user and assistant markers (8); the fixtures' word tokenizer has no such template
TEMPLATE_TOKENS = 28
INSTRUCTION_WORDS = len(INSTRUCTION.split())
# rows standing for GSM8K's train split when the prompts are synthetic (its size)
GSM8K_TRAIN_ROWS = 7473
# rollout batch -> (prompts, answers per prompt), per GPU as the profiles ship them (p40.yaml, grpo.yaml)
BATCHES = {"ppo": (64, 1), "grpo": (32, 4)}
MODES = ("sample", "greedy")
NEW_TOKENS = 256
# prompt ids are drawn from here up to the vocabulary's end: no pad, EOS or other special token
FIRST_PLAIN_ID = 10
# an untimed run of each decode per configuration, this long: CUDA's and cuBLAS's first-use costs
WARMUP_TOKENS = 8
# name -> the rollout keys it sets (runtime/training/decode.py, ROLLOUT_KEYS); "hf" first: the baseline
DECODES: dict[str, dict[str, bool]] = {
    "hf": {},
    "hf+fold": {"fold_attention": True},
    "hf+fold+width": {"fold_attention": True, "trim_padding": True},
    "graph": {"graph_decode": True},
    "graph+fold": {"graph_decode": True, "fold_attention": True},
    "graph+fold+width": {"graph_decode": True, "fold_attention": True, "trim_padding": True},
}


@dataclass(frozen=True)
class Prompts:
    """Prompt lengths in tokens standing for a train split, and where they came from."""

    lengths: list[int]
    said: str

    @property
    def longest(self) -> int:
        return max(self.lengths)


@dataclass
class Call:
    """One timed decode."""

    seconds: float
    generated: int  # tokens up to and including each row's first EOS, all rows
    reserved_gib: float
    graphed: bool | None = None  # the static decode's replays; None for HF
    fallback: str | None = None


def prompt_tokens(content_words: int) -> int:
    return round(content_words * TOKENS_PER_WORD) + TEMPLATE_TOKENS


def synthetic_prompts(seed: int) -> Prompts:
    words = sample_question_words("train", GSM8K_TRAIN_ROWS, random.Random(seed))
    said = f"synthetic GSM8K-length prompts (train question lengths, {len(words)} drawn, seed {seed})"
    return Prompts([prompt_tokens(w + INSTRUCTION_WORDS) for w in words], said)


def folder_prompts(data: Path) -> Prompts:
    """Every train prompt's words (all its messages: the question and verl's instruction) from DATA."""
    import pyarrow.parquet as pq

    path = data / "train.parquet"
    if not path.is_file():
        raise SystemExit(f"--data {data}: no train.parquet (make the folder with `verlbox prepare-data`)")
    messages = pq.read_table(path, columns=["prompt"]).column("prompt").to_pylist()
    words = [sum(len(message["content"].split()) for message in prompt) for prompt in messages]
    return Prompts([prompt_tokens(w) for w in words], f"GSM8K parquet folder {data.resolve()} ({len(words)} rows)")


def draw(prompts: Prompts, count: int, rng: random.Random) -> list[int]:
    """COUNT prompt lengths from the pool, each row once where the pool is large enough."""
    if count <= len(prompts.lengths):
        return rng.sample(prompts.lengths, count)
    return rng.choices(prompts.lengths, k=count)


def describe_prompts(prompts: Prompts) -> str:
    return (
        f"{prompts.said}; tokens = words x {TOKENS_PER_WORD} + {TEMPLATE_TOKENS} (template): "
        f"mean {statistics.mean(prompts.lengths):.0f}, longest {prompts.longest}"
    )


def left_padded(
    torch_: Any, lengths: list[int], width: int, vocab: int, pad: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of LENGTHS, left-padded with PAD to WIDTH as verl's dataset pads them, on the GPU."""
    generator = torch_.Generator().manual_seed(seed)
    ids = torch_.randint(FIRST_PLAIN_ID, vocab, (len(lengths), width), generator=generator)
    mask = torch_.zeros((len(lengths), width), dtype=torch_.long)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    ids[mask == 0] = pad
    return ids.cuda(), mask.cuda()


def generated_tokens(torch_: Any, sequences: torch.Tensor, prompt_width: int, eos: list[int]) -> int:
    """Tokens each row generated up to and including its first EOS (what follows is padding), summed."""
    new = sequences[:, prompt_width:]
    ended = torch_.isin(new, torch_.tensor(eos, device=new.device))
    # a token counts while no EOS came before it
    before = ended.long().cumsum(-1) - ended.long()
    return int((before == 0).sum())


def same_tokens(
    torch_: Any, first: torch.Tensor, second: torch.Tensor, prompt_width: int, pad: int
) -> dict[str, object]:
    """Whether two decodes' rows are equal token for token (the shorter padded with PAD: HF stops at the
    last row's EOS, the static decode may run on a few steps), and where they first differ if not."""
    width = max(first.shape[1], second.shape[1])
    padded = [torch_.nn.functional.pad(s, (0, width - s.shape[1]), value=pad) for s in (first, second)]
    differs = (padded[0] != padded[1])[:, prompt_width:]
    rows_equal = int((~differs.any(-1)).sum())
    columns = differs.any(0).nonzero()
    return {
        "equal": rows_equal == first.shape[0],
        "rows_equal": f"{rows_equal}/{first.shape[0]}",
        "first_difference_at_token": int(columns[0]) if len(columns) else None,
    }


# a decode of N new tokens: (sequences, graphed, why it fell back)
Decode = Callable[[int], tuple["torch.Tensor", "bool | None", "str | None"]]


def timed(
    torch_: Any, decode: Callable[[], tuple[torch.Tensor, bool | None, str | None]], count: Callable[..., int]
) -> tuple[Call, torch.Tensor]:
    """DECODE from an emptied allocator with its peak reset: its seconds, tokens, peak reserved and output."""
    torch_.cuda.synchronize()
    torch_.cuda.empty_cache()
    torch_.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    sequences, graphed, fallback = decode()
    torch_.cuda.synchronize()
    seconds = time.perf_counter() - started
    reserved = torch_.cuda.max_memory_reserved() / 2**30
    return Call(seconds, count(sequences), round(reserved, 2), graphed, fallback), sequences


def decoders(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, config: Any, eos: list[int], pad: int, names: list[str]
) -> dict[str, Decode]:
    """The decodes NAMES of one batch, each a call giving (sequences, graphed, fallback)."""
    from verlbox.runtime.training.decode import rollout_generate

    def decoder(keys: dict[str, bool]) -> Decode:
        def run(new_tokens: int) -> tuple[torch.Tensor, bool | None, str | None]:
            # the keywords verl 0.4.1's HF rollout passes
            result = rollout_generate(model, keys)(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                max_new_tokens=new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
                output_scores=False,
                use_cache=True,
                return_dict_in_generate=True,
            )
            return result.sequences, result.graphed if keys.get("graph_decode") else None, result.fallback

        return run

    return {name: decoder(DECODES[name]) for name in names}


def summarize(calls: list[Call]) -> dict[str, Any]:
    seconds = statistics.median(call.seconds for call in calls)
    rates = [call.generated / call.seconds for call in calls]
    return {
        "seconds": round(seconds, 3),
        "tokens_per_s": round(statistics.median(rates)),
        "generated": calls[-1].generated,
        "reserved_gib": max(call.reserved_gib for call in calls),
        "graphed": calls[-1].graphed,
        "fallback": calls[-1].fallback,
        "all_s": [round(call.seconds, 3) for call in calls],
    }


def run_config(
    torch_: Any, model: Any, batch: str, mode: str, prompts: Prompts, args: argparse.Namespace
) -> dict[str, object]:
    from transformers import GenerationConfig

    count, answers = BATCHES[batch]
    lengths = draw(prompts, count, random.Random(f"{args.seed}-{batch}"))
    width = prompts.longest
    vocab = model.config.vocab_size
    eos_ids, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    eos = eos_ids if isinstance(eos_ids, list) else [eos_ids]
    ids, mask = left_padded(torch_, lengths, width, vocab, pad, args.seed)
    ids, mask = ids.repeat_interleave(answers, dim=0), mask.repeat_interleave(answers, dim=0)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    config = GenerationConfig(num_beams=1, **(sampling if mode == "sample" else {"do_sample": False}))
    names = args.decode or list(DECODES)
    decode = decoders(model, ids, mask, config, eos, pad, names)

    def count_generated(sequences: torch.Tensor) -> int:
        return generated_tokens(torch_, sequences, width, eos)

    for name in names:
        decode[name](WARMUP_TOKENS)
    calls: dict[str, list[Call]] = {name: [] for name in names}
    outputs: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats):
        # the order rotated each repeat: no decode always runs on a GPU another just warmed (or heated)
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            torch_.manual_seed(args.seed + repeat)
            call, outputs[name] = timed(torch_, lambda name=name: decode[name](args.new_tokens), count_generated)
            calls[name].append(call)
    summaries = {name: summarize(calls[name]) for name in names}
    result: dict[str, object] = {
        "batch": batch,
        "mode": mode,
        "rows": ids.shape[0],
        "prompts_x_answers": f"{count}x{answers}",
        "prompt_width": width,
        "batch_width": max(lengths),
        "mean_prompt_tokens": round(statistics.mean(lengths), 1),
        "decodes": summaries,
    }
    if "hf" in summaries:
        result["speedup"] = {name: round(summaries["hf"]["seconds"] / s["seconds"], 2) for name, s in summaries.items()}
        if mode == "greedy":
            result["same_tokens"] = {
                name: same_tokens(torch_, outputs["hf"], outputs[name], width, pad) for name in names if name != "hf"
            }
    return result


def show(result: dict[str, Any]) -> list[str]:
    lines = [
        f"{result['batch']} {result['mode']}: {result['rows']} rows ({result['prompts_x_answers']}), width "
        f"{result['prompt_width']} (the batch's own {result['batch_width']})"
    ]
    for name, decode in result["decodes"].items():
        line = f"  {name}: {decode['seconds']:.2f} s {decode['tokens_per_s']} tok/s {decode['reserved_gib']} GiB"
        if decode["graphed"] is not None:
            line += " graphed" if decode["graphed"] else f" not graphed ({decode['fallback'] or 'eager'})"
        if name in result.get("speedup", {}) and name != "hf":
            line += f" | x{result['speedup'][name]}"
        same = result.get("same_tokens", {}).get(name)
        if same and same["equal"]:
            line += " | greedy equal"
        elif same:
            first = same["first_difference_at_token"]
            line += f" | greedy differs: {same['rows_equal']} rows equal, first at token {first}"
        lines.append(line)
    return lines


def gqa_kernels(torch_: Any) -> dict[str, str]:
    """Which of this device's SDPA kernels take grouped KV heads (enable_gqa=True) with a float mask, fp32, as
    a prompt pass or a training forward would call them, or why not. torch's math kernel accepts them by
    repeating the heads itself (the same copy), so only a fused kernel's yes would avoid it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    query = torch_.randn(2, 14, 32, 64, device="cuda")
    key, value = (torch_.randn(2, 2, 32, 64, device="cuda") for _ in range(2))
    mask = torch_.zeros(2, 1, 32, 32, device="cuda")
    said = {}
    for kernel in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([kernel]):
                torch_.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
            said[kernel.name] = "accepted"
        except RuntimeError as exc:
            said[kernel.name] = f"refused: {str(exc).splitlines()[0][:160]}"
    return said


def load_model(torch_: Any, workdir: Path) -> Any:
    from transformers import Qwen2ForCausalLM

    folder = workdir / "qwen2.5-0.5b-random"  # the folder ppo_gpu.py makes: one model for both
    if not (folder / "config.json").is_file():
        make_model(folder, "qwen2.5-0.5b")
    model = Qwen2ForCausalLM.from_pretrained(folder, torch_dtype=torch_.float32, attn_implementation="sdpa")
    return model.cuda().eval()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verlbox-bench"), help="where the model is made")
    parser.add_argument("--data", type=Path, help="a prepared GSM8K folder: prompt lengths from its train.parquet")
    parser.add_argument("--seed", type=int, default=0, help="the draw of prompt lengths, token ids and samples")
    parser.add_argument("--batch", action="append", choices=sorted(BATCHES), help="default: both")
    parser.add_argument("--mode", action="append", choices=MODES, help="default: both")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each decode per configuration")
    parser.add_argument("--decode", action="append", choices=list(DECODES), help="default: all, in this order")
    parser.add_argument("--gpu-memory-gib", help="cap this process's CUDA allocator, e.g. 24 (a P40)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    prompts = folder_prompts(args.data) if args.data else synthetic_prompts(args.seed)
    import torch as torch_
    import transformers

    from verlbox.runtime.training import memory_cap

    if args.gpu_memory_gib:
        memory_cap.install(memory_cap.parse_gib(args.gpu_memory_gib, "--gpu-memory-gib"))
    model = load_model(torch_, args.workdir)
    header = {
        "prompts": describe_prompts(prompts),
        "device": torch_.cuda.get_device_name(),
        "memory_cap_gib": args.gpu_memory_gib,
        "torch": torch_.__version__,
        "transformers": transformers.__version__,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "gqa_kernels_fp32_masked": gqa_kernels(torch_),
    }
    print(json.dumps(header), flush=True)
    results = []
    with torch_.no_grad():
        for batch in args.batch or list(BATCHES):
            for mode in args.mode or list(MODES):
                results.append(run_config(torch_, model, batch, mode, prompts, args))
                print("\n".join(show(results[-1])), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**header, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
