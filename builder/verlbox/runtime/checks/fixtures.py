"""Small stand-ins made on the spot: a tokenizer, a random Qwen2-shaped model and GSM8K-shaped data.

No hub is reachable from CI or the GPU machine, so smoke checks, tests and benchmarks make these.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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


def make_gsm8k_jsonl(directory: Path, train_rows: int = 8, test_rows: int = 4, seed: int = 0) -> Path:
    """GSM8K-shaped question/answer rows (thousands separators included) as train.jsonl and test.jsonl."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train_rows), ("test", test_rows)):
        lines = []
        for _ in range(count):
            a, b = rng.randint(1, 900), rng.randint(1000, 9000)
            question = f"Natalia sold {a} clips in April and {b} clips in May . How many did she sell altogether ?"
            answer = f"She sold {a} + {b} = {a + b} clips .\n#### {a + b:,}"
            lines.append(json.dumps({"question": question, "answer": answer}))
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return directory
