"""The workers' side of the simulation: every layer's view, written and read as a kernel does.

A kernel addresses state ``s`` of a request through its group's block table:
entry ``s // S_G`` (``S_G``: the states one *group* block holds for this
layer, from the group's block size), slot ``s % S_G``; the flat slot
``block * S_G + slot`` lands at page ``flat // S`` and state ``flat % S`` of
the layer's view.  Layers that share a group and a page geometry share one
address computation per step; each then costs one write or one readback.
What a layer reads is decided by the model's own spec for it.

Every worker's KV cache is allocated and viewed by the kit's own model of a
worker (:func:`conformance.check.worker.allocate_kv_cache`), never by kvref's
allocation code: kvref provides the record types only, so a plan is served
through the views the contract gives it (contract.md#views-and-strides).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Protocol

import attrs
import torch

from conformance.check.violations import Violation
from conformance.check.worker import WorkerAllocation, allocate_kv_cache
from conformance.extensions.serve.invariants import ISOLATION, POOL
from conformance.extensions.serve.kernel import LayerSlot
from conformance.extensions.serve.pool import (
    NULL_BLOCK,
    GroupManager,
    Retention,
    retention_of,
    token_states,
)
from conformance.extensions.tags import mix64, observed_tag, read_states, wide_view, write_states
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec

__all__ = ["ISOLATION", "POOL", "Geometry", "Layers", "RequestLike"]


_SPEC = 4


class RequestLike(Protocol):
    """What the workers read of a request."""

    rid: int
    keys: list[int]
    encoder_keys: list[int]
    computed: int


@attrs.frozen(kw_only=True)
class Geometry:
    """How a kernel addresses a layer: shared by the layers it is the same for.

    Attributes:
        group_id: the group whose block table the layer uses.
        per_block: states one group block holds for this layer (``S_G``).
        states_per_page: states one page of the view holds (``S``).
        tokens_per_state: tokens per state.
        declared: what the layer reads (from the model's own spec).
        num_blocks: pages of the view.
    """

    group_id: int
    per_block: int
    states_per_page: int
    tokens_per_state: Fraction
    declared: Retention
    num_blocks: int


@attrs.define(kw_only=True, eq=False)
class _Plan:
    """Addresses of one geometry's states for one step, concatenated over requests."""

    pages: list[torch.Tensor] = attrs.field(factory=list)
    offsets: list[torch.Tensor] = attrs.field(factory=list)
    tags: list[torch.Tensor] = attrs.field(factory=list)
    rids: list[torch.Tensor] = attrs.field(factory=list)
    states: list[torch.Tensor] = attrs.field(factory=list)

    def add(
        self,
        rid: int,
        pages: torch.Tensor,
        offsets: torch.Tensor,
        tags: torch.Tensor,
        states: torch.Tensor,
    ) -> None:
        if pages.numel():
            self.pages.append(pages)
            self.offsets.append(offsets)
            self.tags.append(tags)
            self.states.append(states)
            self.rids.append(torch.full_like(pages, rid))

    @property
    def size(self) -> int:
        """How many states the plan addresses."""
        return sum(int(p.numel()) for p in self.pages)

    def per_slot(
        self, slots: Sequence[LayerSlot], device: torch.device
    ) -> Iterator[tuple[LayerSlot, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each of ``slots`` with the plan's pages, offsets and tags salted by the slot's salt.

        On ``device``; nothing for an empty plan.
        """
        if not self.pages:
            return
        pages, offsets, tags = (
            torch.cat(x).to(device) for x in (self.pages, self.offsets, self.tags)
        )
        for slot in slots:
            yield slot, pages, offsets, tags ^ slot.salt


def _tps(spec: KVCacheSpec) -> Fraction:
    # From the field itself: attention and Mamba specs carry ``tokens_per_state``
    # (Mamba's -1 is one state per block); every other kind stores one per token.
    value = getattr(spec, "tokens_per_state", 1)
    return Fraction(value) if value > 0 else Fraction(spec.block_size)


def _byte_views(alloc: WorkerAllocation) -> dict[str, torch.Tensor]:
    """Each viewed layer's raw ``(N, H, S, C)`` bytes; raw-page layers have none."""
    views: dict[str, torch.Tensor] = {}
    for geometry, raw in zip(alloc.geometries, alloc.tensor_views, strict=True):
        if geometry.page is None or not geometry.page.layer_views:
            continue
        for index, name in enumerate(geometry.tensor.layers):
            views[name] = raw[index]
    return views


class Layers:
    """Every worker's allocation and layer views, grouped by geometry.

    Raises:
        conformance.check.worker.WorkerError: views that cannot be built.
        kvref.errors.KVRefError: a layer the config's groups cannot give a spec for.
    """

    def __init__(
        self,
        configs: Sequence[KVCacheConfig],
        layout: KVCacheLayout | str | None,
        device: str | torch.device,
        layer_specs: Sequence[Mapping[str, KVCacheSpec]] | None,
        managers: Sequence[GroupManager],
    ) -> None:
        self.managers = managers
        self.allocations: list[WorkerAllocation] = []
        self.by_geometry: dict[Geometry, list[LayerSlot]] = {}
        self.state_writes: dict[tuple[Geometry, int], dict[int, int]] = {}
        count = 0
        for w, cfg in enumerate(configs):
            alloc = allocate_kv_cache(cfg, device, layout=layout)
            self.allocations.append(alloc)
            views = _byte_views(alloc)
            declared = layer_specs[w] if layer_specs is not None else {}
            for gid, group in enumerate(cfg.kv_cache_groups):
                for name, spec in group.layer_specs():
                    raw = views.get(name)
                    if raw is None or not getattr(spec, "has_layer_views", True):
                        continue
                    tps = _tps(spec)
                    geometry = Geometry(
                        group_id=gid,
                        per_block=max(1, int(Fraction(managers[gid].block_size) / tps)),
                        states_per_page=int(raw.shape[2]),
                        tokens_per_state=tps,
                        declared=retention_of(declared.get(name, spec)),
                        num_blocks=int(raw.shape[0]),
                    )
                    slot = LayerSlot(
                        name=name,
                        worker=w,
                        group_id=gid,
                        view=raw,
                        wide=wide_view(raw),
                        salt=mix64(w, count, 7),
                        tokens_per_state=tps,
                        declared=geometry.declared,
                    )
                    count += 1
                    self.by_geometry.setdefault(geometry, []).append(slot)
        self.device = torch.device(device)

    @property
    def slots(self) -> list[LayerSlot]:
        """Every layer of every worker."""
        return [s for slots in self.by_geometry.values() for s in slots]

    def close(self) -> None:
        """Drop every allocation."""
        for alloc in self.allocations:
            alloc.close()

    def forget(self, rid: int) -> None:
        """Drop what was recorded of a request's state writes (its blocks are gone)."""
        for key in [k for k in self.state_writes if k[1] == rid]:
            del self.state_writes[key]

    # -- addressing ---------------------------------------------------------------------

    def _address(
        self, geo: Geometry, table: list[int], states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(page, offset, entry, block)`` of each state; ``block`` is -1 without an entry."""
        if geo.declared.kind == "ring":
            entry, slot = torch.zeros_like(states), states % geo.per_block
        else:
            entry, slot = states // geo.per_block, states % geo.per_block
        padded = torch.tensor([*table, -1], dtype=torch.int64)
        block = padded[entry.clamp(max=len(table))]
        flat = block.clamp(min=0) * geo.per_block + slot
        return flat // geo.states_per_page, flat % geo.states_per_page, entry, block

    def _keys(self, geo: Geometry, req: RequestLike, states: torch.Tensor, n: int) -> torch.Tensor:
        """Content hash of each state's last token after ``n`` tokens."""
        num, den = geo.tokens_per_state.numerator, geo.tokens_per_state.denominator
        last = torch.clamp(((states + 1) * num + den - 1) // den, max=n) - 1
        return torch.tensor(req.keys, dtype=torch.int64)[last]

    def _states(
        self, geo: Geometry, req: RequestLike, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """States of tokens ``[start, end)`` (every encoder token for encoder layers), keys."""
        if geo.declared.kind == "encoder":
            count = len(req.encoder_keys)
            first, last = token_states(geo.tokens_per_state, 0, count)
            states = torch.arange(first, last, dtype=torch.int64)
            keys = torch.tensor(req.encoder_keys, dtype=torch.int64)
            return states, keys[states.clamp(max=count - 1)] if count else keys
        first, last = token_states(geo.tokens_per_state, start, end)
        states = torch.arange(first, last, dtype=torch.int64)
        return states, self._keys(geo, req, states, end)

    # -- writes -------------------------------------------------------------------------

    def write(self, work: Sequence[tuple[RequestLike, int, int]]) -> tuple[list[Violation], int]:
        """Write tokens ``[start, end)`` of each request through every layer; violations, states."""
        found: list[Violation] = []
        written = 0
        for geo, slots in self.by_geometry.items():
            plan = _Plan()
            table_of = self.managers[geo.group_id].tables
            for req, start, end in work:
                table = table_of.get(req.rid, [])
                if geo.declared.kind == "state":
                    found += self._plan_state(geo, slots[0], req, end, table, plan)
                    continue
                if geo.declared.kind == "encoder" and start > 0:
                    continue
                states, keys = self._states(geo, req, start, end)
                if geo.declared.kind == "ring":
                    # Only the last lap of a ring survives a write of several laps.
                    states, keys = states[-geo.per_block :], keys[-geo.per_block :]
                pages, offsets, entry, block = self._address(geo, table, states)
                unheld = block <= NULL_BLOCK
                if bool(unheld.any()):
                    k = int(unheld.nonzero()[0])
                    found.append(
                        self._unheld(
                            slots[0], req, int(entry[k]), table, f"state {int(states[k])} of"
                        )
                    )
                held = ~unheld
                found += self._foreign(geo, slots[0], req, table, pages[held])
                keep = held & (pages < geo.num_blocks)
                plan.add(req.rid, pages[keep], offsets[keep], keys[keep], states[keep])
            for slot, pages_d, offsets_d, keys_d in plan.per_slot(slots, self.device):
                write_states(slot.view, pages_d, offsets_d, keys_d, slot.wide)
            written += plan.size * len(slots)
        return found, written

    def _plan_state(
        self,
        geo: Geometry,
        first: LayerSlot,
        req: RequestLike,
        n: int,
        table: list[int],
        plan: _Plan,
    ) -> list[Violation]:
        current = (max(n, 1) - 1) // self.managers[geo.group_id].block_size
        key = req.keys[n - 1] if n else 0
        record = self.state_writes.setdefault((geo, req.rid), {})
        found: list[Violation] = []
        for j in range(1 + geo.declared.spec_blocks):
            index = current + j
            if index >= len(table) or table[index] == NULL_BLOCK:
                found.append(self._unheld(first, req, index, table, "a state of"))
                continue
            if table[index] >= geo.num_blocks:
                continue
            tag = mix64(key, j, _SPEC)
            record[index] = tag
            one = torch.tensor([table[index]], dtype=torch.int64)
            plan.add(
                req.rid, one, torch.zeros_like(one), torch.tensor([tag]), torch.tensor([index])
            )
        return found[:1]

    def _unheld(
        self, slot: LayerSlot, req: RequestLike, index: int, table: list[int], what: str
    ) -> Violation:
        held = "the null block" if index < len(table) else f"no entry ({len(table)} entries)"
        return Violation(
            invariant=POOL,
            message=(
                f"the kernel writes {what} request {req.rid} through entry {index} of group "
                f"{slot.group_id}'s block table, which holds {held}: the group's manager keeps "
                "fewer blocks than the layer's own spec writes"
            ),
            worker=slot.worker,
            layer=slot.name,
        )

    def _foreign(
        self,
        geo: Geometry,
        slot: LayerSlot,
        req: RequestLike,
        table: list[int],
        pages: torch.Tensor,
    ) -> list[Violation]:
        if not pages.numel():
            return []
        owned = torch.tensor(table, dtype=torch.int64)
        bad = (pages >= geo.num_blocks) | ~torch.isin(pages, owned)
        if not bool(bad.any()):
            return []
        page = int(pages[bad.nonzero()[0]])
        where = (
            "outside the view"
            if page >= geo.num_blocks
            else "a block the request does not hold in this group"
        )
        return [
            Violation(
                invariant=POOL,
                message=(
                    f"the kernel writes request {req.rid} into page {page} of the layer's view "
                    f"({geo.num_blocks} pages, {geo.states_per_page} states each), {where}: group "
                    f"{geo.group_id} counts {self.managers[geo.group_id].block_size} tokens "
                    "per block"
                ),
                worker=slot.worker,
                layer=slot.name,
                block=page,
            )
        ]

    # -- readbacks ----------------------------------------------------------------------

    def read(self, running: Sequence[RequestLike]) -> tuple[list[Violation], int]:
        """Read back every state each live request still needs; violations, states verified."""
        found: list[Violation] = []
        verified = 0
        for geo, slots in self.by_geometry.items():
            plan = _Plan()
            table_of = self.managers[geo.group_id].tables
            for req in running:
                table = table_of.get(req.rid, [])
                if geo.declared.kind == "state":
                    record = self.state_writes.get((geo, req.rid), {})
                    for index, tag in sorted(record.items()):
                        if index < len(table) and 0 < table[index] < geo.num_blocks:
                            one = torch.tensor([table[index]], dtype=torch.int64)
                            plan.add(
                                req.rid,
                                one,
                                torch.zeros_like(one),
                                torch.tensor([tag]),
                                torch.tensor([index]),
                            )
                    continue
                start, end = geo.declared.needed_tokens(req.computed)
                states, keys = self._states(geo, req, start, end)
                if geo.declared.kind == "ring":
                    # A ring keeps its last ``S_G`` states; older ones share their slots.
                    states, keys = states[-geo.per_block :], keys[-geo.per_block :]
                pages, offsets, entry, block = self._address(geo, table, states)
                # An entry the manager never allocated is the writer's finding (KV-SERVE-POOL);
                # a null entry was freed while the layer still reads it.
                nulled = block == NULL_BLOCK
                if bool(nulled.any()):
                    k = int(nulled.nonzero()[0])
                    found.append(self._freed(slots[0], req, int(states[k]), int(entry[k])))
                keep = (block > 0) & (pages < geo.num_blocks)
                plan.add(req.rid, pages[keep], offsets[keep], keys[keep], states[keep])
            for slot, pages_d, offsets_d, keys_d in plan.per_slot(slots, self.device):
                bad = read_states(slot.view, pages_d, offsets_d, keys_d, slot.wide)
                if bad.numel():
                    k = int(bad[0])
                    rid = int(torch.cat(plan.rids)[k])
                    state = int(torch.cat(plan.states)[k])
                    found.append(
                        self._clobbered(
                            slot, rid, state, int(pages_d[k]), int(offsets_d[k]), int(bad.numel())
                        )
                    )
                    break
            verified += plan.size * len(slots)
        return found, verified

    def _freed(self, slot: LayerSlot, req: RequestLike, state: int, index: int) -> Violation:
        return Violation(
            invariant=ISOLATION,
            message=(
                f"request {req.rid} (at {req.computed} tokens) still needs state {state} of "
                f"the layer, but entry {index} of group {slot.group_id}'s block table is the "
                "null block: the group's manager freed what the layer's own spec still reads, "
                "so the kernel reads whatever that block holds"
            ),
            worker=slot.worker,
            layer=slot.name,
        )

    def _clobbered(
        self, slot: LayerSlot, rid: int, pos: int, page: int, state: int, count: int
    ) -> Violation:
        seen = observed_tag(slot.view, page, state)
        return Violation(
            invariant=ISOLATION,
            message=(
                f"request {rid} reads state {pos} of the layer from page {page} (state "
                f"{state}) and finds {self.whose(seen)} instead of its own tag "
                f"({count} state(s) of this layer differ)"
            ),
            worker=slot.worker,
            layer=slot.name,
            block=page,
        )

    def whose(self, seen: int | None, requests: Sequence[RequestLike] = ()) -> str:
        """Name what a tag read back belongs to (for messages)."""
        if seen is None:
            return "other bytes"
        if seen == 0:
            return "zeros (never written)"
        for slot in self.slots:
            for req in requests or self.known:
                for t, key in enumerate(req.keys):
                    if key ^ slot.salt == seen:
                        return f"request {req.rid}'s token {t} of layer {slot.name!r}"
        return "bytes of no request's token (a state, or a torn write)"

    #: Every request so far, for :meth:`whose` (set by the simulation).
    known: Sequence[RequestLike] = ()
