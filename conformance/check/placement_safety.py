"""Memory-safety invariants of a placed config (contract.md#memory-safety).

Every device page lies inside its backing, pages of different block IDs
never overlap, and layers of one group never overlap within a block; the
footprints are :mod:`conformance.check.memory`'s exact analysis.
"""

from __future__ import annotations

from collections.abc import Iterable

from conformance.check import memory
from conformance.check.catalog import Check, flag, judged_on
from conformance.check.observations import PlacementObservation
from conformance.check.placement import (
    Configs,
    first_findings,
    honest_configs,
    register_placement,
)
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig

__all__ = ["distinct", "page_flag"]


def page_flag(message: str, page: memory.PageRef, byte_range: tuple[int, int]) -> Violation:
    """A :func:`~conformance.check.catalog.flag` at ``page`` (its layer and block) and its bytes."""
    return flag(message, layer=page.layer, block=page.block, byte_range=byte_range)


def distinct(found: Iterable[memory.Overlap]) -> list[memory.Overlap]:
    """The overlaps of two pages: a layer placed twice overlapping itself is a coverage finding."""
    return [ov for ov in found if ov.a.layer != ov.b.layer or ov.a.block != ov.b.block]


def _memory_check(kind: str) -> Check:
    def check(obs: PlacementObservation, configs: Configs) -> list[Violation]:
        return first_findings(sorted(configs.items()), lambda n, c: _findings(kind, obs, n, c))

    return judged_on(honest_configs, check)


def _findings(kind: str, obs: PlacementObservation, n: int, c: KVCacheConfig) -> list[Violation]:
    """What the memory check of ``kind`` finds in ``c``, placed at ``n`` blocks."""
    if any(t.host_resident for t in c.kv_cache_tensors):
        return []  # device pages beside host groups are KV-HOST-DEVICE-SAFE's
    if kind == "bounds":
        return [
            page_flag(
                f"at {n} blocks tensor {o.page.tensor_index}'s page ends past the backing "
                f"of {o.size} bytes",
                o.page,
                o.byte_range,
            )
            for o in memory.find_out_of_bounds(c, obs.layout, limit=3)
        ]
    finder = memory.find_block_overlaps if kind == "blocks" else memory.find_layer_overlaps
    # A layer placed twice overlapping itself is KV-PLACE-LAYER-ONCE's finding.
    # Only a builder that declares its bytes per block may place
    # several allocations (contract.md#pool-bytes-hook).
    separate = obs.declared_pool_bytes is not None
    found = distinct(finder(c, obs.layout, limit=64, separate=separate))
    return [
        page_flag(
            f"at {n} blocks {ov.a.layer!r} block {ov.a.block} (tensor "
            f"{ov.a.tensor_index}) overlaps {ov.b.layer!r} block {ov.b.block} (tensor "
            f"{ov.b.tensor_index})",
            ov.a,
            ov.byte_range,
        )
        for ov in found[:3]
    ]


register_placement(
    "KV-PLACE-IN-BOUNDS",
    "every page lies inside its backing",
    "memory-safety",
    _memory_check("bounds"),
)
register_placement(
    "KV-PLACE-NO-BLOCK-ALIAS",
    "pages of different block IDs never overlap",
    "memory-safety",
    _memory_check("blocks"),
)
register_placement(
    "KV-PLACE-NO-LAYER-OVERLAP",
    "layers of one group never overlap within a block",
    "memory-safety",
    _memory_check("layers"),
)
