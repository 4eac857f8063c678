"""The ``host`` scenario: a model whose config keeps some layers on the host.

Half the examples of the built-in families are HiSparse-served models, whose
host pool is HiSparse's; the others keep a prefix of same-spec layers on the
host with a host pool sized for a drawn number of blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import strategies as st

from conformance.check.gate import judge_pool_bytes
from conformance.check.observations import HostObservation
from conformance.generate import strategies as kst
from conformance.generate.limits import Limits
from conformance.harness.hooks import (
    Context,
    call_grouping,
    call_placement,
    call_pool_bytes,
    valid_groups,
)
from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import ProblemDraw, without_host
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["HOST", "observe_host"]


def _models(draw: st.DrawFn) -> st.SearchStrategy[kst.Model] | None:
    if draw(st.booleans()):
        # Half the host examples are HiSparse-served models: their host
        # pool is HiSparse's, which the host invariants judge too.
        from conformance.generate.families.hisparse import hisparse_models

        return hisparse_models()
    return None


def _host_config(
    draw: st.DrawFn, config: PlanningConfig, merged: Mapping[str, KVCacheSpec]
) -> PlanningConfig:
    first = next(iter(merged.values()), None)
    same = [n for n, s in merged.items() if s == first]
    if not same:
        hypothesis.reject()
    count = draw(st.integers(1, len(same)))
    host = same[:count]
    # Host pages sit in LBNHC at their aligned block stride.
    host_pages = sum(merged[n].block_stride for n in host)
    host_blocks = draw(st.integers(1, 64))
    return attrs.evolve(
        config,
        host_resident_layers=frozenset(host),
        host_pool_bytes=host_pages * host_blocks + draw(st.integers(0, host_pages - 1)),
    )


def _config(
    draw: st.DrawFn,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    limits: Limits,
) -> PlanningConfig:
    if config.hisparse is not None:
        # HiSparse's host pool is the host part: the generator's own host layers go.
        return without_host(config)
    if not limits.draws_generic_host():
        hypothesis.reject()  # a vendor model without HiSparse: nothing to keep on the host
    merged: dict[str, KVCacheSpec] = {}
    for w in workers:
        merged.update(w)
    # A model-declared grouping owns every layer's group, host residency
    # included (vLLM refuses it beside HiSparse): host examples have none.
    return _host_config(draw, attrs.evolve(config, model_kv_cache_grouping=None), merged)


def _describe(config: PlanningConfig) -> str:
    return (
        f", host_resident_layers={sorted(config.host_resident_layers)}, "
        f"host_pool_bytes={config.host_pool_bytes}"
    )


_DRAW = ProblemDraw(models=_models, config=_config, describe=_describe)


def observe_host(
    ctx: Context,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
) -> HostObservation:
    """Group and place a model whose config keeps some layers on the host."""
    builder = ctx.factory()
    groups_result, _ = call_grouping(ctx.guard, builder, config, specs)
    placed = device_only = pool = None
    verdicts: dict[str, Any] = {}
    if valid_groups(config, specs, groups_result):
        groups = list(groups_result.value)
        placed, _ = call_placement(ctx.guard, builder, config, groups, num_blocks)
        pool = call_pool_bytes(ctx.guard, builder, config, groups)[0] if groups else None
        if placed.ok and pool is not None and pool.ok:
            # Core asks about every group, host ones included: its answer
            # must count the device bytes alone.
            verdicts = judge_pool_bytes(config, groups, placed, num_blocks, pool)
        device_groups = [g for g in groups if not g.host_resident]
        if config.hisparse is None:
            # HiSparse's placement needs its source group (it sizes the host
            # pool from it), so there is no device-only twin to compare with.
            device_only, _ = call_placement(ctx.guard, builder, config, device_groups, num_blocks)
    return HostObservation(
        config=config,
        specs=dict(specs),
        groups=groups_result,
        placed=placed,
        device_only=device_only,
        num_blocks=num_blocks,
        device=ctx.device,
        max_alloc_bytes=ctx.max_alloc_bytes,
        pool_bytes=pool,
        pool_verdicts=verdicts,
    )


def _admits(family: str, limits: Limits) -> bool:
    """Whether ``family`` has host examples for a builder with ``limits``.

    An attention-free model has no layer to keep on the host; outside
    HiSparse a host example needs generic host residency.
    """
    from conformance.generate.families import HISPARSE_FAMILIES

    if family == "attention_free":
        return False
    return limits.draws_generic_host() or family in HISPARSE_FAMILIES


def _observe(ctx: Context, ex: Any) -> HostObservation:
    return observe_host(ctx, ex.config, ex.merged, ex.num_blocks)


def _undrawable(limits: Limits) -> str:
    if limits.draws_generic_host():
        return "none of its models has a layer to keep on the host"
    return (
        "this builder takes host-resident layers only as HiSparse's source storage (it "
        "declares host_outside_hisparse unsupported, as vLLM 0.33.0's adapter does), and "
        "none of the models is HiSparse-served; give the kit such a model to judge them"
    )


HOST = Scenario(
    name="host",
    examples=_DRAW.examples_for,
    observe=_observe,
    admits=_admits,
    focused=True,
    undrawable=_undrawable,
)
