"""KV-GROUP-SPEC-MEANING on block-stride alignment: more is legal, less is not.

vLLM reads ``block_stride_alignment`` only to size block strides
(contract.md#group-spec-meaning), so a group spec may ask for a multiple of
what the layer asks, never for less.
"""

from __future__ import annotations

import attrs
import pytest

from conformance.check.meaning import meaning_changes
from kvref import FullAttentionSpec, MLAAttentionSpec
from kvref.specs import MultipleOf

_FULL = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
_ALIGNED = attrs.evolve(_FULL, block_stride_alignment=4096)
#: MultipleOf(16) on 64-token blocks asks for the page of 16 tokens: 32 KiB here.
_KERNEL = attrs.evolve(_FULL, block_size=64, num_kv_heads=8, block_stride_alignment=MultipleOf(16))


@pytest.mark.parametrize(
    ("layer", "group_alignment"),
    [
        (_FULL, 4096),  # none asked, 4 KiB given
        (_ALIGNED, 8192),
        (_ALIGNED, 4096),
        (_KERNEL, 32768),  # the same bytes as an int
        (_KERNEL, 65536),
    ],
)
def test_a_group_may_ask_for_more_alignment(layer: FullAttentionSpec, group_alignment: int) -> None:
    kept = attrs.evolve(layer, block_stride_alignment=group_alignment)
    assert meaning_changes(layer, kept) == []


@pytest.mark.parametrize(
    ("layer", "group_alignment", "asked"),
    [
        (_ALIGNED, None, "multiples of 1 bytes"),
        (_ALIGNED, 6144, "multiples of 6144 bytes"),
        (_KERNEL, None, "multiples of 1 bytes"),
        (_KERNEL, 16384, "multiples of 16384 bytes"),
    ],
)
def test_a_group_may_not_ask_for_less(
    layer: FullAttentionSpec, group_alignment: int | None, asked: str
) -> None:
    kept = attrs.evolve(layer, block_stride_alignment=group_alignment)
    (change,) = meaning_changes(layer, kept)
    assert change.startswith("block_stride_alignment") and asked in change


def test_a_merge_that_carries_the_padded_page_is_the_base() -> None:
    # An MLA merge drops ``alignment`` and keeps the padded page, so the group
    # spec's MultipleOf asks for the whole padded page (as vLLM's does): a
    # builder asking for a multiple of that asks for more than the group it was given.
    layer = MLAAttentionSpec(
        block_size=256,
        block_stride_alignment=MultipleOf(64),
        num_kv_heads=1,
        head_size=512,
        dtype="uint8",
        state_content_bytes=584,
        tokens_per_state=4,
        cache_dtype_str="fp8_ds_mla",
        alignment=576,
    )
    merged = attrs.evolve(layer, alignment=None)
    assert meaning_changes(layer, merged) == []
    wider = attrs.evolve(merged, block_stride_alignment=4096 * merged.page_size_bytes)
    assert meaning_changes(layer, wider) == []
    assert meaning_changes(layer, attrs.evolve(merged, block_stride_alignment=None))
