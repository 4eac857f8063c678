"""A serving simulation: one scheduler's pool and block tables over every worker's KV cache.

The scheduler side (pool, managers, admission, growth, preemption) follows
:mod:`conformance.extensions.serve.pool`; the worker side writes each computed state's
tag through every layer's view, addressed as an attention kernel addresses it:
state ``s`` goes to block-table entry ``s // S_G`` of its group (``S_G`` the
states one *group* block holds for this layer), slot ``s % S_G``, and lands at
page ``slot // S`` and state ``slot % S`` of the layer's view.  What a layer
reads is decided by the model's own spec for it (its window, chunk, state or
encoder tokens), not by the group the builder put it in.

After every step the simulation checks two invariants:

- ``KV-SERVE-ISOLATION``: every live request reads back its own tags for every
  state each of its layers still needs.
- ``KV-SERVE-POOL``: the pool never hands out the null block or a block it
  already gave; reference counts equal holders; a block ID is held by one
  group at a time; and every kernel write lands in a block its request holds
  in that group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import attrs
import torch

from conformance.check.violations import Violation
from conformance.check.worker import WorkerAllocation
from conformance.extensions.serve.pool import (
    NULL_BLOCK,
    BlockPool,
    GroupManager,
    scheduler_block_size,
)
from conformance.extensions.serve.worker import ISOLATION, POOL, Layers
from conformance.extensions.tags import mix64
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec

__all__ = ["ISOLATION", "POOL", "Request", "Simulation"]

_GEN, _PROMPT, _ENCODER = 1, 2, 3


@attrs.define(kw_only=True, eq=False)
class Request:
    """One request: its tokens, their content hashes and how many are computed.

    Attributes:
        rid: the request ID (order of arrival).
        tokens: token IDs, prompt first.
        keys: ``keys[t]`` hashes ``tokens[0..t]``: the identity of the KV of token ``t``.
        encoder_keys: content hashes of the encoder tokens.
        computed: tokens whose KV is written.
        status: ``waiting``, ``running`` or ``finished``.
    """

    rid: int
    tokens: list[int]
    keys: list[int]
    encoder_keys: list[int]
    computed: int = 0
    status: str = "waiting"

    def append(self, token: int) -> None:
        """Add a token and its content hash."""
        prev = self.keys[-1] if self.keys else 0
        self.tokens.append(token)
        self.keys.append(mix64(prev, token))


class Simulation:
    """The scheduler and the workers of one deployment, driven step by step.

    Args:
        configs: one config per worker; the first is the scheduler's (vLLM uses
            worker 0's groups, with a wrapper's first spec, and its ``num_blocks``).
        layout: the resolved layout the views are built in (default: each config's).
        device: torch device of the device backings.
        layer_specs: per worker, the model's own spec of each layer (what it
            reads); default: the config's per-layer specs.
        max_tokens: tokens after which a request is finished by length.

    Raises:
        conformance.check.worker.WorkerError, kvref.errors.KVRefError: a config
            whose views cannot be built (the static invariants report those).
        ValueError: no config, or a worker whose groups differ in number.
    """

    def __init__(
        self,
        configs: Sequence[KVCacheConfig],
        layout: KVCacheLayout | str | None,
        device: str | torch.device,
        *,
        layer_specs: Sequence[Mapping[str, KVCacheSpec]] | None = None,
        max_tokens: int = 256,
    ) -> None:
        if not configs:
            raise ValueError("configs must hold at least one worker's KVCacheConfig")
        head = configs[0]
        for w, cfg in enumerate(configs):
            if len(cfg.kv_cache_groups) != len(head.kv_cache_groups):
                raise ValueError(
                    f"worker {w} has {len(cfg.kv_cache_groups)} groups, the scheduler "
                    f"{len(head.kv_cache_groups)}; group IDs must match across workers"
                )
        self.max_tokens = max_tokens
        self.device_pool = BlockPool(head.num_blocks)
        host = any(g.host_resident for g in head.kv_cache_groups)
        self.host_pool = BlockPool(max(head.host_num_blocks or 1, 1)) if host else None
        self.managers = [
            GroupManager.for_group(
                i, g, self.host_pool if g.host_resident and self.host_pool else self.device_pool
            )
            for i, g in enumerate(head.kv_cache_groups)
        ]
        self.prefix_caching = bool(self.managers) and all(
            m.retention.prefix_cacheable for m in self.managers
        )
        self.layers = Layers(configs, layout, device, layer_specs, self.managers)
        self.requests: list[Request] = []
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.layers.known = self.requests
        self.violations: list[Violation] = []
        self.log: list[str] = []
        #: tokens computed, states written and read back, prefix hits, preemptions.
        self.stats: Counter[str] = Counter()

    # -- the rules ---------------------------------------------------------------------

    def add_request(
        self,
        prompt_len: int,
        prefix_of: int | None = None,
        prefix_len: int = 0,
        encoder_len: int = 0,
    ) -> list[Violation]:
        """Queue a request of ``prompt_len`` tokens, ``prefix_len`` of them copied from another."""
        rid = len(self.requests)
        req = Request(rid=rid, tokens=[], keys=[], encoder_keys=[])
        source = self.requests[prefix_of % rid] if prefix_of is not None and rid else None
        copy = min(prefix_len, prompt_len, len(source.tokens)) if source else 0
        for t in range(prompt_len):
            req.append(source.tokens[t] if source and t < copy else mix64(rid, t, _PROMPT))
        req.encoder_keys = [mix64(rid, t, _ENCODER) for t in range(encoder_len)]
        self.requests.append(req)
        self.waiting.append(req)
        return self._step({})

    def decode(self, tokens: int = 1) -> list[Violation]:
        """Every running request computes ``tokens`` more tokens (preempting if short)."""
        growth: dict[int, tuple[int, int]] = {}
        for req in list(self.running):
            if req.status != "running":
                continue
            target = min(len(req.tokens) + tokens, self.max_tokens)
            if target <= req.computed:
                self._finish(req, "length")
                continue
            if not self._make_room(req, target):
                continue
            start = req.computed
            while len(req.tokens) < target:
                req.append(mix64(req.rid, len(req.tokens), _GEN))
            self._allocate(req, target)
            growth[req.rid] = (start, target)
        return self._step(growth)

    def finish(self, which: int) -> list[Violation]:
        """The ``which``-th running request (modulo their count) finishes."""
        if self.running:
            self._finish(self.running[which % len(self.running)], "stop")
        return self._step({})

    def preempt(self, which: int) -> list[Violation]:
        """The ``which``-th running request (modulo their count) is preempted (recompute)."""
        if self.running:
            self._preempt(self.running[which % len(self.running)])
        return self._step({})

    # -- scheduling --------------------------------------------------------------------

    @property
    def allocations(self) -> list[WorkerAllocation]:
        """Every worker's allocation."""
        return self.layers.allocations

    def _pools(self) -> list[BlockPool]:
        return [self.device_pool] + ([self.host_pool] if self.host_pool else [])

    def _need(self, req: Request, n: int, hits: list[list[int]] | None) -> dict[int, int]:
        need: dict[int, int] = {}
        for i, m in enumerate(self.managers):
            key = id(m.pool)
            table = hits[i] if hits is not None else None
            count = m.new_blocks_needed(
                req.rid, n, len(req.encoder_keys), None if table is None else len(table)
            )
            if table is not None:
                # A hit's idle blocks leave the free queue too.
                count += sum(1 for b in table if b != NULL_BLOCK and m.pool.ref_cnt[b] == 0)
            need[key] = need.get(key, 0) + count
        return need

    def _fits(self, need: dict[int, int]) -> bool:
        return all(need.get(id(p), 0) <= p.num_free for p in self._pools())

    def _fits_alone(self, need: dict[int, int]) -> bool:
        return all(need.get(id(p), 0) <= p.num_blocks - 1 for p in self._pools())

    def _allocate(self, req: Request, n: int) -> None:
        for m in self.managers:
            m.allocate(req.rid, n, len(req.encoder_keys))

    def _make_room(self, req: Request, target: int) -> bool:
        while not self._fits(self._need(req, target, None)):
            victim = self.running[-1]
            if victim is req:
                # Alone and still short: the pool cannot grow it; end it by length.
                self._finish(req, "length")
                return False
            self._preempt(victim)
        return True

    def _find_hit(self, req: Request) -> tuple[int, list[list[int]] | None]:
        if not self.prefix_caching or len(req.tokens) < 2:
            return 0, None
        step = scheduler_block_size(self.managers)
        for p in range(((len(req.tokens) - 1) // step) * step, 0, -step):
            tables = [m.hit_blocks(req.keys, p) for m in self.managers]
            if all(t is not None for t in tables):
                return p, [t for t in tables if t is not None]
        return 0, None

    def _admit_waiting(self) -> dict[int, tuple[int, int]]:
        growth: dict[int, tuple[int, int]] = {}
        while self.waiting:
            req = self.waiting[0]
            n = len(req.tokens)
            hit, tables = self._find_hit(req)
            need = self._need(req, n, tables)
            if not self._fits_alone(self._need(req, n, None)) or n > self.max_tokens:
                self.waiting.pop(0)
                req.status = "finished"
                self.log.append(f"request {req.rid} never fits the pool; dropped")
                continue
            if not self._fits(need):
                break
            self.waiting.pop(0)
            if tables is not None:
                self.stats["prefix_hit_tokens"] += hit
                for m, table in zip(self.managers, tables, strict=True):
                    m.add_hit(req.rid, table)
            self._allocate(req, n)
            req.status, req.computed = "running", hit
            self.running.append(req)
            growth[req.rid] = (hit, n)
        return growth

    def _release(self, req: Request) -> None:
        for m in self.managers:
            m.free(req.rid)
        self.layers.forget(req.rid)
        self.running.remove(req)

    def _finish(self, req: Request, why: str) -> None:
        self._release(req)
        req.status = "finished"
        self.log.append(f"request {req.rid} finished ({why})")

    def _preempt(self, req: Request) -> None:
        self.stats["preemptions"] += 1
        self._release(req)
        req.status, req.computed = "waiting", 0
        self.waiting.insert(0, req)

    # -- one step ------------------------------------------------------------------------

    def _step(self, growth: dict[int, tuple[int, int]]) -> list[Violation]:
        growth.update(self._admit_waiting())
        by_rid = {r.rid: r for r in self.running}
        work = [(by_rid[r], a, b) for r, (a, b) in growth.items() if r in by_rid]
        found, written = self.layers.write(work)
        self.stats["states_written"] += written
        for req, _, end in work:
            self.stats["tokens"] += end - req.computed
            req.computed = end
            for m in self.managers:
                m.cache_full_blocks(req.rid, end, req.keys)
                m.remove_skipped(req.rid, end)
        found += self._check_pool()
        read, verified = self.layers.read(self.running)
        self.stats["states_verified"] += verified
        found += read
        self.violations += found
        return found

    def _check_pool(self) -> list[Violation]:
        found: list[Violation] = []
        for pool in self._pools():
            holders: dict[int, list[tuple[int, int]]] = {}
            for m in self.managers:
                if m.pool is not pool:
                    continue
                for rid, table in m.tables.items():
                    for block in table:
                        if block != NULL_BLOCK:
                            holders.setdefault(block, []).append((m.group_id, rid))
            if pool.is_free(NULL_BLOCK) or pool.ref_cnt[NULL_BLOCK] != 0:
                found.append(
                    Violation(
                        invariant=POOL, message="the null block was handed out", block=NULL_BLOCK
                    )
                )
            for block in range(1, pool.num_blocks):
                who = holders.get(block, [])
                groups = sorted({g for g, _ in who})
                problem = None
                if len(groups) > 1:
                    problem = f"is held by groups {groups} at once"
                elif pool.ref_cnt[block] != len(who):
                    problem = f"has ref_cnt {pool.ref_cnt[block]} but {len(who)} holders"
                elif pool.is_free(block) == bool(who):
                    problem = "is free and held at once" if who else "is neither free nor held"
                if problem:
                    found.append(
                        Violation(invariant=POOL, message=f"block {block} {problem}", block=block)
                    )
        return found[:3]
