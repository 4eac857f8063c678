"""A block pool and per-group block tables with vLLM 0.33.0's semantics, small enough to read.

What it models (``vllm/v1/core/block_pool.py``, ``single_type_kv_cache_manager.py``,
``kv_cache_coordinator.py``):

- One pool of ``num_blocks`` block IDs per block-ID space (the device pool,
  and the host pool of host-resident groups with ``host_num_blocks`` IDs).
  ID 0 is the null block: never handed out, never freed, and the placeholder
  in block tables for blocks a window no longer needs.
- Free blocks sit in an eviction-ordered queue: new blocks come from the
  front; freed blocks without a prefix-cache hash go to the front, hashed
  ones to the back, so cached content is evicted last.  Handing out a hashed
  block evicts it from the prefix cache.
- One manager per group, chosen by the group's spec (the first per-layer spec
  of a ``UniformTypeKVCacheSpecs``, as ``generate_scheduler_kv_cache_config``
  does).  Its block size is the spec's ``block_size``.  Full attention keeps
  every block; sliding windows free whole blocks before
  ``n - window + 1 - extra_retained_tokens``; chunked local attention frees
  whole blocks before the current chunk; freed entries become the null block.
  A ring buffer holds one block.  Mamba holds the state block of its last
  computed token plus ``num_speculative_blocks`` (and, in ``align`` mode, the
  previous state block).  Cross-attention and encoder-only groups are sized by
  the request's encoder tokens at admission and keep them to the end.
- Prefix caching: full blocks are cached by the hash of the content up to
  their end, per group; a new request touches the cached blocks of the longest
  prefix every group can serve (reference counts), aligned to the scheduler
  block size (the lcm of the groups' block sizes) and shorter than its prompt.

What it leaves out: chunked prefill and the admission cap of recycling specs
(a prompt is computed in one step), partial-block hits and copy-on-write,
Mamba prefix caching and prefill checkpoint blocks (configs with Mamba or
encoder groups run without prefix caching), RSWA's middle gap and sink
tokens (kept as full attention), the EAGLE last-block drop, the retention
interval, KV connectors and offloading, DCP/PCP (one rank, tokens per block
= ``block_size``), kernel-block splitting, HiSparse hot and resident
groups, KV events and metrics.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from fractions import Fraction

import attrs

from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "NULL_BLOCK",
    "BlockPool",
    "GroupManager",
    "PoolExhaustedError",
    "Retention",
    "retention_of",
]

#: The placeholder block ID (vLLM's ``null_block``).
NULL_BLOCK = 0

#: Retention kinds: what a layer reads and what a group's manager keeps.
KINDS = ("full", "sliding", "chunked", "ring", "state", "encoder")


class PoolExhaustedError(Exception):
    """The pool has fewer free blocks than asked for (vLLM raises ``ValueError``)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@attrs.frozen(kw_only=True)
class Retention:
    """Which tokens a layer reads, or a group's manager keeps, after ``n`` computed tokens.

    Attributes:
        kind: one of ``full``, ``sliding``, ``chunked``, ``ring``, ``state``, ``encoder``.
        block_size: tokens per block of the spec.
        window: the sliding window or the attention chunk (0 otherwise).
        extra: tokens a sliding window keeps beyond its window (managers only).
        spec_blocks: Mamba's speculative state blocks.
        align: Mamba's ``align`` cache mode (the previous state block is kept).
    """

    kind: str
    block_size: int
    window: int = 0
    extra: int = 0
    spec_blocks: int = 0
    align: bool = False

    def skipped_tokens(self, n: int) -> int:
        """Tokens before which the manager frees whole blocks (vLLM ``get_num_skipped_tokens``)."""
        if self.kind == "sliding":
            return max(0, n - self.window + 1 - self.extra)
        if self.kind == "chunked":
            return (n // self.window) * self.window
        if self.kind == "state":
            return max(0, n - 1)
        return 0

    def needed_tokens(self, n: int) -> tuple[int, int]:
        """Token range ``[start, end)`` an attention layer reads for its next token."""
        if self.kind == "sliding":
            return max(0, n - self.window + 1), n
        if self.kind == "chunked":
            return (n // self.window) * self.window, n
        if self.kind == "ring":
            return max(0, n - self.block_size), n
        return 0, n

    def table_length(self, n: int, encoder_tokens: int) -> int:
        """Block-table entries the manager wants for ``n`` tokens (nulls included)."""
        if self.kind == "ring":
            return 1
        if self.kind == "encoder":
            return _cdiv(encoder_tokens, self.block_size)
        if self.kind == "state":
            return _cdiv(max(n, 1), self.block_size) + self.spec_blocks
        return _cdiv(n, self.block_size)

    def first_kept(self, n: int) -> int:
        """Table index below which every entry is (or becomes) the null block."""
        if self.kind == "state":
            current = (max(n, 1) - 1) // self.block_size
            return max(0, current - int(self.align))
        return self.skipped_tokens(n) // self.block_size

    @property
    def prefix_cacheable(self) -> bool:
        """Whether this model gives the manager prefix-cache hits."""
        return self.kind in ("full", "sliding", "chunked")


def _first_spec(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> KVCacheSpec:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return next(iter(spec.kv_cache_specs.values()))
    return spec


def retention_of(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> Retention:
    """The retention vLLM's manager for ``spec`` applies (a wrapper's first spec decides).

    The block size is the group spec's own: the one its block table counts
    tokens in, which a wrapper may declare apart from its layers' pages.
    """
    bs = spec.block_size
    spec = _first_spec(spec)
    if isinstance(spec, SlidingWindowSpec):
        return Retention(
            kind="sliding",
            block_size=bs,
            window=spec.sliding_window,
            extra=spec.extra_retained_tokens,
        )
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return Retention(kind="chunked", block_size=bs, window=spec.attention_chunk_size)
    if isinstance(spec, CircularBufferSpec):
        return Retention(kind="ring", block_size=bs)
    if isinstance(spec, MambaSpec):
        return Retention(
            kind="state",
            block_size=bs,
            spec_blocks=spec.num_speculative_blocks,
            align=spec.mamba_cache_mode == "align",
        )
    if isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)):
        return Retention(kind="encoder", block_size=bs)
    # Full attention and its kin (MLA, sink, RSWA, hidden states) keep every block.
    return Retention(kind="full", block_size=bs)


class BlockPool:
    """Block IDs ``1..num_blocks-1`` in an eviction-ordered free queue, with reference counts.

    Raises:
        ValueError: ``num_blocks < 1`` (the pool needs its null block).
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r} must be an int >= 1 (the null block)")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._hash_of: dict[int, tuple[int, int]] = {}
        self._cached: dict[tuple[int, int], int] = {}

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out (cached ones with no holder included)."""
        return len(self._free)

    def is_free(self, block: int) -> bool:
        """Whether ``block`` sits in the free queue."""
        return block in self._free

    def get_new_blocks(self, count: int) -> list[int]:
        """Hand out ``count`` blocks from the front of the queue, evicting their cache entries.

        Raises:
            PoolExhaustedError: fewer than ``count`` blocks are free.
        """
        if count > len(self._free):
            raise PoolExhaustedError(f"cannot get {count} free blocks, {len(self._free)} free")
        out = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self.ref_cnt[block] += 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one more reference to each (cached) block; idle ones leave the free queue."""
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            if self.ref_cnt[block] == 0:
                del self._free[block]
            self.ref_cnt[block] += 1

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """Drop one reference to each block; the first given is evicted first."""
        first: list[int] = []
        last: list[int] = []
        for block in ordered:
            if block == NULL_BLOCK:
                continue
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                (last if block in self._hash_of else first).append(block)
        for block in reversed(first):
            self._free[block] = None
            self._free.move_to_end(block, last=False)
        for block in last:
            self._free[block] = None

    def cache(self, group: int, key: int, block: int) -> None:
        """Make ``block`` reachable as ``group``'s block for the content hash ``key``."""
        if block == NULL_BLOCK or block in self._hash_of:
            return
        self._hash_of[block] = (group, key)
        # vLLM keeps duplicates and answers with the first; so does this dict.
        self._cached.setdefault((group, key), block)

    def cached(self, group: int, key: int) -> int | None:
        """The block cached for ``group`` and ``key``, if any."""
        return self._cached.get((group, key))

    def _evict(self, block: int) -> None:
        entry = self._hash_of.pop(block, None)
        if entry is not None and self._cached.get(entry) == block:
            del self._cached[entry]


@attrs.define(kw_only=True, eq=False)
class GroupManager:
    """One group's block tables (vLLM ``SingleTypeKVCacheManager``), on one pool.

    Attributes:
        group_id: the group's index in the config.
        retention: what the manager keeps (from the group's spec).
        pool: the pool of the group's block-ID space.
        tables: request ID to its block table.
        cached_upto: request ID to the table entries already offered to the prefix cache.
    """

    group_id: int
    retention: Retention
    pool: BlockPool
    tables: dict[int, list[int]] = attrs.field(factory=dict)
    cached_upto: dict[int, int] = attrs.field(factory=dict)

    @classmethod
    def for_group(cls, group_id: int, group: KVCacheGroupSpec, pool: BlockPool) -> GroupManager:
        """The manager vLLM would build for ``group``."""
        return cls(group_id=group_id, retention=retention_of(group.kv_cache_spec), pool=pool)

    @property
    def block_size(self) -> int:
        """Tokens per block of the group."""
        return self.retention.block_size

    def null_prefix(self, n: int) -> int:
        """Table entries an extension to ``n`` tokens fills with nulls instead of fresh blocks.

        Only Mamba's ``align`` mode does this (vLLM pads its skipped blocks with
        nulls); every other manager allocates blocks for all tokens being
        computed and frees those outside the window after the step.
        """
        if self.retention.kind == "state" and self.retention.align:
            return _cdiv(max(n, 1), self.block_size) - 1
        return 0

    def new_blocks_needed(
        self, request: int, n: int, encoder_tokens: int, table_length: int | None = None
    ) -> int:
        """Fresh blocks :meth:`allocate` takes to cover ``n`` tokens.

        ``table_length`` stands for the request's current table (a prefix hit's table).
        """
        have = len(self.tables.get(request, [])) if table_length is None else table_length
        target = self.retention.table_length(n, encoder_tokens)
        return max(0, target - max(have, self.null_prefix(n)))

    def allocate(self, request: int, n: int, encoder_tokens: int) -> None:
        """Grow the table to cover ``n`` tokens.

        Raises:
            PoolExhaustedError: the pool is short (callers check first).
        """
        table = self.tables.setdefault(request, [])
        target = self.retention.table_length(n, encoder_tokens)
        nulls = max(0, min(self.null_prefix(n), target) - len(table))
        table.extend([NULL_BLOCK] * nulls)
        if target > len(table):
            table.extend(self.pool.get_new_blocks(target - len(table)))

    def remove_skipped(self, request: int, n: int) -> None:
        """Free the blocks the manager no longer keeps after ``n`` tokens (vLLM order)."""
        table = self.tables.get(request)
        if not table:
            return
        last = min(self.retention.first_kept(n), len(table))
        freed = []
        for i in range(last - 1, -1, -1):
            if table[i] == NULL_BLOCK:
                break
            freed.append(table[i])
            table[i] = NULL_BLOCK
        self.pool.free_blocks(freed)

    def cache_full_blocks(self, request: int, n: int, keys: Sequence[int]) -> None:
        """Offer the blocks filled by the first ``n`` tokens to the prefix cache.

        ``keys[t]`` is the content hash of tokens ``0..t``.
        """
        if not self.retention.prefix_cacheable:
            return
        table = self.tables.get(request, [])
        full = min(n // self.block_size, len(table))
        for i in range(self.cached_upto.get(request, 0), full):
            self.pool.cache(self.group_id, keys[(i + 1) * self.block_size - 1], table[i])
        self.cached_upto[request] = max(full, self.cached_upto.get(request, 0))

    def hit_blocks(self, keys: Sequence[int], tokens: int) -> list[int] | None:
        """The table a new request gets for a prefix hit of ``tokens`` tokens, or ``None``."""
        count = tokens // self.block_size
        first = min(self.retention.first_kept(tokens), count)
        table = [NULL_BLOCK] * first
        for i in range(first, count):
            block = self.pool.cached(self.group_id, keys[(i + 1) * self.block_size - 1])
            if block is None:
                return None
            table.append(block)
        return table

    def add_hit(self, request: int, table: list[int]) -> None:
        """Start ``request``'s table with the hit blocks, taking a reference to each."""
        self.pool.touch(table)
        self.tables[request] = list(table)
        self.cached_upto[request] = len(table)

    def free(self, request: int) -> None:
        """Release every block of ``request``, tail first."""
        table = self.tables.pop(request, [])
        self.cached_upto.pop(request, None)
        self.pool.free_blocks(reversed(table))


def scheduler_block_size(managers: Sequence[GroupManager]) -> int:
    """The lcm of the groups' block sizes: prefix hits end on its multiples."""
    return math.lcm(*(m.block_size for m in managers)) if managers else 1


def token_states(tokens_per_state: int | Fraction, start: int, end: int) -> tuple[int, int]:
    """States ``[first, last)`` that hold tokens ``[start, end)``."""
    if end <= start:
        return 0, 0
    tps = Fraction(tokens_per_state)
    return math.floor(start / tps), math.ceil(end / tps)
