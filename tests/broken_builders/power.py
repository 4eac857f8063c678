"""Broken builders of bugs the kit was once blind to.

tests/kit/check/test_power.py measures each class.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from broken_builders._base import (
    Groups,
    Specs,
    _Base,
    _change_tensors,
    _Grouping,
    _layer_specs,
    _LayerSpecs,
    _on_device,
    _on_host,
    _Placement,
    _with_tensors,
    member_of,
)
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
)
from kvref.specs import KVCacheSpec

# -- bugs the kit was blind to (tests/kit/check/test_power.py measures each class) ----------


@member_of("power")
class RaisesOnEmptyGroup(_Base):
    """Reads every group's first layer: a group Core projects to no layer of a worker raises.

    Class 1 (Core-only placement paths): global groups always hold layers, so
    only groups projected to a pipeline stage that has none of their layers
    reach the bug.
    """

    CAUGHT_BY = "KV-CALL-RAISES"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        for group in kv_cache_groups:
            group.layer_spec(group.layer_names[0])  # IndexError on a projected empty group
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)


@member_of("all", "power")
class DeviceAfterHost(_Placement):
    """Starts the device tensors after the host bytes of a block, as if both shared one pool.

    Class 2: the device backing keeps its size, so its last pages spill past it.
    """

    CAUGHT_BY = "KV-HOST-DEVICE-SAFE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        blocks = result.host_num_blocks or 1
        host = sum({t.size for t in result.kv_cache_tensors if t.host_resident}) // blocks
        return _change_tensors(
            result, lambda t: attrs.evolve(t, offset=t.offset + host), _on_device
        )


@member_of("all", "power")
class HostBlocksAlias(_Placement):
    """Steps host blocks half a host page apart: neighbouring host blocks share bytes.

    Class 2: host backings stay in bounds, so only an overlap check of the host pool sees it.
    """

    CAUGHT_BY = "KV-HOST-NO-ALIAS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _change_tensors(
            result,
            lambda t: attrs.evolve(t, block_stride=max(16, t.block_stride // 32 * 16)),
            _on_host,
        )


@member_of("all", "power")
class PoolBytesCountHost(_Base):
    """Declares device plus host bytes per block to Core's pool-bytes hook.

    Class 2 (Core's host exclusions): harmless without host-resident groups.
    """

    CAUGHT_BY = "KV-PLACE-POOL-BYTES"

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        probe = super().get_kv_cache_config_from_groups(config, kv_cache_groups, 1)
        host = {t.size for t in probe.kv_cache_tensors if t.host_resident}
        device = max((t.size for t in probe.kv_cache_tensors if not t.host_resident), default=0)
        if not device:
            return None  # nothing on the device: let Core probe, as the reference does
        return int(device + sum(host) // (probe.host_num_blocks or 1))


@member_of("all", "power")
class WindowlessPromotion(_LayerSpecs):
    """Allocates sliding-window layers as full attention and forgets their window.

    Class 3: the pages are the same, but kernels now attend to every token.
    """

    CAUGHT_BY = "KV-GROUP-SPEC-MEANING"

    def respec(self, spec: KVCacheSpec) -> KVCacheSpec:
        from kvref import FullAttentionSpec, SlidingWindowSpec

        if type(spec) is not SlidingWindowSpec:
            return spec
        keep = [
            "block_size",
            "dcp_sharded",
            "block_stride_alignment",
            "is_draft",
            "num_kv_heads",
            "head_size",
            "dtype",
            "head_size_v",
            "max_tp_shards",
            "kv_quant_mode",
            "page_size_padded",
            "num_head_slots",
            "state_content_bytes",
            "tokens_per_state",
        ]
        return FullAttentionSpec(**{k: getattr(spec, k) for k in keep})


@member_of("power")
class DropsGroupAlignment(_LayerSpecs):
    """Rebuilds its group specs without the layers' ``block_stride_alignment``.

    A port that copies the head geometry into fresh group specs and forgets
    the backend's stride alignment: placement then sizes block strides from
    the group spec and steps blocks that the backend's kernels cannot
    address (contract.md#group-spec-meaning: a group spec may ask for more
    alignment, never less).  Only layers whose backend asks for one are hit.
    """

    CAUGHT_BY = "KV-GROUP-SPEC-MEANING"
    #: The strides placed from the weakened group specs are not the layers' aligned pitch.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH"})
    EXAMPLES = 50

    def respec(self, spec: KVCacheSpec) -> KVCacheSpec:
        return attrs.evolve(spec, block_stride_alignment=None)


@member_of("all", "power")
class DropsRetention(_Base):
    """Rebuilds every config without the operator's prefix-cache retention interval.

    A platform helper written before the field existed: its configs carry
    the record's default (0, only semantic checkpoints) whatever the engine
    was started with, so a deployment asking for dense checkpoints
    (``None``) or periodic ones silently gets others
    (contract.md#placement-request).
    """

    CAUGHT_BY = "KV-PLACE-RETENTION"
    EXAMPLES = 50

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        placed = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        # Every field it knows is copied; the one it predates takes the record's default.
        known = [f.name for f in attrs.fields(KVCacheConfig)]
        known.remove("prefix_cache_retention_interval")
        return KVCacheConfig(**{name: getattr(placed, name) for name in known})


@member_of("all", "power")
class SetOrderedGroups(_Grouping):
    """Orders the groups by iterating a set of their first layer names.

    Class 4: the order is fixed within one process but follows the string hash
    seed, so two processes (PYTHONHASHSEED) group one model differently.
    """

    CAUGHT_BY = "KV-GROUP-HASH-STABLE"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        order = list({g.layer_names[0] for g in groups})
        return sorted(groups, key=lambda g: order.index(g.layer_names[0]))


@member_of("all", "power")
class GuardedBlocks(_Placement):
    """Leaves a guard of aligned bytes after every page in layer-outer layouts.

    Class 5: strides stay consistent, linear and memory-safe, but a kernel
    stepping blocks by the layer's (aligned) page reads the wrong bytes.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        import math

        layer_outer = config.kv_cache_layout.name in ("LBHNC", "LBNHC")
        if not layer_outer or config.host_resident_layers or getattr(config, "hisparse", None):
            return result  # one bug: guards only where no host pool is involved
        guard = 16
        for g in result.kv_cache_groups:
            for spec in _layer_specs(g):
                guard = math.lcm(guard, spec.get_block_stride_alignment())
        tensors, used, widest = [], 0, 0
        for t in result.kv_cache_tensors:
            if t.host_resident:
                tensors.append(t)
                continue
            if t.offset == 0:
                used = 0  # every group starts at byte 0
            stride = t.block_stride + guard
            tensors.append(
                attrs.evolve(t, block_stride=stride, layer_stride=stride * num_blocks, offset=used)
            )
            used += len(t.layers) * stride * num_blocks
            widest = max(widest, used)
        return _with_tensors(
            result,
            [t if t.host_resident else attrs.evolve(t, size=widest) for t in tensors],
        )
