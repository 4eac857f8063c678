"""Exact page pitch: the strides the contract fixes, computed from the specs' fields by the kit.

Memory safety leaves strides free as long as pages stay apart.  Some are not
free: the step from one page of a layer to the next one a kernel addresses
is fixed by the layout and the layer's (padded, aligned) page
(contract.md#page-pitch):

- ``LBHNC``/``LBNHC`` (layer-outer, block-compact): the block stride is the
  layer's page, padding included, rounded up to its ``block_stride_alignment``;
  when populated groups disagree on that, every layer's is the largest page
  rounded up to every alignment (groups overlay one another's slots);
- ``BLHNC``/``BLNHC`` (block-outermost): consecutive layers of a tensor are
  one padded page apart (the block stride, ``bytes_per_block``, is
  ``KV-PLACE-BLOCK-STRIDE``'s);
- ``LHBNC``: blocks of one head are ``S * C`` apart (the layout cannot pad);
- ``BHLNC``: layers of one head are ``S * C`` apart.

A stride is judged only where it is used: the block stride with two or more
blocks, the layer stride with two or more layers in the tensor.  The page is
computed here from the spec's fields (the MLA ``alignment`` padding included),
never read from the spec's own page properties.
"""

from __future__ import annotations

import math
from fractions import Fraction

from conformance.check.catalog import invariant
from conformance.check.catalog import violation as _v
from conformance.check.violations import Violation
from conformance.run.observations import PlacementObservation
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import AttentionSpec, KVCacheSpec, MambaSpec, MultipleOf, UniformTypeKVCacheSpecs

__all__ = ["Page", "layer_page", "pitch_findings"]


class Page:
    """A layer's page as the contract defines it: ``H`` heads of ``S`` states of ``C`` bytes.

    Attributes:
        heads, states, content: ``H``, ``S`` and ``C``.
        padded: the padded page, or ``None``.
    """

    __slots__ = ("content", "heads", "padded", "states")

    def __init__(self, heads: int, states: int, content: int, padded: int | None) -> None:
        self.heads, self.states, self.content, self.padded = heads, states, content, padded

    @property
    def dense(self) -> int:
        """``H * S * C``: the bytes a kernel reads."""
        return self.heads * self.states * self.content

    @property
    def size(self) -> int:
        """The page a block holds: the padded page when set, else the dense page."""
        return self.padded if self.padded is not None else self.dense


def _itemsize(dtype: object) -> int:
    import torch

    assert isinstance(dtype, torch.dtype)
    return torch.empty((), dtype=dtype).element_size()


def _attention_page(spec: AttentionSpec, block_size: int) -> Page:
    heads = spec.num_head_slots if spec.num_head_slots is not None else spec.num_kv_heads
    tps = spec.tokens_per_state
    states = int(Fraction(block_size) // Fraction(tps)) if tps > 0 else 1
    if spec.state_content_bytes is not None:
        content = spec.state_content_bytes
    else:
        content = (spec.head_size + (spec.head_size_v or 0)) * _itemsize(spec.dtype)
    padded = spec.page_size_padded
    alignment = getattr(spec, "alignment", None)
    if alignment:
        # MLA kinds pad an unaligned page to their alignment (contract.md#spec-kinds).
        dense = heads * states * content
        rounded = -(-dense // alignment) * alignment
        if rounded != dense:
            padded = rounded
    return Page(heads, states, content, padded)


def layer_page(spec: KVCacheSpec, block_size: int | None = None) -> Page | None:
    """The page of ``spec`` at ``block_size`` tokens (default: its own); ``None``: no views."""
    bs = spec.block_size if block_size is None else block_size
    if isinstance(spec, AttentionSpec):
        return _attention_page(spec, bs)
    if isinstance(spec, MambaSpec):
        content = sum(
            math.prod(shape) * _itemsize(dtype)
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
        )
        return Page(1, 1, content, spec.page_size_padded)
    return None  # raw pages without layer views (HiSparse) have no pitch to judge


def _alignment(spec: KVCacheSpec) -> int | None:
    """Byte alignment of the block stride (contract.md#spec-fields), from the spec's fields."""
    align = spec.block_stride_alignment
    if align is None:
        return 1
    if isinstance(align, int):
        return align
    assert isinstance(align, MultipleOf)
    kernel = math.gcd(align.n, spec.block_size)
    if kernel == spec.block_size:
        return 1
    page = layer_page(spec, kernel)
    return None if page is None else page.size


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _common_pitch(config: KVCacheConfig) -> int | None:
    """The one block stride of every layer when populated device groups disagree on theirs.

    Layer-outer groups overlay the same slots, so when two of them step blocks
    differently, different block IDs alias; the contract then gives every layer
    ``round_up(largest page, lcm of every alignment)`` (contract.md#page-pitch).
    ``None`` when the layers' own pitches apply.
    """
    pages: list[int] = []
    aligns: list[int] = []
    pitches: set[int] = set()
    populated = 0
    for group in config.kv_cache_groups:
        if group.host_resident or not group.layer_names:
            continue
        populated += 1
        for name in group.layer_names:
            spec = _named_spec(group.kv_cache_spec, name)
            page = None if spec is None else layer_page(spec)
            align = None if spec is None else _alignment(spec)
            if page is None or align is None:
                return None
            pages.append(page.size)
            aligns.append(align)
            pitches.add(_round_up(page.size, align))
    if populated <= 1 or len(pitches) <= 1:
        return None
    return _round_up(max(pages), math.lcm(*aligns))


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
        return "block_stride", common if common is not None else _round_up(page.size, align)
    fixed = {
        "BLHNC": ("layer_stride", page.size),
        "BLNHC": ("layer_stride", page.size),
        "LHBNC": ("block_stride", page.states * page.content),
        "BHLNC": ("layer_stride", page.states * page.content),
    }
    return fixed.get(layout)


def _spec_of(config: KVCacheConfig, tensor: KVCacheTensor) -> KVCacheSpec | None:
    name = tensor.layers[0]
    for group in config.kv_cache_groups:
        if name in group.layer_names:
            spec = group.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                return spec.kv_cache_specs.get(name)
            return spec
    return None


def pitch_findings(config: KVCacheConfig, layout: str, limit: int = 3) -> list[str]:
    """Device tensors whose fixed stride differs from the contract's (one line each)."""
    out = []
    common = _common_pitch(config) if layout in ("LBHNC", "LBNHC") else None
    for i, t in enumerate(config.kv_cache_tensors):
        if t.host_resident or not t.layers:
            continue
        spec = _spec_of(config, t)
        expected = None if spec is None else _expected(spec, layout, common)
        if expected is None:
            continue
        which, value = expected
        used = config.num_blocks >= 2 if which == "block_stride" else len(t.layers) >= 2
        actual = getattr(t, which)
        if used and actual != value:
            out.append(
                f"tensor {i} ({t.layers[0]!r}...) has {which}={actual}; in {layout} the "
                f"contract fixes it at {value} bytes for this layer's page"
            )
            if len(out) >= limit:
                break
    return out


@invariant(
    "KV-PLACE-PAGE-PITCH",
    "strides that address a layer's pages are the ones its layout and padded page fix",
    anchor="page-pitch",
    scenario="placement",
    in_core=True,
)
def _page_pitch(obs: PlacementObservation) -> list[Violation] | None:
    configs = {n: obs.config_at(n) for n in obs.results}
    honest = {n: c for n, c in configs.items() if c is not None and c.num_blocks == n}
    if not honest:
        return None
    layout = obs.layout.name
    for n, c in sorted(honest.items()):
        found = pitch_findings(c, layout)
        if found:
            return [_v("KV-PLACE-PAGE-PITCH", f"at {n} blocks {line}") for line in found]
    return []
