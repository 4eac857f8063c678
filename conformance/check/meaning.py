"""Group-spec meaning: a layer's group spec asks kernels and the pool for what the layer needs.

``KV-GROUP-LAYER-SPEC`` guards the bytes of a page.  This module guards its
meaning: the attention kind, window, chunk, sink-free restricted window,
tokens a window retains for speculative lookahead, Mamba's extra blocks and
state format, cross- versus self-attention, the head geometry and dtype a
kernel reads, and the EAGLE draft flag of a group.  Each is compared with
the layer's own spec, field by field, by the kit's own rules
(contract.md#group-spec-meaning), which admit exactly what vLLM's grouping
itself does:

- promotion: a sliding-window or chunked-local layer may be allocated as full
  attention when its group spec records the same window or chunk, an SW-MLA
  layer as MLA likewise (hybrid manager off, the full-allocation fallback);
- unification and hidden-state alignment: block size and page padding may
  change (``KV-GROUP-LAYER-SPEC`` keeps the page from shrinking);
- stride alignment: a group spec may ask block strides for a multiple of the
  layer's ``block_stride_alignment`` bytes (more, never less);
- merging: a full layer may join a group whose spec records a window, a sink
  or non-causality of another layer; MLA and SW-MLA merges drop the
  ``alignment`` padding field and SW-MLA merges reset ``kv_quant_mode`` and
  ``head_size_v``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from conformance.check.catalog import flag
from conformance.check.geometry import OracleError, block_stride_alignment
from conformance.check.grouping import Groups, _layer_spec_kept, given_specs, grouping_invariant
from conformance.check.observations import GroupingObservation
from conformance.check.violations import Violation
from kvref.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

__all__ = ["kind_of", "meaning_changes"]

_MISSING = object()

#: Fields a kernel reads to address and interpret an attention page.
_ATTENTION_FIELDS = (
    "num_kv_heads",
    "head_size",
    "head_size_v",
    "dtype",
    "num_head_slots",
    "state_content_bytes",
    "tokens_per_state",
    "kv_quant_mode",
    "dcp_sharded",
)

#: MLA / SW-MLA format fields a kernel dispatches on (compared where both specs have them).
_MLA_FIELDS = (
    "cache_dtype_str",
    "model_version",
    "cache_role",
    "is_index_group_leader",
    "topk_buffer_width",
    "bounded_replay",
)

#: What decides a Mamba layer's state format and the blocks a request holds.
_MAMBA_FIELDS = (
    "shapes",
    "dtypes",
    "mamba_type",
    "mamba_cache_mode",
    "num_speculative_blocks",
    "num_prefill_checkpoint_blocks",
    "prefill_checkpoint_alignment",
    "num_heads",
    "tokens_per_state",
    "tp_replicated",
)

#: Kinds a layer of the key kind may be allocated as (promotion,
#: contract.md#hybrid-manager-disabled, contract.md#full-allocation-fallback).
_PROMOTIONS = {"sliding": "full", "chunked": "full", "sliding_mla": "mla"}


def kind_of(spec: KVCacheSpec) -> str:
    """The attention (or state) kind a kernel and the block pool treat the layer as."""
    ordered: tuple[tuple[type[Any], str], ...] = (
        (MambaSpec, "mamba"),
        (CrossAttentionSpec, "cross"),
        (EncoderOnlyAttentionSpec, "encoder_only"),
        (CircularBufferSpec, "ring"),
        (ChunkedLocalAttentionSpec, "chunked"),
        (SlidingWindowMLASpec, "sliding_mla"),
        (SlidingWindowSpec, "sliding"),
        (MLAAttentionSpec, "mla"),
        (FullAttentionSpec, "full"),
    )
    for cls, name in ordered:
        if isinstance(spec, cls):
            return name
    return f"class {type(spec).__qualname__}"


_HAS: dict[tuple[type, str], bool] = {}


def _field(spec: KVCacheSpec, field: str) -> Any:
    """``getattr(spec, field, _MISSING)``, answered by the class where it can be."""
    # Asking a slotted spec for a field its class lacks goes through attrs'
    # generated __getattr__ and two exceptions.  An instance with a __dict__
    # (a builder's own subclass) may hold any name: it is always asked.
    cls = type(spec)
    may = _HAS.get((cls, field))
    if may is None:
        may = _HAS[cls, field] = hasattr(cls, field) or cls.__dictoffset__ != 0
    return getattr(spec, field, _MISSING) if may else _MISSING


def _differs(given: KVCacheSpec, kept: KVCacheSpec, field: str) -> str | None:
    a = _field(given, field)
    b = _field(kept, field)
    if a is _MISSING or b is _MISSING or a == b:
        return None
    return f"{field} {a!r} -> {b!r}"


def _kind_changes(given: KVCacheSpec, kept: KVCacheSpec) -> Iterator[str]:
    was, now = kind_of(given), kind_of(kept)
    if was == now:
        if was in ("sliding", "sliding_mla"):
            yield from filter(None, [_differs(given, kept, "sliding_window")])
            extra = getattr(given, "extra_retained_tokens", 0)
            if getattr(kept, "extra_retained_tokens", 0) < extra:
                yield (
                    f"retains {getattr(kept, 'extra_retained_tokens', 0)} lookahead tokens "
                    f"beyond the window where the layer retains {extra}"
                )
        if was == "chunked":
            yield from filter(None, [_differs(given, kept, "attention_chunk_size")])
        return
    # Promoted for allocation: compute still needs the window or chunk it records.
    field = "attention_chunk_size" if was == "chunked" else "sliding_window"
    if getattr(kept, field, None) != getattr(given, field):
        yield (
            f"promoted to {now} without recording its {field} "
            f"({getattr(given, field)!r} -> {getattr(kept, field, None)!r})"
        )


def _alignment_weakened(given: KVCacheSpec, kept: KVCacheSpec) -> str | None:
    """A group alignment that no longer asks for the layer's, in bytes.

    vLLM reads ``block_stride_alignment`` only to size block strides
    (contract.md#views-and-strides), so a group spec may ask for more (a
    platform aligning strides for its DMA) but not for less: the group's bytes
    must be a multiple of what the layer's own field asks, of the layer or of
    the group spec (a merge that carries a padded page over asks the latter).
    """
    found = _differs(given, kept, "block_stride_alignment")
    if found is None:
        return None
    try:
        kept_bytes = block_stride_alignment(kept)
        wanted = block_stride_alignment(given)
        # The layer's own field read on the group spec: what an unchanged field
        # asks there (a merge that carries a padded page over changes it).
        as_kept = block_stride_alignment(
            attrs.evolve(kept, block_stride_alignment=given.block_stride_alignment)
        )
    except (OracleError, TypeError, ValueError):
        return found  # bytes the kit cannot derive: the fields must then agree
    if kept_bytes % wanted == 0 or kept_bytes % as_kept == 0:
        return None
    return (
        f"{found} (block strides in multiples of {kept_bytes} bytes where the layer asks "
        f"for multiples of {wanted})"
    )


def _attention_changes(given: AttentionSpec, kept: KVCacheSpec) -> Iterator[str]:
    sliding_mla = isinstance(given, SlidingWindowMLASpec)
    for field in _ATTENTION_FIELDS:
        if sliding_mla and field in ("kv_quant_mode", "head_size_v"):
            continue  # the SW-MLA merge resets them; C and the page are kept
        found = _differs(given, kept, field)
        if found:
            yield found
    found = _alignment_weakened(given, kept)
    if found:
        yield found
    for field in _MLA_FIELDS:
        found = _differs(given, kept, field)
        if found:
            yield found
    for field in ("sliding_window", "attention_chunk_size"):
        # A full layer that records a window or chunk keeps it (merge takes the one value).
        value = getattr(given, field, None)
        if value is not None and kind_of(given) in ("full", "mla"):
            found = _differs(given, kept, field)
            if found:
                yield found
    if getattr(given, "non_causal", False) and not getattr(kept, "non_causal", False):
        yield "a non-causal layer is described as causal"
    if isinstance(kept, RSWASpec) and (
        not isinstance(given, RSWASpec) or given.rswa_window != kept.rswa_window
    ):
        yield (
            f"restricted to an RSWA window of {kept.rswa_window} the layer "
            f"({type(given).__name__}) does not have"
        )


def meaning_changes(given: KVCacheSpec, kept: KVCacheSpec) -> list[str]:
    """How ``kept`` (a layer's group spec) changes what ``given`` (its own spec) asks for.

    Empty when the group spec means the same to kernels and the block pool,
    up to the changes vLLM's own grouping makes (module docstring).
    """
    was, now = kind_of(given), kind_of(kept)
    if was != now and _PROMOTIONS.get(was) != now:
        # Another kind altogether: its fields are not comparable.
        return [f"a {was} layer is described as {now}"]
    changes = list(_kind_changes(given, kept))
    if isinstance(given, MambaSpec):
        changes += filter(None, (_differs(given, kept, f) for f in _MAMBA_FIELDS))
    elif isinstance(given, AttentionSpec):
        changes += _attention_changes(given, kept)
    elif type(kept) is not type(given):
        changes.append(f"{type(given).__name__} is described as {type(kept).__name__}")
    return changes


@grouping_invariant(
    "KV-GROUP-SPEC-MEANING",
    "a layer's group spec keeps its kind, window, retention, state format and draft flag",
    anchor="group-spec-meaning",
)
def _spec_meaning(obs: GroupingObservation, groups: Groups) -> list[Violation]:
    out = []
    # A layer whose page shrinks or whose stored (H, C) changes is
    # KV-GROUP-LAYER-SPEC's finding; its other meaning is judged with it fixed.
    shrunk = {v.layer for v in _layer_spec_kept(obs) or ()}
    for i, g in enumerate(groups):
        for name, kept, given in given_specs(obs, g):
            if name in shrunk:
                continue
            changes = meaning_changes(given, kept)
            if changes:
                out.append(
                    flag(
                        f"group {i}'s spec changes what the layer asks kernels and the block "
                        "pool for: " + "; ".join(changes[:4]),
                        layer=name,
                    )
                )
        if g.is_eagle_group:
            drafts = [n for n in g.layer_names if n in obs.specs and obs.specs[n].is_draft]
            if not (obs.config.eagle_block_drop and drafts):
                out.append(
                    flag(
                        f"group {i} is marked is_eagle_group (its last block is dropped) but "
                        + (
                            "it holds no draft layer"
                            if not drafts
                            else "the config does not ask for the EAGLE block drop"
                        ),
                    )
                )
    return out[:5]
