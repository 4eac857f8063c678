"""Shared helpers of the differential tests: run kvref and vLLM on one problem and compare.

"kvref" is :func:`kvref.plan_kv_cache` with the reference builder; "vLLM" is
the installed vLLM's own Core flow with its ``DefaultKVCacheConfigBuilder``,
reached through the kit's adapter (``kvref_core``), so both sides speak kvref
records.  Both plan as the installed release (:data:`INSTALLED`): a problem's
``vllm_version`` is replaced by it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pytest

# tests/ is on sys.path during a full run, and tests/vllm then looks like a
# namespace package called "vllm": ask for a real vLLM module.
pytest.importorskip("vllm.v1.core.kv_cache_planning")

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from conformance.harness.vllm_adapter import wrap_vllm_builder
from kvref import (
    InsufficientMemoryError,
    KVCachePlan,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    plan_kv_cache,
)
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs
from kvref.versions import VllmVersion, installed_vllm_version

VLLMDefault = wrap_vllm_builder(DefaultKVCacheConfigBuilder)

_installed = installed_vllm_version()
if _installed is None:  # pragma: no cover - an unsupported vLLM is a broken test environment
    pytest.skip("the installed vLLM is not a release kvref supports", allow_module_level=True)
#: The release both sides plan as: the installed vLLM's.
INSTALLED: VllmVersion = _installed


def at_installed(config: PlanningConfig) -> PlanningConfig:
    """``config`` planned as the installed vLLM release."""
    if config.vllm_version == INSTALLED:
        return config
    return config.with_vllm_version(INSTALLED)


Workers = Sequence[Mapping[str, KVCacheSpec]]


def split_stages(
    model: Mapping[str, KVCacheSpec], workers: int | Sequence[int]
) -> list[dict[str, KVCacheSpec]]:
    """Contiguous PP split: even (vLLM's default) for a count, else the given stage sizes."""
    items = list(model.items())
    if isinstance(workers, int):
        cuts = [len(items) * k // workers for k in range(workers + 1)]
    else:
        cuts = [sum(workers[:k]) for k in range(len(workers) + 1)]
    return [dict(items[cuts[k] : cuts[k + 1]]) for k in range(len(cuts) - 1)]


@attrs.frozen
class Outcome:
    """A plan, or the error that replaced it."""

    plan: KVCachePlan | None
    error: BaseException | None

    @property
    def kind(self) -> str:
        """``ok``, ``insufficient`` (typed memory error) or ``refused`` (any other error)."""
        if self.error is None:
            return "ok"
        if isinstance(self.error, InsufficientMemoryError):
            return "insufficient"
        return "refused"


def _run(flow: Callable[[], KVCachePlan]) -> Outcome:
    try:
        return Outcome(flow(), None)
    except Exception as exc:
        return Outcome(None, exc)


def run_kvref(config: PlanningConfig, workers: Workers, memory: Sequence[int]) -> Outcome:
    """kvref's Core flow with the reference builder, as the installed vLLM release."""
    config = at_installed(config)
    return _run(
        lambda: plan_kv_cache(ReferenceKVCacheConfigBuilder, config, list(workers), list(memory))
    )


def run_vllm(config: PlanningConfig, workers: Workers, memory: Sequence[int]) -> Outcome:
    """vLLM's Core flow with its default builder, converted to kvref records."""
    config = at_installed(config)
    core: Any = VLLMDefault.kvref_core  # type: ignore[attr-defined]
    return _run(lambda: core(None, config, list(workers), list(memory)))


def empty_uniform_projection(plan: KVCachePlan, workers: Workers) -> bool:
    """Whether a uniform-type global group has no layer on some worker (vLLM's PP defect)."""
    return any(
        isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
        and not any(n in w for n in g.layer_names)
        for g in plan.global_groups
        for w in workers
    )


def describe_tensors(plan: KVCachePlan) -> list[list[tuple[Any, ...]]]:
    """Per worker: ``(layers, size, layer_stride, block_stride, offset, host)`` of every tensor."""
    return [
        [
            (t.layers, t.size, t.layer_stride, t.block_stride, t.offset, t.host_resident)
            for t in c.kv_cache_tensors
        ]
        for c in plan.configs
    ]


def assert_same_plan(ref: KVCachePlan, vl: KVCachePlan) -> None:
    """Same groups, block count, length, tensors (sizes, strides, offsets) and worker figures."""
    assert vl.global_groups == ref.global_groups
    assert vl.num_blocks == ref.num_blocks
    assert vl.max_model_len == ref.max_model_len
    assert describe_tensors(vl) == describe_tensors(ref)
    assert [c.kv_cache_groups for c in vl.configs] == [c.kv_cache_groups for c in ref.configs]
    assert [c.num_blocks for c in vl.configs] == [c.num_blocks for c in ref.configs]
    assert [c.kv_tp_replicas for c in vl.configs] == [c.kv_tp_replicas for c in ref.configs]
    assert [c.needs_kv_cache_zeroing for c in vl.configs] == [
        c.needs_kv_cache_zeroing for c in ref.configs
    ]
    for rw, vw in zip(ref.workers, vl.workers, strict=True):
        assert (vw.pool_bytes_per_block, vw.check_memory, vw.needed_memory) == (
            rw.pool_bytes_per_block,
            rw.check_memory,
            rw.needed_memory,
        )


def assert_agree(config: PlanningConfig, workers: Workers, memory: Sequence[int]) -> str:
    """Run both flows and assert they agree, except where the reference differs on purpose.

    See contract.md#deliberate-differences.

    Returns the outcome kind (``ok``, ``insufficient``, ``refused``), or
    ``pp-projection`` when the problem hits vLLM 0.33.0's PP projection defect;
    the defect itself is then asserted (vLLM's worker config names layers the
    worker does not hold; kvref's does not).  vLLM 0.34.0 fixed it (issue
    54711): there such problems must agree like any other.
    """
    ref = run_kvref(config, workers, memory)
    vl = run_vllm(config, workers, memory)
    projection_defect = not at_installed(config).rules.placement_walks_layer_specs
    if projection_defect and ref.plan is not None and empty_uniform_projection(ref.plan, workers):
        assert ref.kind == "ok"
        assert_pp_projection_defect(vl, workers)
        return "pp-projection"
    if mixed_layer_outer_strides(config, workers):
        assert_common_stride_difference(config, ref, vl)
        return "common-stride"
    assert vl.kind == ref.kind, f"kvref: {ref.error!r}\nvLLM: {vl.error!r}"
    if ref.plan is not None and vl.plan is not None:
        assert_same_plan(ref.plan, vl.plan)
    return ref.kind


def mixed_layer_outer_strides(config: PlanningConfig, workers: Workers) -> bool:
    """Whether the reference's global groups need its common layer-outer stride.

    See contract.md#deliberate-differences.

    That is: a layer-outer layout, more than one group, and layers whose
    ``round_up(page, alignment)`` differ.
    """
    if config.kv_cache_layout.is_block_outermost:
        return False
    merged = {n: s for w in workers for n, s in w.items()}
    try:
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(at_installed(config), merged)
    except Exception:
        return False
    device = [g for g in groups if not g.host_resident and g.layer_names]
    strides = {s.block_stride for g in device for _, s in g.layer_specs()}
    return len(device) > 1 and len(strides) > 1


def assert_common_stride_difference(config: PlanningConfig, ref: Outcome, vl: Outcome) -> None:
    """kvref's plan has no aliasing block IDs; vLLM's, when it has two blocks or more, has some."""
    from conformance.check.memory import find_block_overlaps

    if ref.plan is not None:
        for c in ref.plan.configs:
            assert find_block_overlaps(c, config.kv_cache_layout) == []
    if vl.plan is None or vl.plan.num_blocks < 2:
        return
    # Block IDs alias inside one worker's tensors: only a worker that holds
    # layers of two strides has them (a pipeline split may give each worker one).
    mixed = [
        c
        for c in vl.plan.configs
        if len({c.kv_cache_groups[g].layer_spec(n).block_stride for g, n in _device_layers(c)}) > 1
    ]
    if mixed:
        assert any(find_block_overlaps(c, config.kv_cache_layout) for c in mixed)


def _device_layers(config: Any) -> list[tuple[int, str]]:
    """``(group index, layer)`` of every layer of the config's device groups."""
    return [
        (g, name)
        for g, group in enumerate(config.kv_cache_groups)
        if not group.host_resident
        for name in group.layer_names
    ]


def assert_pp_projection_defect(vl: Outcome, workers: Workers) -> None:
    """vLLM either fails untyped or gives a worker a tensor of layers it does not hold."""
    if vl.plan is None:
        assert vl.error is not None
        return
    foreign = [
        sorted({n for t in c.kv_cache_tensors for n in t.layers} - set(w))
        for c, w in zip(vl.plan.configs, workers, strict=True)
    ]
    assert any(foreign), "expected vLLM's PP projection defect to place foreign layers"


def group_names(groups: Sequence[KVCacheGroupSpec]) -> list[tuple[str, ...]]:
    """The layer names of every group, in order."""
    return [g.layer_names for g in groups]
