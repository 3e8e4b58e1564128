"""HF `generate` against verlbox's static-KV-cache decode (runtime/training/decode.py), in one process on a GPU.

The model is a random one of Qwen2.5-0.5B-Instruct's exact shape (checks/fixtures.py), fp32 with sdpa and
no autocast, as verlbox's fp32 profiles run the rollout. The rollout batches are the profiles' per GPU: PPO's
64 prompts, and GRPO's 32 prompts x 4 answers (128 rows, each prompt repeated, as verl's HF rollout asks
for num_return_sequences=4). Each is decoded for 256 new tokens by sampling (temperature 1, top_k 0, top_p 1:
verl's rollout settings) and greedily.

Prompts are left-padded to the data's longest prompt, as verl pads every prompt to data.max_prompt_length
and train lowers that to the data's longest (--width batch pads to the batch's longest instead). Their
lengths in tokens are GSM8K's: a prompt's words (question plus verl's 12-word instruction) times
TOKENS_PER_WORD plus TEMPLATE_TOKENS, with question lengths drawn from the real distribution
(fixtures.GSM8K_QUESTION_WORDS, --seed) or counted in --data DIR's train.parquet (a folder `verlbox
prepare-data` made, e.g. from openai/grade-school-math's jsonl). Token ids are random: the model is too.

Each configuration runs both decodes in turn, alternating which goes first (A B, B A, A B, ...), and reports
the median of --repeats: seconds, generated tokens per second (up to each row's first EOS), peak memory
reserved (torch.cuda.max_memory_reserved after emptying the cache and a reset: the 2 GB of weights
included) and, for greedy, whether the two decodes gave the same tokens. The static decode's own account
(graphed, or why it fell back to HF) is reported beside its figures.

  python bench/decode_gpu.py --json OUT/decode.json
  python bench/decode_gpu.py --data DIR --gpu-memory-gib 24 --repeats 4 --json OUT/decode.json
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
DECODES = ("hf", "static")


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
    model: Any, ids: torch.Tensor, mask: torch.Tensor, config: Any, eos: list[int], pad: int
) -> dict[str, Decode]:
    """The two decodes of one batch, each a call giving (sequences, graphed, fallback)."""
    from verlbox.runtime.training.decode import generate

    def hf(new_tokens: int) -> tuple[torch.Tensor, None, None]:
        # the keywords verl 0.4.1's HF rollout passes
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            use_cache=True,
            return_dict_in_generate=True,
        )
        return out.sequences, None, None

    def static(new_tokens: int) -> tuple[torch.Tensor, bool, str | None]:
        result = generate(
            model,
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            graphs=True,
        )
        return result.sequences, result.graphed, result.fallback

    return {"hf": hf, "static": static}


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
    width = prompts.longest if args.width == "data" else max(lengths)
    vocab = model.config.vocab_size
    eos_ids, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    eos = eos_ids if isinstance(eos_ids, list) else [eos_ids]
    ids, mask = left_padded(torch_, lengths, width, vocab, pad, args.seed)
    ids, mask = ids.repeat_interleave(answers, dim=0), mask.repeat_interleave(answers, dim=0)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    config = GenerationConfig(num_beams=1, **(sampling if mode == "sample" else {"do_sample": False}))
    decode = decoders(model, ids, mask, config, eos, pad)

    def count_generated(sequences: torch.Tensor) -> int:
        return generated_tokens(torch_, sequences, width, eos)

    for name in DECODES:
        decode[name](WARMUP_TOKENS)
    calls: dict[str, list[Call]] = {name: [] for name in DECODES}
    outputs: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats):
        # A B, then B A: neither decode always runs on a GPU the other just warmed (or heated)
        for name in DECODES if repeat % 2 == 0 else DECODES[::-1]:
            torch_.manual_seed(args.seed + repeat)
            call, outputs[name] = timed(torch_, lambda name=name: decode[name](args.new_tokens), count_generated)
            calls[name].append(call)
    summaries = {name: summarize(calls[name]) for name in DECODES}
    result: dict[str, object] = {
        "batch": batch,
        "mode": mode,
        "rows": ids.shape[0],
        "prompts_x_answers": f"{count}x{answers}",
        "prompt_width": width,
        "mean_prompt_tokens": round(statistics.mean(lengths), 1),
        **summaries,
        "speedup": round(summaries["hf"]["seconds"] / summaries["static"]["seconds"], 2),
    }
    if mode == "greedy":
        result["same_tokens"] = same_tokens(torch_, outputs["hf"], outputs["static"], width, pad)
    return result


def show(result: dict[str, Any]) -> str:
    hf, static = result["hf"], result["static"]
    how = "graphed" if static["graphed"] else f"not graphed ({static['fallback'] or 'eager'})"
    line = (
        f"{result['batch']} {result['mode']}: {result['rows']} rows ({result['prompts_x_answers']}), width "
        f"{result['prompt_width']}: HF {hf['seconds']:.2f} s {hf['tokens_per_s']} tok/s {hf['reserved_gib']} GiB"
        f" | static {static['seconds']:.2f} s {static['tokens_per_s']} tok/s {static['reserved_gib']} GiB, {how}"
        f" | x{result['speedup']}"
    )
    same = result.get("same_tokens")
    if same and same["equal"]:
        line += " | greedy equal"
    elif same:
        line += (
            f" | greedy differs: {same['rows_equal']} rows equal, first at token {same['first_difference_at_token']}"
        )
    return line


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
    parser.add_argument(
        "--width", choices=["data", "batch"], default="data", help="pad prompts to the data's longest or the batch's"
    )
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
        "width": args.width,
    }
    print(json.dumps(header), flush=True)
    results = []
    with torch_.no_grad():
        for batch in args.batch or list(BATCHES):
            for mode in args.mode or list(MODES):
                results.append(run_config(torch_, model, batch, mode, prompts, args))
                print(show(results[-1]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**header, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
