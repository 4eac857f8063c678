"""Memory-safety invariants of a placed config (contract.md#memory-safety).

Every device page lies inside its backing, pages of different block IDs
never overlap, and layers of one group never overlap within a block; the
footprints are :mod:`conformance.check.memory`'s exact analysis.
"""

from __future__ import annotations

from conformance.check import memory
from conformance.check.catalog import Check
from conformance.check.catalog import violation as _v
from conformance.check.observations import PlacementObservation
from conformance.check.placement import honest_configs, register_placement
from conformance.check.violations import Violation


def _memory_check(kind: str) -> Check:
    invariant = {
        "bounds": "KV-PLACE-IN-BOUNDS",
        "blocks": "KV-PLACE-NO-BLOCK-ALIAS",
        "layers": "KV-PLACE-NO-LAYER-OVERLAP",
    }[kind]

    def check(obs: PlacementObservation) -> list[Violation] | None:
        configs = honest_configs(obs)
        if configs is None:
            return None
        out: list[Violation] = []
        for n, c in sorted(configs.items()):
            if any(t.host_resident for t in c.kv_cache_tensors):
                continue  # device pages beside host groups are KV-HOST-DEVICE-SAFE's
            if kind == "bounds":
                out += [
                    _v(
                        invariant,
                        f"at {n} blocks tensor {o.page.tensor_index}'s page ends past the backing "
                        f"of {o.size} bytes",
                        layer=o.page.layer,
                        block=o.page.block,
                        byte_range=o.byte_range,
                    )
                    for o in memory.find_out_of_bounds(c, obs.layout, limit=3)
                ]
            else:
                finder = (
                    memory.find_block_overlaps if kind == "blocks" else memory.find_layer_overlaps
                )
                # A layer placed twice overlapping itself is KV-PLACE-LAYER-ONCE's finding.
                # Only a builder that declares its bytes per block may place
                # several allocations (contract.md#pool-bytes-hook).
                separate = obs.declared_pool_bytes is not None
                found = [
                    ov
                    for ov in finder(c, obs.layout, limit=64, separate=separate)
                    if ov.a.layer != ov.b.layer or ov.a.block != ov.b.block
                ]
                out += [
                    _v(
                        invariant,
                        f"at {n} blocks {ov.a.layer!r} block {ov.a.block} (tensor "
                        f"{ov.a.tensor_index}) overlaps {ov.b.layer!r} block {ov.b.block} (tensor "
                        f"{ov.b.tensor_index})",
                        layer=ov.a.layer,
                        block=ov.a.block,
                        byte_range=ov.byte_range,
                    )
                    for ov in found[:3]
                ]
            if out:
                break
        return out

    return check


register_placement(
    "KV-PLACE-IN-BOUNDS",
    "every page lies inside its backing",
    "memory-safety",
    _memory_check("bounds"),
    module=__name__,
)
register_placement(
    "KV-PLACE-NO-BLOCK-ALIAS",
    "pages of different block IDs never overlap",
    "memory-safety",
    _memory_check("blocks"),
    module=__name__,
)
register_placement(
    "KV-PLACE-NO-LAYER-OVERLAP",
    "layers of one group never overlap within a block",
    "memory-safety",
    _memory_check("layers"),
    module=__name__,
)
