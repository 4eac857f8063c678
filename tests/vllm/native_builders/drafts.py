"""vLLM-native builders at the draft-group clause (KV-GROUP-DRAFTS-TOGETHER).

vLLM's drafter asserts that its attention layers share one KV cache group
(contract.md#grouping-draft-layers); nothing binds target layers.

- :class:`ScattersTargetsBuilder` (legal) gives every target layer of plain
  full or sliding-window attention a group of its own and keeps each
  group's draft layers together: legal, and wasteful (each group takes
  blocks of its own).
- :class:`ScattersDraftsBuilder`, meant invariant ``KV-GROUP-DRAFTS-TOGETHER``:
  moves the last of a group's equal-spec draft layers into a group of its own.

The legal one regroups only where a platform's kernels would run its own
grouping (:func:`~tests.vllm.native_builders._common.plain_engine`: a
block-outermost layout, the hybrid manager on, no HiSparse, no
model-declared grouping); the broken one everywhere but HiSparse and a
model-declared grouping, which own the groups.  Everything else is vLLM's default.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from tests.vllm.native_builders._common import Groups, PlainEngineGroups, Specs

__all__ = ["ScattersDraftsBuilder", "ScattersTargetsBuilder"]


def _part(group: KVCacheGroupSpec, names: list[str]) -> KVCacheGroupSpec:
    """The group of ``names``, part of ``group``: the group's spec, or its layers' specs."""
    if len(names) == len(group.layer_names):
        return group
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = dataclasses.replace(spec, kv_cache_specs={n: spec.kv_cache_specs[n] for n in names})
    return dataclasses.replace(group, layer_names=list(names), kv_cache_spec=spec)


def _plain_attention(group: KVCacheGroupSpec) -> bool:
    """Whether every layer of ``group`` is exactly full or sliding-window attention.

    The platform regroups only the caches its own kernels read as plain
    pages; compressed and state caches (whose blocks the worker may split
    into kernel blocks only as vLLM packs them) keep vLLM's groups.
    """
    spec = group.kv_cache_spec
    specs = spec.kv_cache_specs.values() if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
    return all(type(s) in (FullAttentionSpec, SlidingWindowSpec) for s in specs)


class ScattersTargetsBuilder(PlainEngineGroups):
    """Every target layer in a group of its own; a group's draft layers stay together."""

    def regroup(self, vllm_config: VllmConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        out: list[KVCacheGroupSpec] = []
        for group in groups:
            if not _plain_attention(group):
                out.append(group)
                continue
            drafts = [n for n in group.layer_names if kv_cache_spec[n].is_draft]
            parts = [[n] for n in group.layer_names if not kv_cache_spec[n].is_draft]
            out += [_part(group, names) for names in ([drafts] if drafts else []) + parts]
        return out


class ScattersDraftsBuilder(DefaultKVCacheConfigBuilder):
    """The last of a group's equal-spec draft layers moved into a group of its own."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        owned = vllm_config.attention_config.hisparse_config is not None
        if owned or vllm_config.model_config.supports_kv_cache_grouping:
            return groups
        for i, group in enumerate(groups):
            drafts = [n for n in group.layer_names if kv_cache_spec[n].is_draft]
            twins = [n for n in drafts if kv_cache_spec[n] == kv_cache_spec[drafts[-1]]]
            if len(twins) < 2:
                continue
            moved = twins[-1]
            groups[i] = _part(group, [n for n in group.layer_names if n != moved])
            return [*groups, _part(group, [moved])]
        return groups
