"""vLLM-native builders at the draft-group clause (KV-GROUP-DRAFTS-TOGETHER).

vLLM's drafter asserts that its attention layers share one KV cache group
(contract.md#grouping-draft-layers); nothing binds target layers.

- :class:`ScattersTargetsBuilder` (legal) gives every target layer a group
  of its own and keeps each group's draft layers together: legal, and
  wasteful (each group takes blocks of its own).
- :class:`ScattersDraftsBuilder`, meant invariant ``KV-GROUP-DRAFTS-TOGETHER``:
  moves the last of a group's equal-spec draft layers into a group of its own.

Both leave HiSparse's groups (which carry roles) and a model-declared
grouping to vLLM's default, and the legal one also groups that its own
placement cannot lay out (a layer-compact layout refuses mixed pages over
several groups).
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = ["ScattersDraftsBuilder", "ScattersTargetsBuilder"]


def _owns_groups(vllm_config: VllmConfig) -> bool:
    """Whether HiSparse or the model decides the groups (the builder then keeps vLLM's)."""
    return (
        vllm_config.attention_config.hisparse_config is not None
        or vllm_config.model_config.supports_kv_cache_grouping
    )


def _part(group: KVCacheGroupSpec, names: list[str]) -> KVCacheGroupSpec:
    """The group of ``names``, part of ``group``: the group's spec, or its layers' specs."""
    if len(names) == len(group.layer_names):
        return group
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = dataclasses.replace(spec, kv_cache_specs={n: spec.kv_cache_specs[n] for n in names})
    return dataclasses.replace(group, layer_names=list(names), kv_cache_spec=spec)


class ScattersTargetsBuilder(DefaultKVCacheConfigBuilder):
    """Every target layer in a group of its own; a group's draft layers stay together."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        if _owns_groups(vllm_config):
            return groups
        out: list[KVCacheGroupSpec] = []
        for group in groups:
            drafts = [n for n in group.layer_names if kv_cache_spec[n].is_draft]
            parts = [[n] for n in group.layer_names if not kv_cache_spec[n].is_draft]
            out += [_part(group, names) for names in ([drafts] if drafts else []) + parts]
        try:
            self.get_kv_cache_config_from_groups(vllm_config, out, 1)
        except (ValueError, AssertionError):
            return groups
        return out


class ScattersDraftsBuilder(DefaultKVCacheConfigBuilder):
    """The last of a group's equal-spec draft layers moved into a group of its own."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        if _owns_groups(vllm_config):
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
