"""Acme's vLLM builder for its (made-up) "Hydra" models; a pass-through everywhere else.

A Hydra decoder layer ``model.layers.{i}.hydra`` has two attention caches of
one block size: ``.kv`` (full attention) and ``.local`` (a sliding window
with fewer heads).  Acme's fused Hydra kernel reads both caches of a decoder
layer through one block table, so the builder allocates the local cache as
full attention (window recorded) and keeps every Hydra cache in one group,
draft layers last.

No built-in family of the kit produces these names, so with the kit's
default generation every gate stays shut and both hooks are vLLM's own
(``super()``): the builder is the legal pass-through case, and the kit's
reach report should name ``_one_table`` and ``_promoted`` as never entered.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from tests.vllm.native_builders._common import plain_engine

__all__ = ["HydraPassThroughBuilder", "hydra_key"]

_LAYER = re.compile(r"^(?P<stem>.+?\.(?P<index>\d+)\.hydra)\.(?P<role>kv|local)$")
#: The exact vLLM class each role must have: a vendor subclass (say an MLA or
#: sink variant) is a different kernel and not Acme's to fuse.
_ROLE_CLASS: dict[str, type[KVCacheSpec]] = {"kv": FullAttentionSpec, "local": SlidingWindowSpec}
_RANK = {"kv": 0, "local": 1}


def hydra_key(name: str, spec: KVCacheSpec) -> tuple[bool, int, int] | None:
    """``(draft, decoder index, rank)`` of a Hydra cache, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    if match is None or type(spec) is not _ROLE_CLASS[match["role"]]:
        return None
    return spec.is_draft, int(match["index"]), _RANK[match["role"]]


def _promoted(spec: KVCacheSpec) -> KVCacheSpec:
    """A local cache as full attention with its window recorded; a global one unchanged."""
    if type(spec) is not SlidingWindowSpec:
        return spec
    target = {f.name for f in dataclasses.fields(FullAttentionSpec) if f.init}
    kwargs: dict[str, Any] = {
        f.name: getattr(spec, f.name)
        for f in dataclasses.fields(spec)
        if f.init and f.name in target
    }
    kwargs["sliding_window"] = spec.sliding_window
    return FullAttentionSpec(**kwargs)


class HydraPassThroughBuilder(DefaultKVCacheConfigBuilder):
    """One ``(kv, local)`` table for Hydra models; vLLM's default builder for everything else."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Every Hydra cache in one table; any model with a non-Hydra layer is vLLM's."""
        keys = {n: hydra_key(n, s) for n, s in kv_cache_spec.items()}
        # One block table needs one block size and one DCP sharding; the fused
        # kernel needs every cache of the model to be a Hydra cache.
        sizes = {(s.block_size, s.dcp_sharded) for s in kv_cache_spec.values()}
        if (
            not keys
            or any(k is None for k in keys.values())
            or len(sizes) != 1
            or not plain_engine(vllm_config)
        ):
            return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        return self._one_table(kv_cache_spec, {n: k for n, k in keys.items() if k is not None})

    @staticmethod
    def _one_table(
        specs: dict[str, KVCacheSpec], keys: dict[str, tuple[bool, int, int]]
    ) -> list[KVCacheGroupSpec]:
        names = sorted(keys, key=keys.__getitem__)
        promoted = {n: _promoted(specs[n]) for n in names}
        table = UniformTypeKVCacheSpecs.from_specs(promoted)
        if table is None:  # one block size and one kind by the gate: never
            raise ValueError("Hydra caches do not form one uniform-type table")
        return [KVCacheGroupSpec(names, table)]
