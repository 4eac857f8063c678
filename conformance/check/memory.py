"""Exact, vectorised footprint analysis of a :class:`~kvref.records.KVCacheConfig`.

The properties are those of contract.md#memory-safety.

This module decides the memory-safety properties of a plan from its records
alone, for any builder:

- **P2** (:func:`find_out_of_bounds`): every footprint lies inside its tensor's backing;
- **P3** (:func:`find_block_overlaps`): footprints of different block IDs never overlap,
  across any tensors, layers and groups;
- **P4** (:func:`find_layer_overlaps`): within one group and one block, footprints of
  different ``(tensor, layer)`` never overlap, and no page overlaps itself.

Device tensors are checked by default.  Host-resident tensors form their own
address space with ``config.host_num_blocks`` blocks and are never compared
with device tensors: check them with the ``find_host_*`` functions (or
``host=True``).

How (``P`` = number of runs, i.e. pages times runs per page):

- the footprint of a page, reduced to a few disjoint runs, and P2 in closed
  form, O(tensors): :mod:`conformance.check.footprint`;
- P3 and P4 over every enumerated run, O(P log P):
  :mod:`conformance.check.footprint_sweep`;
- configs with at least ``periodic_from`` runs are first tried in closed form:
  every page family (one run of one layer across all blocks) is periodic in
  the block, so when the families of one block stride meet nowhere the config
  is clean without enumerating its pages
  (:func:`conformance.check.footprint_families.periodic_clean`); anything else,
  a finding included, is enumerated as below, so findings read the same;
- configs with more runs than ``budget`` are not enumerated: families of runs
  are tested pairwise in closed form and the pages at the ends of the block
  range swept exactly (:mod:`conformance.check.footprint_families`).
  :attr:`MemoryReport.exhaustive` is ``False`` when that could not decide
  everything; the violations reported are real either way.

:func:`host_tensor_end` gives the closed-form end of one tensor's footprint
(host tensors default to :data:`HOST_LAYOUT`, LBNHC).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from conformance.check import footprint

# This module's public face includes footprint's: its __all__, listed there only.
from conformance.check.footprint import *  # noqa: F403
from conformance.check.footprint import (
    DEFAULT_BUDGET,
    HOST_LAYOUT,
    MIN_PAGE_RUNS,
    OutOfBounds,
    Overlap,
    PageRef,
    Problem,
    TensorFootprint,
    out_of_bounds,
    tensor_footprints,
)
from conformance.check.footprint_families import large_config_overlaps, periodic_clean
from conformance.check.footprint_sweep import (
    Runs,
    enumerate_runs,
    run_dtype,
    self_overlaps,
    sweep_blocks,
    sweep_layers,
)
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig

__all__ = [
    "PERIODIC_FROM",
    "MemoryReport",
    "check_memory",
    "find_block_overlaps",
    "find_host_block_overlaps",
    "find_host_layer_overlaps",
    "find_host_out_of_bounds",
    "find_layer_overlaps",
    "find_out_of_bounds",
]
__all__ += footprint.__all__


@attrs.frozen
class MemoryReport:
    """Result of :func:`check_memory`.

    Attributes:
        out_of_bounds: P2 violations, one per tensor (its farthest page).
        block_overlaps: P3 violations.
        layer_overlaps: P4 violations, pages overlapping themselves first.
        problems: tensors that were skipped (see :func:`find_unusable_tensors`).
        exhaustive: ``False`` when the large-config path could not decide every
            pair (module docstring); the violations listed are real either way.
        runs: runs the checked tensors have in total.

    """

    out_of_bounds: tuple[OutOfBounds, ...]
    block_overlaps: tuple[Overlap, ...]
    layer_overlaps: tuple[Overlap, ...]
    problems: tuple[Problem, ...]
    exhaustive: bool
    runs: int

    @property
    def ok(self) -> bool:
        """No violation found (problems and sampling are reported separately)."""
        return not (self.out_of_bounds or self.block_overlaps or self.layer_overlaps)


#: Runs from which a config is first shown clean in closed form (module docstring):
#: below it, enumerating costs less than the pair test's set-up.
PERIODIC_FROM = 20_000

#: Runs of a config kept for the next check of the same config (6 int64 arrays
#: each: 48 MB at this count).
_KEEP_RUNS = 1_000_000
#: Configs whose analysis is kept: one placement observation's configs.
_KEEP_CONFIGS = 4


@attrs.define(eq=False)
class _Analysed:
    """A config's footprint geometry, and its enumerated runs once asked for."""

    geometries: list[TensorFootprint]
    problems: list[Problem]
    runs: Runs | None = None
    shown_clean: dict[int, bool] = attrs.field(factory=dict)

    def clean(self, dtype: Any, budget: int) -> bool:
        """P3 and P4 shown to hold in closed form (kept per budget)."""
        if budget not in self.shown_clean:
            self.shown_clean[budget] = periodic_clean(self.geometries, dtype, budget=budget)
        return self.shown_clean[budget]

    def all_runs(self, dtype: Any, *, keep: bool) -> Runs:
        if self.runs is not None:
            return self.runs
        runs = enumerate_runs(
            self.geometries,
            dtype,
            [np.arange(g.num_blocks, dtype=np.int64) for g in self.geometries],
            [np.arange(g.num_layers, dtype=np.int64) for g in self.geometries],
        )
        if keep:
            self.runs = runs
        return runs


# P2, P3 and P4 are separate invariants judged one after another on the same
# config, and laying out and enumerating its pages is most of what each costs:
# the last few configs' analyses are kept, by identity (an entry holds its
# config, so the id cannot be reused while it is kept).
_RECENT: dict[tuple[int, str, bool, int], tuple[KVCacheConfig, _Analysed]] = {}


def _analysed(
    config: KVCacheConfig, layout: KVCacheLayout | str, host: bool, page_cap: int
) -> _Analysed:
    key = (id(config), KVCacheLayout.parse(layout).value, host, page_cap)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is config:
        return hit[1]
    geometries, problems = tensor_footprints(config, layout, host=host, max_runs=page_cap)
    analysed = _Analysed(geometries, problems)
    _RECENT[key] = (config, analysed)
    while len(_RECENT) > _KEEP_CONFIGS:
        del _RECENT[next(iter(_RECENT))]
    return analysed


def check_memory(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    host: bool = False,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
    properties: frozenset[str] = frozenset({"P2", "P3", "P4"}),
    separate: bool = False,
    periodic_from: int = PERIODIC_FROM,
) -> MemoryReport:
    """Check P2, P3 and P4 over the device (or, with ``host``, the host) tensors of ``config``.

    ``layout`` is the resolved layout of the plan (host tensors are always
    LBNHC in vLLM, so pass that for ``host=True``).  At most ``limit``
    violations are listed per property.  Configs with more than ``budget``
    runs take the large-config path (module docstring), whose result says
    whether it was exhaustive.  Configs with at least ``periodic_from`` runs
    are first tried in closed form (module docstring); the result is the same
    either way.  Never raises for a well-typed config.

    ``separate``: the builder declared its bytes per block
    (``_get_pool_bytes_per_block``), so device tensors of different sizes are
    separate allocations (contract.md#pool-bytes-hook) and each is judged as
    its own address space.  Otherwise every device tensor is a view of the one
    backing, whatever sizes a builder gave them: pages of tensors of
    different sizes that meet are a finding, never hidden.
    """
    allocations = _allocations(config, host) if separate else []
    if len(allocations) > 1:
        # Several device allocations (contract.md#pool-bytes-hook): each is its
        # own address space, told apart by its size, so pages of two never meet.
        parts = [
            _remapped(
                check_memory(
                    attrs.evolve(
                        config, kv_cache_tensors=[config.kv_cache_tensors[i] for i in idx]
                    ),
                    layout,
                    limit=limit,
                    budget=budget,
                    properties=properties,
                    separate=False,
                    periodic_from=periodic_from,
                ),
                idx,
            )
            for idx in allocations
        ]
        return MemoryReport(
            out_of_bounds=tuple(o for p in parts for o in p.out_of_bounds)[:limit],
            block_overlaps=tuple(o for p in parts for o in p.block_overlaps)[:limit],
            layer_overlaps=tuple(o for p in parts for o in p.layer_overlaps)[:limit],
            problems=tuple(o for p in parts for o in p.problems),
            exhaustive=all(p.exhaustive for p in parts),
            runs=sum(p.runs for p in parts),
        )
    # Pages are folded analytically, so only hostile shapes need many runs per
    # page; the floor keeps tiny budgets (used in tests) from skipping tensors.
    page_cap = max(budget, MIN_PAGE_RUNS)
    analysed = _analysed(config, layout, host, page_cap)
    geometries, problems = analysed.geometries, analysed.problems
    by_index = {g.tensor_index: g for g in geometries}
    total = sum(g.num_pages * len(g.runs.starts) for g in geometries)
    oob = out_of_bounds(geometries, limit) if "P2" in properties else []
    want3, want4 = "P3" in properties, "P4" in properties
    p3: list[Overlap] = []
    p4: list[Overlap] = self_overlaps(geometries, limit) if want4 else []
    exhaustive = True
    dtype = run_dtype(geometries)
    if (want3 or want4) and not (total >= periodic_from and analysed.clean(dtype, budget)):
        if total <= budget:
            runs = analysed.all_runs(dtype, keep=total <= _KEEP_RUNS)
            if want3:
                p3 = sweep_blocks(by_index, runs, limit)
            if want4:
                p4 += sweep_layers(by_index, runs, limit)
        else:
            p3, large4, exhaustive = large_config_overlaps(
                geometries, dtype, budget=budget, limit=limit, want3=want3, want4=want4
            )
            p4 += large4
    return MemoryReport(
        out_of_bounds=tuple(oob),
        block_overlaps=tuple(p3[:limit]),
        layer_overlaps=tuple(p4[:limit]),
        problems=tuple(problems),
        exhaustive=exhaustive,
        runs=total,
    )


def _allocations(config: KVCacheConfig, host: bool) -> list[list[int]]:
    """The device tensors' indexes, one list per allocation (one size); host: one list."""
    if host:
        return []
    by_size: dict[int, list[int]] = {}
    for i, t in enumerate(config.kv_cache_tensors):
        if not t.host_resident:
            by_size.setdefault(t.size, []).append(i)
    return list(by_size.values())


def _remapped(report: MemoryReport, index: list[int]) -> MemoryReport:
    """``report`` of a sub-config whose tensor ``i`` is the config's ``index[i]``."""

    def page(ref: PageRef) -> PageRef:
        return attrs.evolve(ref, tensor_index=index[ref.tensor_index])

    return attrs.evolve(
        report,
        out_of_bounds=tuple(attrs.evolve(o, page=page(o.page)) for o in report.out_of_bounds),
        block_overlaps=tuple(
            attrs.evolve(o, a=page(o.a), b=page(o.b)) for o in report.block_overlaps
        ),
        layer_overlaps=tuple(
            attrs.evolve(o, a=page(o.a), b=page(o.b)) for o in report.layer_overlaps
        ),
        problems=tuple(
            attrs.evolve(p, tensor_index=index[p.tensor_index]) for p in report.problems
        ),
    )


def find_out_of_bounds(
    config: KVCacheConfig, layout: KVCacheLayout | str, *, limit: int = 10, host: bool = False
) -> list[OutOfBounds]:
    """P2: tensors with a page outside ``[0, size)``, one entry (the farthest page) per tensor.

    Offsets are non-negative by construction of the records, so only the far
    end can overflow.  Exact and O(tensors).  Skipped tensors: see
    :func:`find_unusable_tensors`.
    """
    geometries, _ = tensor_footprints(config, layout, host=host)
    return out_of_bounds(geometries, limit)


def find_block_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    limit: int = 10,
    host: bool = False,
    budget: int = DEFAULT_BUDGET,
    separate: bool = False,
) -> list[Overlap]:
    """P3: pages of different block IDs sharing bytes, across all tensors and groups.

    Same-block pages of different groups may alias (P5) and are not reported.
    Exact up to ``budget`` runs; beyond, see :func:`check_memory` for whether
    the result is exhaustive.
    """
    report = check_memory(
        config,
        layout,
        host=host,
        limit=limit,
        budget=budget,
        properties=frozenset({"P3"}),
        separate=separate,
    )
    return list(report.block_overlaps)


def find_layer_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    limit: int = 10,
    host: bool = False,
    budget: int = DEFAULT_BUDGET,
    separate: bool = False,
) -> list[Overlap]:
    """P4: pages of one group and one block that share bytes, and pages overlapping themselves.

    A self-overlapping page is reported once per tensor, as its first page
    with ``a == b``.  Exact up to ``budget`` runs; beyond, see
    :func:`check_memory`.
    """
    report = check_memory(
        config,
        layout,
        host=host,
        limit=limit,
        budget=budget,
        properties=frozenset({"P4"}),
        separate=separate,
    )
    return list(report.layer_overlaps)


def find_host_out_of_bounds(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
) -> list[OutOfBounds]:
    """P2 over host-resident tensors, with ``config.host_num_blocks`` blocks (LBNHC by default)."""
    return find_out_of_bounds(config, layout, limit=limit, host=True)


def find_host_block_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P3 over host-resident tensors only (their own address space)."""
    return find_block_overlaps(config, layout, limit=limit, host=True, budget=budget)


def find_host_layer_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P4 over host-resident tensors only (their own address space)."""
    return find_layer_overlaps(config, layout, limit=limit, host=True, budget=budget)
