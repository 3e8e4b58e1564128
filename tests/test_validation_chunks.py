"""Validation cannot crash on batch arithmetic: verl's HF rollout, patched, generates any number of prompts.

verl 0.4.1's HFRollout.generate_sequences cut a batch into len // micro_batch_size chunks with
DataProto.chunk, which asserts equal chunks: 254 validation prompts (the length filter dropped 2 of
256) with micro batch 64 stopped the run before step 1. These tests run generate_sequences as the real
wheel has it, stock and patched (its text taken from the file). Without torch (this venv, CI) the
prompts are a stand-in with the DataProto methods generate_sequences calls, checked against verl's
protocol.py. The real DataProto, with the image's torch and tensordict, runs the image's patched rollout.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import docker
from verlbox.runtime.training.patches import PatchState, apply, patch_set_for, verify

HF_ROLLOUT = "verl/workers/rollout/hf_rollout.py"
PATCH_ID = "hf-rollout-chunks-any-batch-size"
STOCK_STOP = re.escape("only support equal chunk. Got size of DataProto 254 and chunk 3")
ASSERT_TEXT = 'f"only support equal chunk. Got size of DataProto {len(self)} and chunk {chunks}."'


def generate_sequences(site: Path, data_proto: object) -> Callable[..., object]:
    """HFRollout.generate_sequences exactly as the file in SITE has it, with DATA_PROTO as its DataProto."""
    source = (site / HF_ROLLOUT).read_text()
    rollout = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "HFRollout")
    method = next(n for n in rollout.body if isinstance(n, ast.FunctionDef) and n.name == "generate_sequences")
    namespace: dict[str, object] = {"DataProto": data_proto}
    exec(textwrap.dedent(ast.get_source_segment(source, method)), namespace)
    return namespace["generate_sequences"]  # type: ignore[return-value]


class Rollout:
    """An HFRollout's self as generate_sequences uses it: its config and one generate call per chunk."""

    def __init__(self, micro_batch_size: int | None) -> None:
        self.config = OmegaConf.create({} if micro_batch_size is None else {"micro_batch_size": micro_batch_size})
        self.chunk_sizes: list[int] = []

    def _generate_minibatch(self, prompts):
        self.chunk_sizes.append(len(prompts))
        return prompts  # the "responses" are the prompts' own rows: the output's order shows the chunks'


class Prompts:
    """What generate_sequences uses of verl 0.4.1's DataProto, as protocol.py does it: chunk() asserts
    equal chunks unless auto padding is on (then it cuts like torch.chunk); slice() and concat() keep order."""

    def __init__(self, rows: list[int], meta_info: dict | None = None) -> None:
        self.rows, self.meta_info = rows, meta_info or {}
        self.batch = types.SimpleNamespace(batch_size=(len(rows),))

    def __len__(self) -> int:
        return len(self.rows)

    def is_padding_enabled(self) -> bool:
        return self.meta_info.get("_verl_auto_padding", False)

    def chunk(self, chunks: int) -> list[Prompts]:
        if not self.is_padding_enabled():
            assert len(self) % chunks == 0, (
                f"only support equal chunk. Got size of DataProto {len(self)} and chunk {chunks}."
            )
        size = -(-len(self) // chunks)
        return [Prompts(self.rows[i : i + size], self.meta_info) for i in range(0, len(self), size)]

    def slice(self, start=None, end=None, step=None) -> Prompts:
        return Prompts(self.rows[start:end:step], self.meta_info)

    @staticmethod
    def concat(data: list[Prompts]) -> Prompts:
        return Prompts([row for part in data for row in part.rows], data[0].meta_info)


def test_the_patch_matches_its_one_place_in_the_real_wheel(verl_tree: Path) -> None:
    patch = next(p for p in patch_set_for("0.4.1").patches if p.id == PATCH_ID)
    assert patch.file == HF_ROLLOUT and patch.count == 1
    assert (verl_tree / HF_ROLLOUT).read_text().count(patch.find) == 1
    patch_set, before = apply(verl_tree)
    assert next(s for s in before if s.patch.id == PATCH_ID).state is PatchState.PENDING
    assert next(s for s in verify(verl_tree, patch_set) if s.patch.id == PATCH_ID).state is PatchState.APPLIED
    text = (verl_tree / HF_ROLLOUT).read_text()
    assert text.count(patch.replace) == 1 and patch.find not in text


def test_the_stand_in_offers_what_verls_dataproto_offers(verl_tree: Path) -> None:
    """Prompts stands for DataProto only as far as protocol.py in the wheel bears it out."""
    source = (verl_tree / "verl/protocol.py").read_text()
    data_proto = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "DataProto")
    methods = {n.name: n for n in data_proto.body if isinstance(n, ast.FunctionDef)}
    assert {"__len__", "chunk", "slice", "concat", "is_padding_enabled"} <= methods.keys()
    assert "split" not in methods  # 0.4.1 has no split(size): the patch slices
    assert [a.arg for a in methods["slice"].args.args] == ["self", "start", "end", "step"]
    chunk = ast.get_source_segment(source, methods["chunk"])
    assert "if not self.is_padding_enabled():" in chunk and f"assert len(self) % chunks == 0, {ASSERT_TEXT}" in chunk
    assert 'auto_padding_key = "_verl_auto_padding"' in source


def test_stock_rollout_stops_on_254_prompts_and_the_patched_one_generates_them(verl_tree: Path) -> None:
    stock = generate_sequences(verl_tree, Prompts)
    with pytest.raises(AssertionError, match=STOCK_STOP):
        stock(Rollout(64), Prompts(list(range(254))))
    apply(verl_tree)
    patched, rollout = generate_sequences(verl_tree, Prompts), Rollout(64)
    output = patched(rollout, Prompts(list(range(254)), {"validate": True}))
    assert rollout.chunk_sizes == [64, 64, 64, 62]
    assert output.rows == list(range(254)) and output.meta_info == {"validate": True}


def test_wherever_stock_verl_generates_the_patched_rollout_does_the_same(verl_tree: Path) -> None:
    """Stock settings keep stock behaviour: the same chunks whenever stock verl did not stop, and
    chunks of micro_batch_size (the last smaller) wherever it did."""
    stock = generate_sequences(verl_tree, Prompts)
    apply(verl_tree)
    patched = generate_sequences(verl_tree, Prompts)
    stopped = 0
    for micro in (None, 1, 3, 4, 16, 63, 64, 65, 100, 256, 1000):
        for size in range(1, 300):
            for meta_info in ({}, {"_verl_auto_padding": True}):
                before, after = Rollout(micro), Rollout(micro)
                output = patched(after, Prompts(list(range(size)), meta_info))
                assert output.rows == list(range(size)), (micro, size, meta_info)
                try:
                    expected = stock(before, Prompts(list(range(size)), meta_info))
                except AssertionError:
                    stopped += 1
                    assert not meta_info and micro is not None, (micro, size)
                    assert after.chunk_sizes == [micro] * (size // micro) + [size % micro], (micro, size)
                else:
                    assert after.chunk_sizes == before.chunk_sizes and output.rows == expected.rows, (micro, size)
    assert stopped > 100  # the sweep did reach sizes that stock verl stops on


# In the image: verl's own DataProto (torch, tensordict) and the installed, patched HFRollout.generate_sequences,
# called with a stand-in self whose one "generate" per chunk returns its prompts (no model needed).
IN_IMAGE = """
import json, types
import numpy as np, torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.workers.rollout.hf_rollout import HFRollout

def prompts(size):
    ids = torch.arange(size * 8).view(size, 8)
    tensors = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": ids % 8}
    raw = np.array([list(range(i % 5)) for i in range(size)] + [None], dtype=object)[:size]
    return DataProto.from_dict(tensors=tensors, non_tensors={"raw_prompt_ids": raw}, meta_info={"validate": True})

try:
    prompts(254).chunk(chunks=254 // 64)
    stock = "no stop"
except AssertionError as exc:
    stock = str(exc)
found = {"stock": stock}
for size in (254, 256, 130, 63):
    sizes = []
    rollout = types.SimpleNamespace(
        config=OmegaConf.create({"micro_batch_size": 64}),
        _generate_minibatch=lambda chunk: sizes.append(len(chunk)) or chunk,
    )
    given = prompts(size)
    output = HFRollout.generate_sequences(rollout, given)
    found[size] = {
        "chunks": sizes,
        "rows": len(output),
        "same_ids": bool(torch.equal(output.batch["input_ids"], given.batch["input_ids"])),
        "same_raw": list(output.non_tensor_batch["raw_prompt_ids"]) == list(given.non_tensor_batch["raw_prompt_ids"]),
    }
print(json.dumps(found))
"""


@pytest.mark.docker
@pytest.mark.slow
def test_real_dataproto_of_254_rows_generates_in_chunks_of_64_in_the_image(image: str) -> None:
    """The image's own verl: its DataProto refuses 254 rows in 3 equal chunks, and its patched rollout
    generates 254 prompts (the validation set the length filter left) in chunks of 64, keeping every row."""
    result = docker("run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", IN_IMAGE)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert re.search(STOCK_STOP, found["stock"]), found["stock"]
    for size, chunks in (("254", [64, 64, 64, 62]), ("256", [64, 64, 64, 64]), ("130", [65, 65]), ("63", [63])):
        assert found[size] == {"chunks": chunks, "rows": int(size), "same_ids": True, "same_raw": True}, size
