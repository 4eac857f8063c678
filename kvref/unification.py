"""Making specs fit one grouping rule: promotion and page-size unification.

See contract.md#hybrid-manager-disabled and contract.md#page-unification.

Also the uniform test (3.1 step 4) and the full-allocation fallback (3.5),
which both build on promotion.  Nothing here mutates its input: every
function returns a new ``dict`` (vLLM updates the caller's dict in place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kvref.errors import (
    ConflictingWindowError,
    GroupingError,
    IncompatibleSpecsError,
    PageSizeUnificationError,
)
from kvref.extra_specs import HiddenStateCacheSpec
from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    evolve_spec,
)
from kvref.versions import Rules

__all__ = [
    "is_kv_cache_spec_uniform",
    "promote_local_kv_cache_specs",
    "try_get_full_allocation_fallback_groups",
    "unify_hybrid_kv_cache_specs",
    "unify_kv_cache_spec_page_size",
]

#: How many layer names an error message lists before it says "and N more".
_MAX_NAMES = 6


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_NAMES])
    extra = len(names) - _MAX_NAMES
    return f"[{shown}{f', and {extra} more' if extra > 0 else ''}]"


def is_kv_cache_spec_uniform(specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> bool:
    """Whether ``type(first).merge(specs, rules)`` succeeds (vLLM ``is_kv_cache_spec_uniform``).

    An empty sequence is uniform.  Only :class:`IncompatibleSpecsError` means
    "not uniform".  ``rules``: the release's merge rules (``None``: the newest).

    Raises:
        ConflictingWindowError: full-attention specs carry two different windows
            or chunk sizes; vLLM's ``ValueError`` escapes this test too.

    """
    if not specs:
        return True
    try:
        type(specs[0]).merge(specs, rules)
    except IncompatibleSpecsError:
        return False
    return True


def _uniform_or_uniform_type(specs: Mapping[str, KVCacheSpec], rules: Rules | None) -> bool:
    values = list(specs.values())
    return is_kv_cache_spec_uniform(values, rules) or UniformTypeKVCacheSpecs.is_uniform_type(
        values
    )


# Local kinds and their full counterparts, most specific first: a subclass of
# SlidingWindowMLASpec must become MLA, not plain full attention.
_PROMOTIONS: tuple[tuple[type[AttentionSpec], type[FullAttentionSpec]], ...] = (
    (SlidingWindowMLASpec, MLAAttentionSpec),
    (SlidingWindowSpec, FullAttentionSpec),
    (ChunkedLocalAttentionSpec, FullAttentionSpec),
)


def _promotion_target(spec: KVCacheSpec) -> type[FullAttentionSpec] | None:
    for cls in type(spec).__mro__:
        for local, full in _PROMOTIONS:
            if cls is local:
                return full
    return None


def _promote(spec: AttentionSpec, target: type[FullAttentionSpec], block_size: int) -> KVCacheSpec:
    # Every field the target also has is carried over (the window or chunk
    # included, so compute keeps it); extra_retained_tokens is dropped because
    # a promoted layer never frees blocks below its window.
    fields: dict[str, Any] = {
        a.name: getattr(spec, a.name)
        for a in attrs.fields(target)
        if a.init and a.name != "extra_retained_tokens" and hasattr(spec, a.name)
    }
    fields["block_size"] = block_size
    padded = spec.page_size_padded
    if padded is not None:
        # contract.md#hybrid-manager-disabled: max(old padded, unpadded page scaled to the new block
        # size).
        padded = max(padded, spec.real_page_size_bytes * block_size // spec.block_size)
    fields["page_size_padded"] = padded
    return target(**fields)


def _promotion_failure(specs: Mapping[str, KVCacheSpec], cause: Exception | None) -> GroupingError:
    by_kind: dict[str, list[str]] = {}
    windows: set[int] = set()
    for name, spec in specs.items():
        window = getattr(spec, "sliding_window", None)
        label = type(spec).__name__ + (f"(sliding_window={window})" if window else "")
        if isinstance(window, int):
            windows.add(window)
        by_kind.setdefault(label, []).append(name)
    kinds = "; ".join(f"{label}: {_names(names)}" for label, names in by_kind.items())
    hint = ""
    if len(windows) > 1:
        hint = (
            f" Sliding windows {sorted(windows)} differ: every layer of the single "
            "group must have the same window size."
        )
    detail = f" ({cause})" if cause is not None else ""
    return GroupingError(
        "Failed to promote local KV cache specs to one unified type with the hybrid KV "
        f"cache manager disabled; layers by kind: {kinds}.{hint}{detail}"
    )


def promote_local_kv_cache_specs(
    specs: Mapping[str, KVCacheSpec], rules: Rules | None = None
) -> dict[str, KVCacheSpec]:
    """Allocate local attention as full attention (vLLM ``_promote_local_kv_cache_specs``).

    Specs that are already uniform or of one type come back unchanged.  With a
    full-attention layer and a sliding-window or chunked-local layer present,
    every local spec becomes its full counterpart with the full layers' block
    size (contract.md#hybrid-manager-disabled).  Returns a new dict in the input order.
    A sliding-window MLA spec becomes MLA without ``bounded_replay``, which MLA
    lacks (vLLM 0.34.0 drops it too; 0.33.0 fails with a ``TypeError``).
    ``rules``: the release's merge rules (``None``: the newest).

    Raises:
        GroupingError: the result is neither uniform nor of one type (for
            example Mamba next to full attention, or two different windows);
            the message names the layers by kind and the windows.

    """
    promoted = dict(specs)
    try:
        if _uniform_or_uniform_type(promoted, rules):
            return promoted
    except ConflictingWindowError as exc:
        raise _promotion_failure(specs, exc) from exc

    values = list(specs.values())
    has_full = any(isinstance(s, FullAttentionSpec) for s in values)
    has_local = any(isinstance(s, (SlidingWindowSpec, ChunkedLocalAttentionSpec)) for s in values)
    if has_full and has_local:
        full_block_sizes = {s.block_size for s in values if isinstance(s, FullAttentionSpec)}
        full_block_size = next(iter(full_block_sizes)) if len(full_block_sizes) == 1 else None
        # Keyed by (spec, is_draft) because is_draft is outside spec equality
        # and must survive promotion.
        cache: dict[tuple[KVCacheSpec, bool], KVCacheSpec] = {}
        for name, spec in specs.items():
            target = _promotion_target(spec)
            if target is None or not isinstance(spec, AttentionSpec):
                continue
            key = (spec, spec.is_draft)
            if key not in cache:
                cache[key] = _promote(spec, target, full_block_size or spec.block_size)
            promoted[name] = cache[key]

    try:
        ok = _uniform_or_uniform_type(promoted, rules)
    except ConflictingWindowError as exc:
        raise _promotion_failure(promoted, exc) from exc
    if not ok:
        raise _promotion_failure(promoted, None)
    return promoted


def unify_hybrid_kv_cache_specs(
    specs: Mapping[str, KVCacheSpec], rules: Rules | None = None
) -> dict[str, KVCacheSpec]:
    """Promote local attention for a disabled hybrid manager (contract.md#hybrid-manager-disabled).

    DCP-replicated attention (``dcp_sharded=False``: draft layers, rings) and
    everything else are promoted separately, so that a replicated draft never
    needs the sharded target's block size.  Returns a new dict in input order.

    Raises:
        GroupingError: a partition cannot be unified (see
            :func:`promote_local_kv_cache_specs`).

    """
    replicated: dict[str, KVCacheSpec] = {}
    sharded: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if isinstance(spec, AttentionSpec) and not spec.dcp_sharded:
            replicated[name] = spec
        else:
            sharded[name] = spec
    result = dict(specs)
    for part in (sharded, replicated):
        if part:
            result.update(promote_local_kv_cache_specs(part, rules))
    return result


def unify_kv_cache_spec_page_size(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Bring every page up to the largest page ``P`` (vLLM ``unify_kv_cache_spec_page_size``).

    Mamba pages are padded to ``P``; other pages dividing ``P`` scale their
    block size; non-MLA attention pages that do not divide ``P`` are padded.
    MLA alignment padding is recomputed for the new block size rather than
    carried over stale (contract.md#spec-kinds).  Returns a new dict in input order.

    Raises:
        PageSizeUnificationError: a page neither divides ``P`` nor can be
            padded (MLA or a non-attention spec); grouping then tries the
            full-allocation fallback.
        GroupingError: a scaled page does not come out at ``P`` (an already
            padded spec cannot be scaled); vLLM fails an assertion here.

    """
    page_sizes = {s.page_size_bytes for s in specs.values()}
    if len(page_sizes) <= 1:
        return dict(specs)
    target = max(page_sizes)
    result: dict[str, KVCacheSpec] = {}
    # Layers repeat a handful of specs; the key keeps is_draft, which equality ignores.
    cache: dict[tuple[KVCacheSpec, bool], KVCacheSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == target:
            result[name] = spec
            continue
        key = (spec, spec.is_draft)
        if key not in cache:
            cache[key] = _unify_one(name, spec, page, target)
        result[name] = cache[key]
    return result


def _unify_one(name: str, spec: KVCacheSpec, page: int, target: int) -> KVCacheSpec:
    if isinstance(spec, MambaSpec):
        new: KVCacheSpec = evolve_spec(spec, page_size_padded=target)
    elif target % page == 0:
        ratio = target // page
        explicit_padding = (
            spec.padded_page_size is not None and getattr(spec, "alignment", None) is None
        )
        if explicit_padding:
            raise GroupingError(
                f"Layer {name!r}: cannot scale block_size {spec.block_size} by {ratio} to "
                f"reach the largest page of {target} bytes because the spec is already "
                f"padded (page_size_padded={spec.padded_page_size}); a padded page does "
                "not scale with the block size"
            )
        new = evolve_spec(spec, block_size=spec.block_size * ratio)
    elif isinstance(spec, AttentionSpec) and not isinstance(spec, MLAAttentionSpec):
        new = evolve_spec(spec, page_size_padded=target)
    else:
        raise PageSizeUnificationError(
            f"Layer {name!r} ({type(spec).__name__}): page size {page} is not divisible by "
            f"the maximum page size {target} and cannot be padded; padding is only "
            "supported for Mamba and non-MLA attention layers"
        )
    if new.page_size_bytes != target:
        raise GroupingError(
            f"Layer {name!r} ({type(spec).__name__}): page size {page} became "
            f"{new.page_size_bytes} bytes, not the largest page of {target} bytes"
        )
    return new


def try_get_full_allocation_fallback_groups(
    specs: Mapping[str, KVCacheSpec], rules: Rules | None = None
) -> list[KVCacheGroupSpec] | None:
    """One uniform-type group for MLA next to a sliding-window draft, or ``None``.

    See contract.md#full-allocation-fallback.

    Applies only without hidden-state and chunked-local layers and with at least
    one MLA and one sliding-window layer; the sliding-window layers are then
    allocated as full attention (their compute keeps the window).  Sliding-window
    MLA layers count as sliding window under
    ``rules.fallback_covers_sliding_window_mla`` (vLLM 0.34.0, the default
    without ``rules``); before, any of them ruled the fallback out.
    """
    values = list(specs.values())
    excluded: tuple[type[KVCacheSpec], ...] = (ChunkedLocalAttentionSpec, HiddenStateCacheSpec)
    if rules is not None and not rules.fallback_covers_sliding_window_mla:
        excluded += (SlidingWindowMLASpec,)
    if any(isinstance(s, excluded) for s in values):
        return None
    has_mla = any(isinstance(s, MLAAttentionSpec) for s in values)
    has_sliding_window = any(isinstance(s, SlidingWindowSpec) for s in values)
    if not (has_mla and has_sliding_window):
        return None
    try:
        promoted = promote_local_kv_cache_specs(specs, rules)
    except (GroupingError, ConflictingWindowError):
        return None
    uniform = UniformTypeKVCacheSpecs.from_specs(promoted)
    if uniform is None:
        return None
    return [KVCacheGroupSpec(layer_names=tuple(promoted), kv_cache_spec=uniform)]
