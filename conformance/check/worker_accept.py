"""Placements vLLM's GPU worker accepts (contract.md#worker-acceptance).

The ``KV-PLACE-*`` invariants say whether a placement is safe by the
interface's text.  vLLM's CUDA worker adds rules of its own when it
allocates and views the placement, and refuses at startup a placement that
breaks them, however safe on paper: these invariants are that second
verdict, "accepted by vLLM's worker", each named for the release whose
worker has the rule (``PlanningConfig.vllm_version``).  A rule the run's
release does not have makes its examples not applicable, never a pass.

- ``KV-WORKER-ONE-BACKING`` (every release): one size for every device tensor;
- ``KV-WORKER-LAYER-REGIONS`` (the extensible KV cache, LBNHC/LBHNC): layer
  regions of ``num_blocks`` blocks that tile the backing from byte 0, and
  pages inside their own region;
- ``KV-WORKER-BLOCK-SEGMENTS`` (the extensible KV cache, every other layout):
  one block stride, and a backing of whole ``num_blocks``-block segments.

The segment arithmetic is the kit's own (:mod:`conformance.check.segments`).
"""

from __future__ import annotations

from typing import Any

from conformance.check.catalog import (
    Check,
    Invariant,
    Unjudged,
    judged_in_core,
    judged_on,
    register,
    stamped,
)
from conformance.check.catalog import violation as _v
from conformance.check.footprint import MIN_PAGE_RUNS, tensor_footprints
from conformance.check.observations import PlacementObservation
from conformance.check.placement import first_findings, honest_configs, register_placement
from conformance.check.segments import (
    Refusal,
    layer_outer,
    refusals,
    region_escapes,
    worker_segments,
)
from conformance.check.violations import Violation
from kvref.config import PlanningConfig
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig

__all__ = ["capacity_first", "extensible_gate", "register_extensible"]

#: Where vLLM's GPU worker allocates the one device backing (both releases).
_ALLOCATE = "allocate_kv_cache, vllm/v1/worker/utils.py"


def _version(config: PlanningConfig) -> str:
    return f"vLLM {config.vllm_version}"


def extensible_gate(obs: Any) -> Unjudged | None:
    """Why the extensible KV cache's rules do not judge ``obs`` (``None``: they do).

    Not applicable under a release without it; not reached where vLLM turns
    it off (``num_gpu_blocks_override``) or refuses the run's layout first (a
    KV connector in a layout that is not block-compact).
    """
    config: PlanningConfig = obs.config
    rules = config.rules
    if not rules.extensible_kv_cache:
        return Unjudged(
            f"{_version(config)} has no extensible KV cache (it came with vLLM 0.34.0): its "
            "worker allocates the planned blocks whole, so this rule does not exist there",
            applicable=False,
        )
    if config.num_gpu_blocks_override is not None:
        return Unjudged(
            f"num_gpu_blocks_override turns {_version(config)}'s extensible KV cache off "
            "(VllmConfig._resolve_extensible_kv_cache, vllm/config/vllm.py)"
        )
    layout: KVCacheLayout = config.kv_cache_layout
    if config.kv_connector_layout is not None and not layout.is_block_compact:
        return Unjudged(
            f"{_version(config)} runs a KV connector with the extensible KV cache only in a "
            f"block-compact layout (LBNHC, LBHNC, BLHNC, BLNHC), never {layout.name}: "
            "resolve_kv_cache_layout (vllm/v1/attention/backends/utils.py) refuses it before "
            "any placement ('KV connectors with the extensible KV cache need a block-compact "
            "layout')"
        )
    return None


def capacity_first(
    obs: PlacementObservation, configs: dict[int, KVCacheConfig]
) -> list[tuple[int, KVCacheConfig]]:
    """``configs`` by block count, the count under test first: its finding reads best."""
    return sorted(configs.items(), key=lambda item: (item[0] != obs.num_blocks, item[0]))


def register_extensible(id_: str, title: str, anchor: str, check: Check, *, module: str) -> None:
    """Declare an invariant of the extensible KV cache, judged in placement and Core's flow.

    Not on the profiling path: with the extensible KV cache vLLM's worker
    allocates no profiling placement (``profile_cudagraph_memory`` returns
    early), only the capacity Core plans.
    """
    register(
        Invariant(
            id=id_,
            title=title,
            anchor=anchor,
            scenarios=("placement", "core"),
            check=judged_in_core(id_, stamped(id_, check)),
        ),
        module=module,
    )


def _one_backing(obs: PlacementObservation, configs: dict[int, KVCacheConfig]) -> list[Violation]:
    return first_findings(capacity_first(obs, configs), lambda n, c: _backings(obs, n, c))


def _backings(obs: PlacementObservation, n: int, c: KVCacheConfig) -> list[Violation]:
    """The finding that ``c`` (at ``n`` blocks) names several backing sizes, if it does."""
    sizes = sorted({t.size for t in c.device_tensors})
    if len(sizes) < 2:
        return []
    version = _version(obs.config)
    why = (
        f"; _get_pool_bytes_per_block lets Core plan several device allocations, but no "
        f"{version} GPU worker allocates them"
        if obs.declared_pool_bytes is not None
        else ""
    )
    return [
        _v(
            "KV-WORKER-ONE-BACKING",
            f"at {n} blocks the device tensors name {len(sizes)} backing sizes {sizes[:4]}; "
            f"{version}'s GPU worker views every device tensor in one backing allocation and "
            f"refuses this at startup (AssertionError in {_ALLOCATE}: 'KV cache tensors must "
            f"share one backing allocation.'){why}",
        )
    ]


register_placement(
    "KV-WORKER-ONE-BACKING",
    "vLLM's GPU worker accepts the placement: one backing size for all device tensors",
    "worker-acceptance",
    judged_on(honest_configs, _one_backing),
)


def _refused(obs: PlacementObservation, n: int, found: Refusal) -> Violation:
    return _v(
        "",
        f"at {n} blocks {found.detail}; {_version(obs.config)}'s GPU worker refuses this "
        f"placement at startup with the extensible KV cache (rule: {found.rule}; "
        f"{found.vllm_says})",
        layer=found.layer,
    )


def _family(obs: PlacementObservation, outer: bool) -> Unjudged | None:
    """Whether ``obs``'s layout is the family a segment invariant judges."""
    gate = extensible_gate(obs)
    if gate is not None:
        return gate
    if layer_outer(obs.layout) == outer:
        return None
    other = "KV-WORKER-BLOCK-SEGMENTS" if outer else "KV-WORKER-LAYER-REGIONS"
    return Unjudged(
        f"{obs.layout.name} is cut by another rule of the worker ({other} judges it)",
        applicable=False,
    )


def _escapes(obs: PlacementObservation, n: int, c: KVCacheConfig) -> list[Violation]:
    """Pages of ``c`` (at ``n`` blocks) outside the layer region vLLM's worker cuts for them."""
    segments = worker_segments(c, obs.layout)
    if segments is None:
        return []
    geometries, _ = tensor_footprints(c, obs.layout, max_runs=MIN_PAGE_RUNS)
    return [
        _v(
            "",
            f"at {n} blocks tensor {e.tensor_index}'s page of block {e.block} uses bytes "
            f"[{e.byte_range[0]}, {e.byte_range[1]}), "
            + (
                f"outside its layer region [{e.segment[0]}, {e.segment[1]})"
                if e.segment is not None
                else "before every layer region"
            )
            + f"; {_version(obs.config)}'s worker pads every layer region apart to its "
            "mapping granule and drops the bytes after the last region "
            "(pad_kv_cache_segments, vllm/v1/worker/extensible_kv_cache.py), so the "
            "page would read another region's padding or unmapped memory",
            layer=e.layer,
            block=e.block,
            byte_range=e.byte_range,
        )
        for e in region_escapes(geometries, segments)
    ]


def _segments(outer: bool) -> Check:
    """The check of the segment invariant of layer-outer layouts (``outer``) or the others.

    Both report the worker's refusals of a placement; in layer-outer layouts
    also pages that escape their layer region.
    """

    def find(obs: PlacementObservation, n: int, c: KVCacheConfig) -> list[Violation]:
        out = [_refused(obs, n, r) for r in refusals(c, obs.layout)[:3]]
        return out + _escapes(obs, n, c) if outer else out

    def check(obs: PlacementObservation, configs: dict[int, KVCacheConfig]) -> list[Violation]:
        return first_findings(capacity_first(obs, configs), lambda n, c: find(obs, n, c))

    return judged_on(honest_configs, check, gate=lambda obs: _family(obs, outer))


register_extensible(
    "KV-WORKER-LAYER-REGIONS",
    "vLLM's worker accepts the placement: layer regions of num_blocks blocks tile the backing "
    "(LBNHC, LBHNC)",
    "worker-acceptance",
    _segments(outer=True),
    module=__name__,
)
register_extensible(
    "KV-WORKER-BLOCK-SEGMENTS",
    "vLLM's worker accepts the placement: one block stride, whole num_blocks-block segments "
    "(BLHNC, BLNHC, BHLNC, LHBNC)",
    "worker-acceptance",
    _segments(outer=False),
    module=__name__,
)
