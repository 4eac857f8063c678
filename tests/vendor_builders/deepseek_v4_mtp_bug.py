"""The DeepSeek-V4 shared-tuple builder with a planted bug in the MTP draft slot.

DeepSeek's MTP module repeats the structure of a decoder layer and runs
after the stage's last decoder layer, so this variant "saves" one tuple per
block: it lays the MTP tuples over the last decoder layer's tuple instead of
after it, computing the draft's start from the last target tuple's offset
alone.  Whenever a stage holds an MTP layer, the draft's caches and the last
decoder layer's caches of one group share bytes inside one block, which both
layers hold at the same time, so each overwrites the other's KV
(contract.md#memory-safety: one block, one group).  Without an MTP layer the
plan is the correct builder's, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

from vendor_builders.deepseek_v4 import DeepSeekV4Builder
from vendor_builders.slots import CacheTuple

__all__ = ["DeepSeekV4MTPSlotBugBuilder"]


class DeepSeekV4MTPSlotBugBuilder(DeepSeekV4Builder):
    """:class:`DeepSeekV4Builder` whose MTP tuples overlap the last decoder layer's."""

    def _draft_start(self, targets: Sequence[CacheTuple], starts: Sequence[int]) -> int:
        # The bug: the last target tuple's start, not its end.
        return starts[-1] if starts else 0
