"""A vLLM builder for GLM-5-style hybrids that owns the whole placement of its family.

A GLM-5-style model has three KDA linear-attention layers (vLLM
``MambaSpec`` with ``mamba_type`` LINEAR, ``model.layers.{i}.self_attn``)
per indexed sparse-MLA layer, which keeps three caches:
``model.layers.{i}.self_attn.attn`` (the MLA latent, role SPARSE),
``.indexer.k_cache`` (the kpool indexer's key, role INDEXER, several tokens
per state) and ``.indexer.tail_cache`` (its ring, ``CircularBufferSpec``).
The grouping is vLLM's (``super()``).

The (fictional) platform streams KDA states from the bottom of a block and
sparse tables from its top, so its prefetcher can start the state copy and
the latent gather of one block ID from opposite ends: state groups are
packed up from byte 0, attention groups down from the block's top, every
cache on a 16-byte boundary, one single-layer tensor per cache, attention
tensors first.  All groups overlay one block (a block ID belongs to one
group at a time: contract.md#memory-safety, cross-group aliasing); inside a
group no two caches share a byte.  A block is the widest group rounded up to
a 512-byte granule and every alignment; Core learns it from a one-block
placement (the builder does not answer ``_get_pool_bytes_per_block``).

The gate is strict: every layer handed over is exactly a LINEAR
``MambaSpec``, an ``MLAAttentionSpec`` or a ``CircularBufferSpec`` under a
GLM-5 name; the INDEXER role (with ``tokens_per_state`` > 1) must be present
and no sliding-window MLA cache may be; and every group is either all
states or all attention.  Anything else (a DeepSeek model, a worker that
holds only KDA layers, a layer-outer layout) is vLLM's default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from vllm.config import VllmConfig
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SparseCacheRole,
)

from tests.vllm.native_builders._common import (
    SlotPlan,
    SlotPlanBuilder,
    layer_specs,
    plain_engine,
    round_down,
    round_up,
)

__all__ = [
    "CACHE_ALIGN",
    "GRANULE",
    "GLM5TopDownBuilder",
    "decoder_index",
    "glm5_role",
    "is_glm5_model",
]

#: Every cache starts on this boundary (the widest dtype's vector load).
CACHE_ALIGN = 16
#: Every block is rounded up to this.
GRANULE = 512

_LAYER = re.compile(
    r"^.+?\.(?P<index>\d+)\.self_attn(?:\.(?P<role>attn|indexer\.k_cache|indexer\.tail_cache))?$"
)


def decoder_index(name: str) -> int | None:
    """The decoder-layer index in a GLM-5 cache name, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    return None if match is None else int(match["index"])


def glm5_role(name: str, spec: KVCacheSpec) -> str | None:
    """``state``, ``latent``, ``key`` or ``ring`` for a GLM-5 cache; ``None`` otherwise."""
    match = _LAYER.match(name)
    if match is None:
        return None
    role = match["role"]
    if role is None:
        linear = type(spec) is MambaSpec and spec.mamba_type is MambaAttentionBackendEnum.LINEAR
        return "state" if linear else None
    if role == "indexer.tail_cache":
        return "ring" if type(spec) is CircularBufferSpec else None
    if type(spec) is not MLAAttentionSpec:
        return None
    if role == "attn":
        return "latent" if spec.cache_role is SparseCacheRole.SPARSE else None
    compressed = isinstance(spec.tokens_per_state, int) and spec.tokens_per_state > 1
    return "key" if spec.cache_role is SparseCacheRole.INDEXER and compressed else None


def is_glm5_model(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether every cache is a GLM-5 cache and the indexer key is among them."""
    roles = [glm5_role(n, s) for n, s in specs.items()]
    return bool(roles) and None not in roles and "key" in roles


class GLM5TopDownBuilder(SlotPlanBuilder):
    """States up from byte 0, sparse tables down from the top; vLLM's default otherwise."""

    def _slot_plan(
        self, vllm_config: VllmConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""
        if not plain_engine(vllm_config):
            return None
        members = [layer_specs(g) for g in groups]
        if not is_glm5_model({n: s for m in members for n, s in m}):
            return None
        kinds = [{glm5_role(n, s) == "state" for n, s in m} for m in members]
        if any(len(k) > 1 for k in kinds):
            return None  # a group mixing states and attention is not this platform's
        widest = max(sum(round_up(s.page_size_bytes, CACHE_ALIGN) for _, s in m) for m in members)
        alignment = GRANULE
        for m in members:
            for _, spec in m:
                alignment = math.lcm(alignment, spec.get_block_stride_alignment())
        top = round_up(widest, alignment)
        offsets: dict[str, int] = {}
        pages: dict[str, int] = {}
        for m, kind in zip(members, kinds, strict=True):
            states = kind == {True}
            cursor = 0 if states else top
            for name, spec in m:
                page = spec.page_size_bytes
                if states:
                    offsets[name] = cursor
                    cursor = round_up(cursor + page, CACHE_ALIGN)
                else:
                    cursor = round_down(cursor - page, CACHE_ALIGN)
                    offsets[name] = cursor
                pages[name] = page
        # Attention tensors first: the sparse kernels look their caches up by tensor index.
        state_names = {n for m, k in zip(members, kinds, strict=True) if k == {True} for n, _ in m}
        order = sorted(offsets, key=lambda n: n in state_names)
        return SlotPlan(
            offsets={n: offsets[n] for n in order},
            pages=pages,
            bytes_per_block=top,
        )
