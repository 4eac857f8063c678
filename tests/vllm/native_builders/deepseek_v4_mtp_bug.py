"""The DeepSeek-V4 shared-tuple builder with a planted bug in the MTP draft's slot.

Meant invariant: ``KV-PLACE-NO-LAYER-OVERLAP`` (contract.md#memory-safety,
one block, one group).

DeepSeek's MTP module repeats a decoder layer and runs after the stage's
last decoder layer, so this variant "saves" one tuple per block: it starts
the MTP tuples at the last decoder layer's tuple instead of after it.
Whenever a stage holds an MTP layer next to a target layer of the same
table, the draft's caches and the last target layer's share bytes of one
block that both hold at once.  Every DeepSeek-V4 model the kit draws with an
MTP layer has one in the window table (``swa_cache``), so the bug is in code
the default generation reaches; without an MTP layer the plan is the
correct builder's, byte for byte.  The device check (``KV-DEV-TAGS``) and
the serving simulation (``KV-SERVE-ISOLATION``) see the same overwrite from
their side.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.vllm.native_builders.deepseek_v4 import CacheTuple, DeepSeekV4TupleBuilder

__all__ = ["DeepSeekV4MTPOverlapBuilder"]


class DeepSeekV4MTPOverlapBuilder(DeepSeekV4TupleBuilder):
    """:class:`DeepSeekV4TupleBuilder` whose MTP tuples overlap the last decoder layer's."""

    def _draft_start(self, targets: Sequence[CacheTuple], starts: Sequence[int]) -> int:
        # The bug: the last target tuple's start, not its end.
        return starts[-1] if starts else 0
