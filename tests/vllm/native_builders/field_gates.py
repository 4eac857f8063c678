"""Platforms whose gates meet engine paths their authors did not have in mind.

Two bug classes reported from the field, each written the way a vendor
writes it (a subclass of vLLM's ``DefaultKVCacheConfigBuilder``, one gate,
``super()`` elsewhere), beside a legal builder behind the same gate:

- :class:`PacksLatentsBuilder` (legal) and :class:`LatentHeadPageBuilder`
  (broken): on a block-outermost engine whose device layers all pass
  ``isinstance(spec, MLAAttentionSpec)``, every layer's page lies side by
  side in each block, one single-layer tensor per layer.  The legal one
  sizes a page as the spec's ``page_size_bytes``; the broken one as one
  latent head (``page_size_bytes // num_kv_heads``), true of an MLA latent
  cache and false of vLLM's hidden-state cache, an ``MLAAttentionSpec``
  subclass that stores several auxiliary states per token: its pages run
  over the next layer's and into the next block.  ``KV-PLACE-IN-BOUNDS``,
  ``KV-PLACE-NO-BLOCK-ALIAS`` or ``KV-PLACE-NO-LAYER-OVERLAP`` must catch it
  (on paper; the device, the worker and the serving simulation see the same
  overwrite).
- :class:`RebuildsUniformGroupsBuilder` (legal) and
  :class:`EngineBlockSizeGroupsBuilder` (broken): on a block-outermost engine,
  every uniform-type group spec vLLM made is re-created from its layers' specs.
  The legal one keeps the block size its layers share; the broken one takes
  ``cache_config.block_size``.  Where they differ, the group's block table
  counts tokens in blocks of the wrong size and a token's slot lies in a page
  another block ID owns (vLLM itself checks nothing there).  kvref records
  the wrapper's block size as declared, and ``KV-GROUP-ONE-BLOCK-SIZE``
  catches it, naming the slots that land in other blocks' pages; served as
  they are, such groups fail ``KV-SERVE-POOL`` (tests/extensions/serve/test_serve.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    UniformTypeKVCacheSpecs,
)

from tests.vllm.native_builders._common import (
    Groups,
    PlainEngineGroups,
    SlotPlan,
    SlotPlanBuilder,
    Specs,
    layer_specs,
    plain_engine,
    round_up,
)

__all__ = [
    "EngineBlockSizeGroupsBuilder",
    "LatentHeadPageBuilder",
    "PacksLatentsBuilder",
    "RebuildsUniformGroupsBuilder",
]


class PacksLatentsBuilder(SlotPlanBuilder):
    """MLA-only engines: every layer's page side by side in one block (legal)."""

    def page_bytes(self, spec: KVCacheSpec) -> int:
        """The bytes one layer's page takes in a block."""
        return int(spec.page_size_bytes)

    def _slot_plan(
        self, vllm_config: VllmConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Side-by-side pages of every layer (``None``: the gate is shut)."""
        if not plain_engine(vllm_config):
            return None
        placed = [pair for group in kv_cache_groups for pair in layer_specs(group)]
        # The platform's gate: its MLA kernels, for every MLA spec class.
        if not placed or not all(isinstance(spec, MLAAttentionSpec) for _, spec in placed):
            return None
        offsets: dict[str, int] = {}
        pages: dict[str, int] = {}
        end, alignment = 0, 1
        for name, spec in placed:
            offsets[name], pages[name] = end, self.page_bytes(spec)
            end += pages[name]
            alignment = math.lcm(alignment, spec.get_block_stride_alignment())
        return SlotPlan(offsets=offsets, pages=pages, bytes_per_block=round_up(end, alignment))


class LatentHeadPageBuilder(PacksLatentsBuilder):
    """The packed placement with a page sized as one latent head (broken)."""

    def page_bytes(self, spec: KVCacheSpec) -> int:
        """One latent head's bytes: all of an MLA page, a part of a hidden-state page."""
        return int(spec.page_size_bytes) // max(1, int(getattr(spec, "num_kv_heads", 1)))


class RebuildsUniformGroupsBuilder(PlainEngineGroups):
    """vLLM's groups, uniform-type group specs re-created from their layers (legal)."""

    def group_block_size(self, vllm_config: VllmConfig, spec: UniformTypeKVCacheSpecs) -> int:
        """The block size of the re-created group spec: the one its layers share."""
        return int(spec.block_size)

    def regroup(self, vllm_config: VllmConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        """vLLM's groups, each uniform-type group spec rebuilt."""
        out = []
        for group in groups:
            spec = group.kv_cache_spec
            if not isinstance(spec, UniformTypeKVCacheSpecs):
                out.append(group)
                continue
            fresh: Any = UniformTypeKVCacheSpecs(
                block_size=self.group_block_size(vllm_config, spec),
                kv_cache_specs=dict(spec.kv_cache_specs),
            )
            out.append(
                KVCacheGroupSpec(
                    layer_names=list(group.layer_names), kv_cache_spec=fresh, **_group_extras(group)
                )
            )
        return out


class EngineBlockSizeGroupsBuilder(RebuildsUniformGroupsBuilder):
    """Uniform-type group specs re-created with the engine's block size (broken)."""

    def group_block_size(self, vllm_config: VllmConfig, spec: UniformTypeKVCacheSpecs) -> int:
        """``cache_config.block_size``, whatever block size the layers share."""
        return int(vllm_config.cache_config.block_size)


def _group_extras(group: KVCacheGroupSpec) -> dict[str, Any]:
    """The group's fields other than its layers and spec, copied as they are."""
    return {
        f.name: getattr(group, f.name)
        for f in dataclasses.fields(group)
        if f.name not in ("layer_names", "kv_cache_spec") and f.init
    }
