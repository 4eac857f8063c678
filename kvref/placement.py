"""Default placement of KV cache groups for an exact number of blocks.

See contract.md#default-placement.

Groups alias one backing allocation from byte 0: a block ID is held by one
group at a time, so the same bytes serve every group (contract.md#memory-safety).  Host-resident
groups get their own host backing, laid out in LBNHC with their own block count.

Deliberate differences from vLLM 0.33.0 (contract.md#deliberate-differences):

* the returned config always has exactly the requested ``num_blocks``
  (vLLM's default returns ``num_gpu_blocks_override`` when it is set);
* in layer-outer layouts with several groups whose aligned page strides
  differ, every layer uses one common block stride, so different block IDs
  never alias (vLLM lets them, contract.md#memory-safety);
* a uniform-type group only places the layers it names (vLLM 0.33.0 places
  every layer of its wrapper, which breaks on PP workers,
  contract.md#memory-safety; vLLM 0.34.0 fixed it, issue 54711).

Under vLLM 0.34.0's rules (``config.rules``) a group's layers are bucketed in
``layer_names`` order, and a block-outermost block is aligned to the layers
the worker holds only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

from kvref._math import lcm_all, round_up
from kvref.axes import HOST_LAYOUT
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    HiSparseError,
    LayoutError,
    PlacementError,
)
from kvref.extra_specs import HiSparseHotSpec, HiSparseResidentSpec
from kvref.hisparse import host_pool_layout
from kvref.layout import KVCacheLayout, compute_layout_strides
from kvref.partition import check_group_spec_fields, disjoint_group_layers
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs
from kvref.versions import Rules

__all__ = [
    "bytes_per_block",
    "get_kv_cache_config_from_groups",
    "host_bytes_per_block",
    "pool_bytes_per_block",
    "validate_kv_cache_layout",
]


def _layer_stride1(spec: KVCacheSpec) -> int:
    # round_up(page, alignment), memoised on the frozen spec.
    return spec.block_stride


def _spec_buckets(
    group: KVCacheGroupSpec, by_names: bool = False
) -> Iterator[tuple[KVCacheSpec, list[str]]]:
    """The group's layers bucketed by equal per-layer spec, in order of first appearance.

    A uniform-type group walks its wrapper (as vLLM 0.33.0 does), or with
    ``by_names`` its ``layer_names`` (vLLM 0.34.0), so layers of one spec
    become contiguous even when interleaved; only the layers the group names
    are placed.
    """
    spec = group.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        if group.layer_names:
            yield spec, list(group.layer_names)
        return
    named = set(group.layer_names)
    missing = named - set(spec.kv_cache_specs)
    if missing:
        raise PlacementError(
            f"layers {sorted(missing)} of a group have no spec in its UniformTypeKVCacheSpecs"
        )
    buckets: dict[KVCacheSpec, list[str]] = {}
    if by_names:
        for name in group.layer_names:
            buckets.setdefault(spec.kv_cache_specs[name], []).append(name)
    else:
        for name, layer_spec in spec.kv_cache_specs.items():
            if name in named:
                buckets.setdefault(layer_spec, []).append(name)
    yield from buckets.items()


def _layer_specs(group: KVCacheGroupSpec) -> Iterator[KVCacheSpec]:
    for spec, names in _spec_buckets(group):
        for _ in names:
            yield spec


def _stride_rule(
    groups: Sequence[KVCacheGroupSpec], layout: KVCacheLayout
) -> Callable[[KVCacheSpec], int]:
    """Per-layer block stride of a layer-outer layout.

    vLLM uses ``round_up(page, alignment)`` per layer.  When several groups
    (which share one page size in layer-outer layouts, contract.md#default-placement) disagree on
    that stride, the slots of one group stop lining up with another's and
    different block IDs alias; the reference then gives every layer one
    common stride that satisfies every alignment.
    """
    specs = [s for g in groups for s in _layer_specs(g)]
    populated = sum(1 for g in groups if g.layer_names)
    strides = {_layer_stride1(s) for s in specs}
    if layout.is_block_outermost or populated <= 1 or len(strides) <= 1:
        return _layer_stride1
    common = round_up(
        max(s.page_size_bytes for s in specs),
        lcm_all(s.get_block_stride_alignment() for s in specs),
    )
    return lambda _spec: common


def bytes_per_block(
    groups: Sequence[KVCacheGroupSpec], layout: KVCacheLayout, rules: Rules | None = None
) -> int:
    """Bytes one block ID takes across all layers of ``groups`` in ``layout``.

    See contract.md#default-placement.

    Layer-outer: the widest group's sum of aligned strides.  Block-outermost:
    the widest group's sum of pages, rounded up to every layer's alignment
    and every HiSparse hot group's page; under
    ``rules.block_alignment_from_layers`` (vLLM 0.34.0, the default without
    ``rules``) only hot groups with a layer in ``groups`` count.
    """
    if layout.is_block_outermost:
        raw = max((sum(s.page_size_bytes for s in _layer_specs(g)) for g in groups), default=0)
        alignment = lcm_all(s.get_block_stride_alignment() for g in groups for s in _layer_specs(g))
        # A HiSparse hot page must tile the block (vLLM counts every hot group,
        # even one with no layer on this worker).
        from_layers = rules is None or rules.block_alignment_from_layers
        hot = lcm_all(
            g.kv_cache_spec.page_size_bytes
            for g in groups
            if isinstance(g.kv_cache_spec, HiSparseHotSpec) and (g.layer_names or not from_layers)
        )
        return round_up(raw, math.lcm(alignment, hot))
    stride = _stride_rule(groups, layout)
    return max((sum(stride(s) for s in _layer_specs(g)) for g in groups), default=0)


def pool_bytes_per_block(config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]) -> int:
    """Device bytes per block: :func:`bytes_per_block` over the non-host groups."""
    device = [g for g in groups if not g.host_resident]
    return bytes_per_block(device, config.kv_cache_layout, config.rules)


def host_bytes_per_block(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Host bytes per host block: :func:`bytes_per_block` of the host groups in LBNHC."""
    host = [g for g in groups if g.host_resident]
    return bytes_per_block(host, HOST_LAYOUT)


def validate_kv_cache_layout(groups: Sequence[KVCacheGroupSpec], layout: KVCacheLayout) -> None:
    """Check that ``layout`` can express the groups' page sizes (contract.md#default-placement).

    Raises:
        LayoutError: mixed page sizes in a layout that is not block-compact, or
            in a layer-compact layout with more than one group.
    """
    pages = {s.page_size_bytes for g in groups for s in _layer_specs(g)}
    if len(pages) <= 1:
        return
    if layout.is_block_compact and not (len(groups) > 1 and layout.is_layer_compact):
        return
    raise LayoutError(
        f"layout {layout.name} cannot express this model's mixed page sizes "
        f"{sorted(pages)} across {len(groups)} groups; declare a block-outermost layout "
        "(e.g. BLHNC) or set VLLM_KV_CACHE_LAYOUT=BLHNC"
    )


def _check_groups(groups: object) -> list[KVCacheGroupSpec]:
    if not isinstance(groups, (list, tuple)):
        raise PlacementError(f"kv_cache_groups={groups!r} must be a list of KVCacheGroupSpec")
    # Walking the layers is the check; this caller needs no names from it.
    for _ in disjoint_group_layers(
        groups,
        lambda i, group: PlacementError(
            f"kv_cache_groups[{i}]={group!r} is not a KVCacheGroupSpec"
        ),
    ):
        pass
    return list(groups)


def _place(
    groups: Sequence[KVCacheGroupSpec],
    layout: KVCacheLayout,
    num_blocks: int,
    rules: Rules,
    *,
    host_resident: bool,
) -> list[KVCacheTensor]:
    """Emit the tensors of ``groups`` in ``layout`` for ``num_blocks`` blocks.

    contract.md#default-placement.
    """
    validate_kv_cache_layout(groups, layout)
    bpb = bytes_per_block(groups, layout, rules)
    size = bpb * num_blocks
    fixed_block_stride = bpb if layout.is_block_outermost else None
    stride = _stride_rule(groups, layout)
    tensors: list[KVCacheTensor] = []
    for group in groups:
        offset = 0
        for spec, names in _spec_buckets(group, rules.placement_walks_layer_specs):
            block_stride = fixed_block_stride
            if not layout.is_block_outermost and stride(spec) != spec.page_size_bytes:
                if not layout.is_block_compact:
                    raise LayoutError(
                        f"layout {layout.name} cannot pad pages: layers {names[:3]} need a "
                        f"block stride of {stride(spec)} bytes for a page of "
                        f"{spec.page_size_bytes} bytes; use a block-compact layout"
                    )
                block_stride = stride(spec)
            layer_stride, block_stride_out, *_ = compute_layout_strides(
                spec, num_blocks, len(names), layout, fixed=(None, block_stride, None, None, None)
            )
            tensors.append(
                KVCacheTensor(
                    size=size,
                    layers=names,
                    layer_stride=layer_stride,
                    block_stride=block_stride_out,
                    offset=offset,
                    host_resident=host_resident,
                )
            )
            step = spec.page_size_bytes if layout.is_block_outermost else layer_stride
            offset += len(names) * step
    return tensors


def get_kv_cache_config_from_groups(
    config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> KVCacheConfig:
    """Place ``kv_cache_groups`` into tensors for exactly ``num_blocks`` device blocks.

    See contract.md#default-placement.

    An empty group list gives one block and no tensors (the block pool's null
    block).  Host-resident groups are placed in their own host backing of
    ``config.host_pool_bytes // host_bytes_per_block`` blocks, before the
    device tensors.  With HiSparse on, the host pool is HiSparse's
    (:func:`kvref.hisparse.host_pool_layout`) and the device layout must be
    block-outermost.

    Raises:
        ConfigError: ``num_blocks`` is not a positive int, or host groups have no host pool.
        PartitionError: a layer is in two groups.
        LayoutError: the layout cannot express the groups.
        PlacementError: a group is malformed.
        HiSparseError: HiSparse is on and its host pool or layout requirement fails.
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ConfigError(f"num_blocks={num_blocks!r} must be an int >= 1")
    groups = _check_groups(kv_cache_groups)
    check_group_spec_fields(groups, config.rules)
    if not groups:
        return KVCacheConfig(
            num_blocks=1,
            kv_cache_tensors=[],
            kv_cache_groups=[],
            prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        )
    if config.hisparse is not None:
        return _place_hisparse(config, groups, num_blocks)
    device = [g for g in groups if not g.host_resident]
    host = [g for g in groups if g.host_resident]
    tensors: list[KVCacheTensor] = []
    host_num_blocks: int | None = None
    if host:
        host_bpb = host_bytes_per_block(host)
        if config.host_pool_bytes is None:
            raise ConfigError(
                "PlanningConfig.host_pool_bytes=None: host-resident groups need a host pool"
            )
        host_num_blocks = config.host_pool_bytes // host_bpb if host_bpb else 0
        if host_bpb and host_num_blocks < 1:
            raise ConfigError(
                f"PlanningConfig.host_pool_bytes={config.host_pool_bytes} holds no host block "
                f"of {host_bpb} bytes"
            )
        tensors += _place(
            host, HOST_LAYOUT, max(host_num_blocks, 1), config.rules, host_resident=True
        )
    tensors += _place(device, config.kv_cache_layout, num_blocks, config.rules, host_resident=False)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups,
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        host_num_blocks=host_num_blocks,
    )


def _place_hisparse(
    config: PlanningConfig, groups: Sequence[KVCacheGroupSpec], num_blocks: int
) -> KVCacheConfig:
    """HiSparse's placement (vLLM ``get_hisparse_kv_cache_config``): host pool, then device.

    The source group goes to the host pool in LBNHC; the device groups
    (indexer, resident, hot and the rest) share the device backing, whose
    layout must be block-outermost because resident and hot pages have no
    per-layer views.  Groups stay in the order given.
    """
    pool = host_pool_layout(config, groups)
    layout = config.kv_cache_layout
    device = [g for g in groups if not g.host_resident]
    validate_kv_cache_layout(device, layout)
    raw = [
        name
        for g in device
        for spec, names in _spec_buckets(g)
        if isinstance(spec, (HiSparseHotSpec, HiSparseResidentSpec))
        for name in names
    ]
    if raw and not layout.is_block_outermost:
        raise HiSparseError(
            f"PlanningConfig.kv_cache_layout={layout.name}: HiSparse requires a "
            f"block-outermost KV layout (BLHNC, BLNHC or BHLNC) for its resident and hot "
            f"layers {raw[:4]}"
        )
    tensors = _place(
        [pool.source_group], HOST_LAYOUT, pool.host_num_blocks, config.rules, host_resident=True
    )
    tensors += _place(device, layout, num_blocks, config.rules, host_resident=False)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=list(groups),
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        host_num_blocks=pool.host_num_blocks,
        host_block_stride=pool.host_block_stride,
        shared_host_pool=pool.shared_host_pool,
    )
