"""What one request needs, from the layers' own specs: the kit's admission oracle.

Core admits a plan when one request at ``max_model_len`` fits in a worker's
memory after the null block (contract.md#core-admission).  Core computes that
need from the builder's group specs; a builder whose group specs understate
the layers' needs would pass a check that does the same.  This oracle reads
each layer's *own* spec (as Core tags it: sliding windows retain
``max(0, num_prefill_lookahead_tokens - 1)`` extra tokens) and the block size
its group gives it, and counts, per group, the blocks of the shared pool the
hungriest layer of the group needs:

- full attention (MLA, RSWA, sink, hidden state): ``cdiv(L', bs)`` with
  ``L' = cdiv(L, dcp)`` for DCP-sharded layers when ``dcp > 1``;
- sliding window (SW-MLA too): ``cdiv(min(w - 1 + extra + I, L), bs) + 1``;
- chunked local: ``cdiv(min(chunk + I, L), bs)``;
- ring buffer: 1; cross attention: ``cdiv(encoder tokens, bs)``; encoder-only: 0;
- Mamba: ``2 + speculative + checkpoint`` blocks in ``align`` cache mode, else
  ``1 + speculative``;
- HiSparse hot: ``blocks_per_request``; HiSparse resident: ``cdiv(min(I, L), bs)``.

A sliding-window or chunked-local layer that its group *promotes* to full
attention (the group's spec for it is a full or MLA kind: the hybrid manager
disabled, SPEC 3.2, or the full-allocation fallback, SPEC 3.5) is managed by
the full-attention manager, which allocates blocks for every token and
never frees below the window: it needs the full-attention count
``cdiv(L', bs)``, not the window's (vLLM 0.33.0
``kv_cache_planning._promote_local_kv_cache_specs``: "Promoted specs
allocate blocks for all tokens").  The window's count can be one block more
(its ``+ 1`` when the window covers the whole length), so reading the
layer's own kind there would demand memory vLLM does not.

``need = bytes_per_block x Σ_groups blocks`` over the device groups; a group
with no layer on the worker still counts (block IDs are global).  A faithful
builder's plan is never below this bound.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from conformance.check.bounds import named_layer_specs
from conformance.check.meaning import kind_of
from kvref.config import PlanningConfig
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["layer_blocks", "request_need_from_layers"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _mamba_blocks(spec: KVCacheSpec, config: PlanningConfig) -> int:
    extra = int(getattr(spec, "num_speculative_blocks", 0))
    if config.mamba_cache_mode == "align":
        return 2 + extra + int(getattr(spec, "num_prefill_checkpoint_blocks", 0))
    return 1 + extra


def _full_tokens(spec: KVCacheSpec, config: PlanningConfig) -> int:
    """Tokens one request keeps in a full-attention layer: ``L``, divided by DCP if sharded."""
    dcp = config.decode_context_parallel_size
    length = config.max_model_len
    return _cdiv(length, dcp) if spec.dcp_sharded and dcp > 1 else length


def _tokens(spec: KVCacheSpec, kind: str, config: PlanningConfig) -> int | None:
    """Tokens one request keeps in a layer of a token-indexed kind (``None``: not one)."""
    length = config.max_model_len
    in_flight = config.max_in_flight_tokens
    if kind in ("full", "mla"):
        return _full_tokens(spec, config)
    if kind == "chunked":
        return min(int(getattr(spec, "attention_chunk_size")) + in_flight, length)  # noqa: B009
    if kind == "cross":
        return config.encoder_input_tokens
    if type(spec).__name__ == "HiSparseResidentSpec":
        return min(in_flight, length)
    return None


#: Local kinds a group may allocate as full attention (promotion, SPEC 3.2 / 3.5).
_LOCAL_KINDS = frozenset({"sliding", "sliding_mla", "chunked"})


def _promoted(own: KVCacheSpec, kept: KVCacheSpec) -> bool:
    """Whether the group allocates the local layer ``own`` as full attention (``kept``)."""
    return kind_of(own) in _LOCAL_KINDS and kind_of(kept) in ("full", "mla")


def _full_blocks(own: KVCacheSpec, block_size: int, config: PlanningConfig) -> int:
    """Blocks the full-attention manager keeps for a promoted layer: every token.

    DCP sharding is read from the layer's own spec (promotion keeps the field),
    so a group spec cannot lower it.
    """
    return _cdiv(_full_tokens(own, config), block_size)


def layer_blocks(spec: KVCacheSpec, block_size: int, config: PlanningConfig) -> int | None:
    """Blocks of ``block_size`` tokens one request keeps in a layer of ``spec`` (``None``: unknown).

    ``spec`` is the layer's own spec; ``block_size`` is the one its group gives it.
    """
    kind = kind_of(spec)
    fixed = {"ring": 1, "encoder_only": 0}
    if kind in fixed:
        return fixed[kind]
    if kind == "mamba":
        return _mamba_blocks(spec, config)
    if kind in ("sliding", "sliding_mla"):
        extra = max(0, config.num_prefill_lookahead_tokens - 1)
        window = int(getattr(spec, "sliding_window"))  # noqa: B009 - every sliding kind has one
        tokens = min(window - 1 + extra + config.max_in_flight_tokens, config.max_model_len)
        return _cdiv(tokens, block_size) + 1
    if hasattr(spec, "blocks_per_request"):
        return int(getattr(spec, "blocks_per_request"))  # noqa: B009
    kept = _tokens(spec, kind, config)
    return None if kept is None else _cdiv(kept, block_size)


def request_need_from_layers(
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    layers: Mapping[str, KVCacheSpec],
    bytes_per_block: int,
    worker_layers: Collection[str],
) -> int | None:
    """Device bytes one request needs on a worker, from the layers' own specs.

    ``groups`` are the global groups, ``layers`` every layer's own spec (all
    workers), ``worker_layers`` the worker's layer names.  A group counts the
    hungriest of its layers on the worker (of all its layers when it has none
    there, as Core's projection keeps the global wrapper).  ``None`` when a
    layer's kind has no rule here (the need is then not judged).
    """
    total = 0
    for group in groups:
        if group.host_resident:
            continue  # host groups have their own pool (contract.md#host-residency)
        named = [(n, s) for n, s in named_layer_specs(group) if n in layers]
        here = [(n, s) for n, s in named if n in worker_layers] or named
        most = 0
        for name, kept in here:
            own = layers[name]
            blocks: int | None = (
                _full_blocks(own, kept.block_size, config)
                if _promoted(own, kept)
                else layer_blocks(own, kept.block_size, config)
            )
            if blocks is None:
                return None
            most = max(most, blocks)
        total += most
    return bytes_per_block * total
