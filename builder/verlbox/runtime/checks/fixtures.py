"""Small stand-ins made on the spot: a tokenizer, a random Qwen2-shaped model and GSM8K-shaped data.

No hub is reachable from CI or the GPU machine, so smoke checks, tests and benchmarks make these.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

# Qwen2.5's chat template, reduced to what verl's GSM8K prompts use.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
WORDS = [
    "Natalia",
    "sold",
    "clips",
    "to",
    "friends",
    "in",
    "April",
    "and",
    "then",
    "half",
    "as",
    "many",
    "in",
    "May",
    ".",
    "How",
    "many",
    "did",
    "she",
    "sell",
    "altogether",
    "?",
    "Let's",
    "think",
    "step",
    "by",
    "step",
    "and",
    "output",
    "the",
    "final",
    "answer",
    "after",
    '"',
    "####",
    '"',
    ".",
    "The",
    "answer",
    "is",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "user",
    "assistant",
    "system",
    ",",
    ":",
    "+",
    "-",
    "*",
    "/",
    "=",
    "$",
    "apples",
    "each",
    "had",
    "more",
    "than",
]

# The shape of Qwen2.5-0.5B-Instruct (494 M parameters); "tiny" keeps its structure at toy size.
QWEN25_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
SHAPES = {"tiny": TINY, "qwen2.5-0.5b": QWEN25_05B}


def make_tokenizer(directory: Path, vocab_size: int) -> Path:
    """A word-level tokenizer with a chat template; filler tokens pad it to the model's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *WORDS]))}
    for index in range(len(vocabulary), vocab_size):
        vocabulary[f"t{index}"] = index
    backend = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<|endoftext|>", eos_token="<|im_end|>", bos_token=None
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[:3]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def make_model(directory: Path, shape: str = "tiny", seed: int = 0) -> Path:
    """A randomly initialised Qwen2 causal LM of the named shape, saved with its tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    dimensions = SHAPES[shape]
    make_tokenizer(directory, dimensions["vocab_size"])
    config = Qwen2Config(**dimensions, bos_token_id=None, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    GenerationConfig(eos_token_id=2, pad_token_id=0).save_pretrained(directory)
    return directory


# GSM8K's question lengths in words (whitespace split) as (quantile, words) knots of the inverse CDF, per
# split, measured on openai/grade-school-math's jsonl: train (7473 rows: mean 45.1, median 42, p90 69, p99
# 100, max 183) and test (1319 rows: mean 46.3, median 43, p90 70, p99 102, max 164). The ends are the real
# shortest and longest questions (9 and 15 words: no floor is invented); the knots between (p1, p5, p10,
# p25, p75, p95, p99.9) are the same files' too, since the lower half is no straight line from the
# shortest. Straight lines between knots overshoot a right-skewed tail a little: samples average 45.8 and
# 46.6 words, against the real 45.1 and 46.3.
GSM8K_QUESTION_WORDS: dict[str, tuple[tuple[float, float], ...]] = {
    "train": (
        (0.0, 9), (0.01, 19), (0.05, 23), (0.1, 27), (0.25, 33), (0.5, 42),
        (0.75, 54), (0.9, 69), (0.95, 79), (0.99, 100), (0.999, 132), (1.0, 183),
    ),
    "test": (
        (0.0, 15), (0.01, 19), (0.05, 24), (0.1, 27), (0.25, 33), (0.5, 43),
        (0.75, 55), (0.9, 70), (0.95, 82), (0.99, 102), (0.999, 129), (1.0, 164),
    ),
}  # fmt: skip
# "uniform": every question the same 19 words (what smoke checks and older figures used);
# "gsm8k": question lengths drawn from GSM8K_QUESTION_WORDS, for figures that should hold for GSM8K
QuestionLengths = Literal["uniform", "gsm8k"]
# a question of any length ends with this (7 words, the answer's operands), so it fits GSM8K's shortest
QUESTION_END = "How many is {a} + {b} ?"
# the words before QUESTION_END, repeated as far as a question's length needs
QUESTION_STORY = "Natalia sold clips to friends in April and then half as many clips in May ."


def words_at(knots: Sequence[tuple[float, float]], quantile: float) -> int:
    """The inverse CDF through KNOTS at QUANTILE (0..1): straight between knots, rounded to whole words."""
    for (low_q, low_words), (high_q, high_words) in itertools.pairwise(knots):
        if quantile <= high_q:
            share = (quantile - low_q) / (high_q - low_q)
            return round(low_words + share * (high_words - low_words))
    return round(knots[-1][1])


def sample_question_words(split: str, count: int, rng: random.Random) -> list[int]:
    """COUNT question lengths in words following GSM8K's SPLIT ("train" or "test"), in shuffled order.

    Stratified: one draw from each of COUNT equal slices of the quantiles, so a few hundred rows already hold
    the real quantiles, not just a few thousand. The top slice gives the split's longest question itself:
    verl pads every prompt to data.max_prompt_length, which train lowers to the data's longest prompt, so
    the longest question sets every rollout's width as it does on the real data."""
    knots = GSM8K_QUESTION_WORDS[split]
    quantiles = [(index + rng.random()) / count for index in range(count - 1)] + ([1.0] if count else [])
    lengths = [words_at(knots, quantile) for quantile in quantiles]
    rng.shuffle(lengths)
    return lengths


def gsm8k_question(words: int | None, a: int, b: int) -> str:
    """A question about A + B: the 19-word one when WORDS is None, else one of WORDS words (7 at least)."""
    if words is None:
        return f"Natalia sold {a} clips in April and {b} clips in May . How many did she sell altogether ?"
    end, story_words = QUESTION_END.format(a=a, b=b).split(), QUESTION_STORY.split()
    story = [story_words[index % len(story_words)] for index in range(max(0, words - len(end)))]
    return " ".join(story + end)


def make_gsm8k_jsonl(
    directory: Path,
    train_rows: int = 8,
    test_rows: int = 4,
    seed: int = 0,
    lengths: QuestionLengths = "uniform",
) -> Path:
    """GSM8K-shaped question/answer rows (thousands separators included) as train.jsonl and test.jsonl.

    LENGTHS "gsm8k" gives each split's questions GSM8K's real length distribution (sample_question_words);
    "uniform" (the default, which smoke checks use) gives every question the same 19 words. The same
    arguments always write the same bytes."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train_rows), ("test", test_rows)):
        words = sample_question_words(split, count, rng) if lengths == "gsm8k" else [None] * count
        lines = []
        for length in words:
            a, b = rng.randint(1, 900), rng.randint(1000, 9000)
            answer = f"She sold {a} + {b} = {a + b} clips .\n#### {a + b:,}"
            lines.append(json.dumps({"question": gsm8k_question(length, a, b), "answer": answer}))
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return directory
