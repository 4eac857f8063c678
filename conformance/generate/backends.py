"""Attention backends whose kernels take blocks smaller than the cache block.

vLLM's worker splits a cache block into kernel blocks when a group's
backends do not take the block size itself (kvref.kernel_blocks), so a
plan is read through views of ``block_size // k`` kernel blocks per block.
Problems describe such backends in ``PlanningConfig.attention_backends``
so that the kit judges plans as the worker would read them
(contract.md#kernel-views).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from hypothesis import strategies as st

from conformance.generate.specs import KERNEL_BLOCK_SIZES
from kvref.backends import AttentionBackend
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout, compute_layer_kv_cache_shape_bytes
from kvref.specs import AttentionSpec, EncoderOnlyAttentionSpec, KVCacheSpec, MambaSpec

__all__ = ["kernel_backends", "kernel_block_choices"]

#: Layouts that step heads outside blocks: vLLM refuses to split their blocks
#: whenever a page has several heads, so no deployment describes such backends there.
_HEAD_OUTER = frozenset({KVCacheLayout.LHBNC, KVCacheLayout.BHLNC})


def _splittable(spec: KVCacheSpec) -> bool:
    return (
        isinstance(spec, AttentionSpec)
        and not isinstance(spec, (EncoderOnlyAttentionSpec, MambaSpec))
        and getattr(spec, "has_layer_views", True)
    )


def kernel_block_choices(specs: Mapping[str, KVCacheSpec]) -> list[int]:
    """Kernel block sizes below every split layer's block size that each of them can take.

    A size must divide every attention block size (page unification only
    scales block sizes up by whole factors, so it keeps dividing) and hold
    whole states of every such spec.
    """
    attention = [s for s in specs.values() if _splittable(s)]
    if not attention:
        return []
    common = math.gcd(*(s.block_size for s in attention))
    out: list[int] = []
    for k in KERNEL_BLOCK_SIZES:
        if k >= common or common % k:
            continue
        try:
            for spec in attention:
                compute_layer_kv_cache_shape_bytes(spec, 1, k)
                if spec.get_num_kernel_states(k) * (spec.block_size // k) != (
                    spec.get_num_kernel_states(spec.block_size)
                ):
                    raise ValueError("kernel blocks would split a state")
        except (KVRefError, ValueError, ZeroDivisionError):
            continue
        out.append(k)
    return out


def draw_kernel_backends(
    draw: st.DrawFn, specs: Mapping[str, KVCacheSpec], layout: KVCacheLayout
) -> tuple[AttentionBackend, ...]:
    """One draw of :func:`kernel_backends`, made with the caller's ``draw``."""
    choices = kernel_block_choices(specs)
    # Drawn for three problems in four; 0 (the shrink target) draws none.
    if not choices or layout in _HEAD_OUTER or draw(st.integers(0, 3)) == 0:
        return ()
    sizes = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=2, unique=True))
    # One backend for every layer: exact sizes only, since MultipleOf(k) of a
    # divisor also takes the cache block and asks for no split.
    return (
        AttentionBackend(
            name=f"paged-{'-'.join(map(str, sizes))}", supported_kernel_block_sizes=tuple(sizes)
        ),
    )


_kernel_backends = st.composite(draw_kernel_backends)


def kernel_backends(
    specs: Mapping[str, KVCacheSpec], layout: KVCacheLayout
) -> st.SearchStrategy[tuple[AttentionBackend, ...]]:
    """``()`` (shrinks to it) or one backend whose kernels take only blocks below the cache block.

    Drawn for three in four problems whose attention specs allow a kernel block
    of :data:`~conformance.generate.specs.KERNEL_BLOCK_SIZES` below their
    block size (:func:`kernel_block_choices`); never in a head-outer
    layout, where the worker cannot split a block of several heads.  The
    backend supports any layout, so the drawn layout stays as it is.
    """
    return _kernel_backends(specs, layout)
