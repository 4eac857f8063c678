"""Broken builders whose bug is in a call or in the grouping (and the one that hangs)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from broken_builders._base import Groups, Specs, _Base, _Grouping, member_of
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
)
from kvref.specs import KVCacheSpec


@member_of("all", "reproduced")
class DroppedLayer(_Grouping):
    """Forgets the last layer of the largest group."""

    CAUGHT_BY = "KV-GROUP-PARTITION"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if not groups:
            return groups
        i = max(range(len(groups)), key=lambda k: len(groups[k].layer_names))
        g = groups[i]
        if len(g.layer_names) == 1:
            return groups[:i] + groups[i + 1 :]
        names = list(g.layer_names[:-1])
        spec = g.kv_cache_spec
        from kvref import UniformTypeKVCacheSpecs

        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(
                kv_cache_specs={n: spec.kv_cache_specs[n] for n in names}
            )
        groups[i] = attrs.evolve(g, layer_names=names, kv_cache_spec=spec)
        return groups


@member_of("all")
class DuplicatedLayer(_Grouping):
    """Puts the first layer into a second, extra group as well."""

    CAUGHT_BY = "KV-GROUP-PARTITION"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if not groups:
            return groups
        name = groups[0].layer_names[0]
        return [
            *groups,
            KVCacheGroupSpec(layer_names=[name], kv_cache_spec=groups[0].layer_spec(name)),
        ]


@member_of("all")
class RepeatedInGroup(_Grouping):
    """Lists the first layer of the first group twice in that group."""

    CAUGHT_BY = "KV-GROUP-REPEATED-LAYER"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if groups:
            g = groups[0]
            groups[0] = attrs.evolve(g, layer_names=[*g.layer_names, g.layer_names[0]])
        return groups


@member_of("all")
class EmptyGroup(_Grouping):
    """Appends a group with no layers."""

    CAUGHT_BY = "KV-GROUP-NONEMPTY"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if groups:
            groups.append(attrs.evolve(groups[-1], layer_names=[]))
        return groups


@member_of("all")
class DroppedHeads(_Grouping):
    """Halves the KV heads of every plain attention group: the layers lose half their cache."""

    CAUGHT_BY = "KV-GROUP-LAYER-SPEC"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref import AttentionSpec

        out = []
        for g in groups:
            spec = g.kv_cache_spec
            if (
                isinstance(spec, AttentionSpec)
                and spec.num_kv_heads % 2 == 0
                and spec.num_head_slots is None
                and spec.page_size_padded is None
                and getattr(spec, "alignment", None) is None
            ):
                spec = attrs.evolve(spec, num_kv_heads=spec.num_kv_heads // 2)
            out.append(attrs.evolve(g, kv_cache_spec=spec))
        return out


@member_of("all")
class Stateful(_Base):
    """Returns the groups in reverse order from its second call on."""

    CAUGHT_BY = "KV-GROUP-DETERMINISTIC"

    def __init__(self) -> None:
        self.calls = 0

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        self.calls += 1
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return groups[::-1] if self.calls > 1 else groups


@member_of("all")
class MutatesInput(_Grouping):
    """Empties the dict of layer specs it was given."""

    CAUGHT_BY = "KV-GROUP-INPUT-UNCHANGED"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if isinstance(kv_cache_spec, dict):
            kv_cache_spec.clear()
        return groups


@member_of("all")
class RaisesOnValidInput(_Base):
    """Raises on any model with more than two layers."""

    CAUGHT_BY = "KV-CALL-RAISES"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        if len(kv_cache_spec) > 2:
            raise RuntimeError("unsupported model")
        return super().get_kv_cache_groups(config, kv_cache_spec)


@member_of("all")
class WrongReturnType(_Base):
    """Returns the config as a plain dict."""

    CAUGHT_BY = "KV-CALL-RETURN-TYPE"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> Any:
        return attrs.asdict(
            super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        )


@member_of("all", "reproduced")
class Hangs(_Base):
    """Never returns from placement."""

    CAUGHT_BY = "KV-CALL-TIMEOUT"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        time.sleep(3600)
        raise AssertionError("unreachable")
