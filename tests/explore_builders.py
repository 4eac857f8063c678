"""Builders whose own code the default run never enters: what ``--explore`` is for.

A GLM-5-style platform specialises the variant whose indexer keeps no tail
ring: Mamba state layers, MLA latents and an indexer key cache present, the
indexer's tail cache (a ``CircularBufferSpec``) absent; "a role present and
another absent", tested strictly, each condition on its own line as vendors
write them.  No built-in family draws that variant (GLM-5 always has its
tail ring; DeepSeek-V3.2 has an indexer but no Mamba layers), so the default
run reaches the first conditions and never the specialised placement.
Exploration keeps the examples that reach further into the gate (a GLM-5
model passes more of its conditions than any other) and mutates them; a
dropped cache role (``explored: drop-role``) opens it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import CircularBufferSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec

__all__ = ["NoTailShortBacking", "NoTailSplitTensors"]


def _layer_specs(groups: Sequence[KVCacheGroupSpec]) -> list[KVCacheSpec]:
    return [g.layer_spec(name) for g in groups for name in g.layer_names]


class _NoTailGate(ReferenceKVCacheConfigBuilder):
    """The reference everywhere except the no-tail GLM-5 variant (module docstring)."""

    def _is_no_tail_glm(self, groups: Sequence[KVCacheGroupSpec]) -> bool:
        specs = _layer_specs(groups)
        kinds = {type(s) for s in specs}
        if MambaSpec not in kinds:
            return False
        mla = [s for s in specs if type(s) is MLAAttentionSpec]
        if not any(s.cache_role == "SPARSE" for s in mla):
            return False
        if not any(s.cache_role == "INDEXER" for s in mla):
            return False
        return CircularBufferSpec not in kinds

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if not self._is_no_tail_glm(kv_cache_groups):
            return result
        return self._specialise(result, num_blocks)

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError


class NoTailShortBacking(_NoTailGate):
    """Broken: the no-tail variant's tensors are one block short (``KV-PLACE-BACKING-SIZE``)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = [
            t if t.host_resident else attrs.evolve(t, size=t.size - t.size // num_blocks)
            for t in result.kv_cache_tensors
        ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class NoTailSplitTensors(_NoTailGate):
    """Legal: the no-tail variant's tensors in reverse order (the same bytes, another list)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return attrs.evolve(result, kv_cache_tensors=list(result.kv_cache_tensors)[::-1])
