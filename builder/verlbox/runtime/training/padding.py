"""Padding that no row of a micro batch uses, cut before verl's actor and critic forward passes.

verl pads every prompt on the left to data.max_prompt_length and every response on the right to
data.max_response_length. Without flash-attn (use_remove_padding needs it) its actor and critic compute
every position, padding included: in a GSM8K step 43% of the positions are padding. A column that is
padding in every row of a micro batch changes no real position's output (attention masks it, and the
real positions keep their position ids: only whole columns at either end go), so the patched
`_forward_micro_batch` (patches/verl-0.4.1.yaml, key trim_padding) computes without those columns and
gives back zeros for the cut response columns, which verl's response mask drops from every loss, value
and KL term. Rows keep their order.

Imported inside verl's patched code, where torch is loaded: this module itself imports none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def trim_widths(used: list[bool], response_length: int) -> tuple[int, int]:
    """(left, right): how many leading prompt columns and trailing response columns are padding in every
    row, given USED (per column: does any row use it). At least one prompt column stays (its logit
    predicts the first response token) and at least one response column."""
    prompt_length = len(used) - response_length
    if prompt_length < 1 or response_length < 1:
        raise ValueError(f"{len(used)} columns cannot hold a prompt and {response_length} response columns")
    left = next((i for i, column in enumerate(used[:prompt_length]) if column), prompt_length - 1)
    response = used[prompt_length:]
    last = next((i for i in range(response_length - 1, -1, -1) if response[i]), 0)
    return min(left, prompt_length - 1), response_length - 1 - last


@dataclass(frozen=True)
class PaddingTrim:
    left: int
    right: int
    response_length: int

    @classmethod
    def of(cls, attention_mask: Any, response_length: int) -> PaddingTrim:
        """The columns of ATTENTION_MASK (batch, sequence) that no row uses, at either end."""
        used = attention_mask.bool().any(dim=0).tolist()
        return cls(*trim_widths(used, response_length), response_length)

    @property
    def kept(self) -> int:
        """Response columns computed."""
        return self.response_length - self.right

    def columns(self, tensor: Any) -> Any:
        """TENSOR (..., sequence) without the cut columns."""
        return tensor[..., self.left : tensor.shape[-1] - self.right]

    def pad_back(self, tensor: Any) -> Any:
        """TENSOR (batch, kept) as (batch, response_length), the cut columns zero; None stays None."""
        if tensor is None or not self.right:
            return tensor
        from torch.nn.functional import pad

        return pad(tensor, (0, self.right))
