"""Exact page pitch: the strides the contract fixes, computed from the specs' fields by the kit.

Memory safety leaves strides free as long as pages stay apart.  Some are not
free: the step from one page of a layer to the next one a kernel addresses
is fixed by the layout and the layer's (padded, aligned) page
(contract.md#page-pitch):

- ``LBHNC``/``LBNHC`` (layer-outer, block-compact): the block stride is the
  layer's page, padding included, rounded up to its ``block_stride_alignment``;
  when populated groups that alias from the same bytes disagree on that,
  every layer of those groups steps the largest page rounded up to every
  alignment (they overlay one another's slots); a group in a region of the
  backing of its own keeps its layers' own pitches;
- ``BLHNC``/``BLNHC`` (block-outermost): consecutive layers of a tensor are
  one padded page apart (the block stride, ``bytes_per_block``, is
  ``KV-PLACE-BLOCK-STRIDE``'s);
- ``LHBNC``: blocks of one head are ``S * C`` apart (the layout cannot pad);
- ``BHLNC``: layers of one head are ``S * C`` apart.

A stride is judged only where it is used: the block stride with two or more
blocks, the layer stride with two or more layers in the tensor.  Pages and
alignments are the kit's own oracle's (:mod:`conformance.check.geometry`),
computed from the spec's fields, never read from the spec's page properties.
"""

from __future__ import annotations

import math

from conformance.check.catalog import flag
from conformance.check.footprint import tensor_footprints
from conformance.check.geometry import (
    OracleError,
    PageGeometry,
    aligned_page,
    block_stride_alignment,
    page_geometry,
    round_up,
)
from conformance.check.observations import PlacementObservation
from conformance.check.placement import (
    Configs,
    first_findings,
    honest_configs,
    placement_invariant,
)
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = ["layer_page", "pitch_findings"]


def layer_page(spec: KVCacheSpec) -> PageGeometry | None:
    """The kit's page of ``spec``; ``None`` for pages without views or without a formula.

    Raw pages without layer views (HiSparse) have no pitch to judge.
    """
    try:
        page = page_geometry(spec)
    except OracleError:
        return None
    return page if page.layer_views else None


def _alignment(spec: KVCacheSpec) -> int | None:
    """Byte alignment of the block stride (contract.md#spec-fields); ``None``: no formula."""
    try:
        return block_stride_alignment(spec)
    except OracleError:
        return None


def _alias_components(config: KVCacheConfig, layout: str) -> list[set[int]]:
    """Device groups whose tensors' byte ranges meet, joined into components.

    Two groups alias from the same bytes when the extents ``[offset, end of
    the farthest page)`` of a tensor of each intersect; a builder that gives
    every group its own region of the backing has one component per group.
    A tensor whose footprint the kit cannot lay out is taken to alias every
    group (the common stride is then judged, as for the reference).
    """
    geometries, problems = tensor_footprints(config, layout)
    groups = {
        i for i, g in enumerate(config.kv_cache_groups) if not g.host_resident and g.layer_names
    }
    if problems:
        return [groups] if groups else []
    parent = {i: i for i in groups}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    spans = sorted(
        (g.tensor.offset, g.max_end, g.group_index)
        for g in geometries
        if g.group_index in parent and g.max_end > g.tensor.offset
    )
    # Sweep by start: a span meets every earlier span that ends after it starts.
    open_end, open_group = -1, -1
    for start, end, group in spans:
        if start < open_end:
            parent[root(group)] = root(open_group)
        if end > open_end:
            open_end, open_group = end, group
    components: dict[int, set[int]] = {}
    for i in groups:
        components.setdefault(root(i), set()).add(i)
    return list(components.values())


def _common_pitches(config: KVCacheConfig, layout: str) -> dict[int, int]:
    """The one block stride of each device group that aliases groups stepping blocks otherwise.

    Layer-outer groups that overlay the same bytes must step blocks alike, or
    different block IDs alias; the contract then gives every layer of those
    groups ``round_up(largest page, lcm of every alignment)``
    (contract.md#page-pitch).  Groups in a region of their own keep their
    layers' own pitches, and are left out of the result.
    """
    out: dict[int, int] = {}
    for component in _alias_components(config, layout):
        found = _component_pitch(config, component)
        if found is None:
            return {}  # no formula for one layer: its own pitch is all there is
        common, distinct = found
        if len(component) > 1 and distinct:
            out.update(dict.fromkeys(component, common))
    return out


def _component_pitch(config: KVCacheConfig, component: set[int]) -> tuple[int, bool] | None:
    """The common stride of ``component``'s groups, and whether their own pitches differ."""
    pages: list[int] = []
    aligns: list[int] = []
    pitches: set[int] = set()
    for index in component:
        group = config.kv_cache_groups[index]
        for name in group.layer_names:
            spec = _named_spec(group.kv_cache_spec, name)
            page = None if spec is None else layer_page(spec)
            align = None if spec is None else _alignment(spec)
            if spec is None or page is None or align is None:
                return None
            pages.append(page.page)
            aligns.append(align)
            pitches.add(aligned_page(spec, align))
    if not pages:
        return None
    return round_up(max(pages), math.lcm(*aligns)), len(pitches) > 1


def _everyone_pitch(config: KVCacheConfig) -> int | None:
    """The common stride of every device group: the reference's, legal in any region."""
    groups = {
        i for i, g in enumerate(config.kv_cache_groups) if not g.host_resident and g.layer_names
    }
    found = _component_pitch(config, groups) if groups else None
    return None if found is None else found[0]


def _named_spec(spec: KVCacheSpec | UniformTypeKVCacheSpecs, name: str) -> KVCacheSpec | None:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.kv_cache_specs.get(name)
    return spec


def _expected(spec: KVCacheSpec, layout: str, common: int | None) -> tuple[str, int] | None:
    """``(which stride, bytes)`` the layout fixes for ``spec``'s tensors."""
    page = layer_page(spec)
    if page is None:
        return None
    if layout in ("LBHNC", "LBNHC"):
        align = _alignment(spec)
        if align is None:
            return None
        return "block_stride", common if common is not None else aligned_page(spec, align)
    fixed = {
        "BLHNC": ("layer_stride", page.page),
        "BLNHC": ("layer_stride", page.page),
        "LHBNC": ("block_stride", page.states * page.content),
        "BHLNC": ("layer_stride", page.states * page.content),
    }
    return fixed.get(layout)


def _spec_of(config: KVCacheConfig, tensor: KVCacheTensor) -> tuple[int, KVCacheSpec | None]:
    """``(group index, per-layer spec)`` of the tensor's first layer; ``(-1, None)``: no group."""
    name = tensor.layers[0]
    for index, group in enumerate(config.kv_cache_groups):
        if name in group.layer_names:
            return index, _named_spec(group.kv_cache_spec, name)
    return -1, None


def pitch_findings(config: KVCacheConfig, layout: str, limit: int = 3) -> list[str]:
    """Device tensors whose fixed stride differs from the contract's (one line each)."""
    out = []
    layer_outer = layout in ("LBHNC", "LBNHC")
    common = _common_pitches(config, layout) if layer_outer else {}
    # A group in a region of its own may still step the stride every group
    # would share (the reference does): that pitch is never wrong.
    everyone = _everyone_pitch(config) if layer_outer else None
    for i, t in enumerate(config.kv_cache_tensors):
        if t.host_resident or not t.layers:
            continue
        group, spec = _spec_of(config, t)
        expected = None if spec is None else _expected(spec, layout, common.get(group))
        if expected is None:
            continue
        which, value = expected
        used = config.num_blocks >= 2 if which == "block_stride" else len(t.layers) >= 2
        actual = getattr(t, which)
        if which == "block_stride" and group not in common and actual == everyone:
            continue
        if used and actual != value:
            out.append(
                f"tensor {i} ({t.layers[0]!r}...) has {which}={actual}; in {layout} the "
                f"contract fixes it at {value} bytes for this layer's page"
            )
            if len(out) >= limit:
                break
    return out


@placement_invariant(
    "KV-PLACE-PAGE-PITCH",
    "strides that address a layer's pages are the ones its layout and padded page fix",
    anchor="page-pitch",
    configs=honest_configs,
)
def _page_pitch(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    layout = obs.layout.name
    return first_findings(
        sorted(configs.items()),
        lambda n, c: [flag(f"at {n} blocks {line}") for line in pitch_findings(c, layout)],
    )
