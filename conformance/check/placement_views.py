"""Invariants of views and strides (contract.md#views-and-strides).

A worker can view every placed layer in its spec's dtype, block-outermost
tensors step one whole block per block, and block strides honour every
layer's ``block_stride_alignment``; the geometry is the kit's own
(:mod:`conformance.check.geometry`).
"""

from __future__ import annotations

from conformance.check.catalog import Unjudged, flag
from conformance.check.catalog import violation as _v
from conformance.check.geometry import (
    OracleError,
    block_stride_alignment,
    dtype_bytes,
    layout_strides,
    page_geometry,
    typed_view_misfits,
)
from conformance.check.observations import PlacementObservation
from conformance.check.placement import (
    Configs,
    device_size,
    first_findings,
    group_index,
    has_spec,
    honest_configs,
    placement_invariant,
)
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig


@placement_invariant(
    "KV-PLACE-TYPED-VIEWS",
    "offsets and strides allow views in the spec's dtype",
    anchor="views-and-strides",
)
def _typed_views(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    return first_findings(configs.items(), lambda n, c: _misfits(obs, n, c))[:3]


def _misfits(obs: PlacementObservation, n: int, c: KVCacheConfig) -> list[Violation]:
    """Tensors of ``c`` (at ``n`` blocks) the worker cannot view in their first layer's dtype."""
    out = []
    owner = group_index(c.kv_cache_groups)
    for t in c.device_tensors:
        name = t.layers[0] if t.layers else None
        if name is None or name not in owner or not has_spec(c.kv_cache_groups[owner[name]], name):
            continue
        spec = c.kv_cache_groups[owner[name]].layer_spec(name)
        try:
            page = page_geometry(spec)
            strides = layout_strides(
                spec,
                n,
                len(t.layers),
                obs.layout,
                pinned=(t.layer_stride, t.block_stride, None, None, None),
            )
        except OracleError:
            continue
        bad = typed_view_misfits(t.offset, len(t.layers), strides, page)
        if bad and page.dtype is not None:
            dtype, size = page.dtype, dtype_bytes(page.dtype)
            out.append(
                flag(
                    f"at {n} blocks {bad} are not multiples of sizeof({dtype}) = {size}, so "
                    f"the worker cannot view the tensor as {dtype}",
                    layer=name,
                )
            )
    return out


@placement_invariant(
    "KV-PLACE-BLOCK-STRIDE",
    "block-outermost tensors step one whole block per block",
    anchor="views-and-strides",
)
def _block_stride(obs: PlacementObservation, configs: Configs) -> list[Violation] | Unjudged | None:
    if not obs.layout.is_block_outermost:
        # Nothing to step over whole blocks: the rule cannot apply to this layout.
        return Unjudged("a layer-outer layout has no whole-block step", applicable=False)
    if obs.declared_pool_bytes is not None:
        return _own_backing_steps(obs, configs)
    if len(configs) < 2:
        return None
    bpb = _bytes_per_block(configs)
    if isinstance(bpb, Unjudged):
        return bpb
    out = []
    for n, c in configs.items():
        out += [
            flag(
                f"in block-outermost {obs.layout.name} every tensor must step {bpb} bytes per "
                f"block (the backing divided by {n} blocks); tensor {i} steps {t.block_stride}",
                layer=t.layers[0] if t.layers else None,
            )
            for i, t in enumerate(c.device_tensors)
            if t.block_stride != bpb
        ]
    return out[:3]


def _bytes_per_block(configs: dict[int, KVCacheConfig]) -> int | Unjudged:
    """The bytes one block adds to the one device backing, or why the answer has none.

    Several device sizes, or sizes that are not linear in the block count,
    are KV-PLACE-BACKING-SIZE's finding; they leave no whole block to step
    over, by the builder's own answer (spoiled: contract.md#verdicts).
    """
    sizes = {n: device_size(c) for n, c in configs.items()}
    if any(v is None for v in sizes.values()):
        return Unjudged("a placement has no single device backing to step over", spoiled=True)
    counts = sorted(sizes)
    low, high = counts[0], counts[-1]
    bpb = ((sizes[high] or 0) - (sizes[low] or 0)) // (high - low)
    if any(sizes[n] != bpb * n for n in counts):
        return Unjudged("the backing does not grow by one block per block", spoiled=True)
    return bpb


def _own_backing_steps(
    obs: PlacementObservation, configs: dict[int, KVCacheConfig]
) -> list[Violation] | None:
    """With several device allocations declared, each tensor steps a block of its own backing."""
    out = []
    for n, c in configs.items():
        for i, t in enumerate(c.device_tensors):
            if t.size % n:
                return None  # not a whole number of blocks: KV-PLACE-POOL-BYTES's finding
            if t.block_stride != t.size // n:
                out.append(
                    _v(
                        "KV-PLACE-BLOCK-STRIDE",
                        f"in block-outermost {obs.layout.name} tensor {i} must step its backing "
                        f"of {t.size} bytes divided by {n} blocks = {t.size // n} bytes per "
                        f"block; it steps {t.block_stride}",
                        layer=t.layers[0] if t.layers else None,
                    )
                )
    return out[:3]


@placement_invariant(
    "KV-PLACE-ALIGNMENT",
    "block strides honour every layer's block_stride_alignment",
    anchor="views-and-strides",
    configs=honest_configs,
)
def _alignment(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    return first_findings(sorted(configs.items()), _misaligned)[:3]


def _misaligned(n: int, c: KVCacheConfig) -> list[Violation]:
    """Tensors of ``c`` (at ``n`` blocks) whose block stride a layer's alignment does not divide."""
    out: list[Violation] = []
    owner = group_index(c.kv_cache_groups)
    for i, t in enumerate(c.device_tensors):
        for name in t.layers:
            group = owner.get(name)
            if group is None or not has_spec(c.kv_cache_groups[group], name):
                continue
            spec = c.kv_cache_groups[group].layer_spec(name)
            try:
                alignment = block_stride_alignment(spec)
            except OracleError:
                continue
            # Backends ask for block strides in multiples of this
            # (contract.md#views-and-strides); in block-outermost layouts only the
            # block is aligned.
            if alignment > 1 and t.block_stride % alignment:
                out.append(
                    flag(
                        f"at {n} blocks tensor {i} steps {t.block_stride} bytes per block, "
                        f"not a multiple of the layer's block_stride_alignment of "
                        f"{alignment} bytes",
                        layer=name,
                    )
                )
                break
    return out
