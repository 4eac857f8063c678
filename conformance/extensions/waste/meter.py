"""Efficiency warnings: a builder's plan against the reference's plan on the same problem.

Not an invariant: a plan that wastes memory can be perfectly legal, so a
warning never changes a verdict or the exit code (contract.md#efficiency).
For every ``core`` example where Core's flow returned a plan with the
builder, the kit plans the same problem with kvref's reference and compares
what the operator pays for: how many requests of ``max_model_len`` the same
memory holds at once (bytes per block, blocks that fit, per-request need and
the number of groups are shown with it), and the length auto-fit reaches.  A
plan that holds less than half of the reference's (:data:`THRESHOLD`) is
warned about, with the numbers of both plans.

Requests are counted on the limiting worker from Core's own figures:
``(num_blocks - 1) x bytes_per_block / need``, the usable blocks (the null
block never holds a request) over the blocks one request takes.

Rounding a block up to an allocator page (:data:`PAGE`) is not counted as
waste: the kit's examples have blocks of a few hundred bytes, where one page
of rounding looks like a large factor that no real model (whose blocks are
megabytes) pays.  A plan is warned about only when it also holds less than
half of what the reference would hold with every block rounded up to a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from conformance.extensions.waste.records import LISTED, PlanFigures, WasteSummary, WasteWarning
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.placement import pool_bytes_per_block
from kvref.planning import BuilderLike, KVCachePlan, plan_kv_cache
from kvref.records import KVCacheGroupSpec

__all__ = ["PAGE", "THRESHOLD", "WasteMeter", "compare_plans", "plan_figures"]

#: A plan is warned about when the reference's holds more than this many times as much.
THRESHOLD = 2.0
#: The allocator page a block may be rounded up to without counting as waste.
PAGE = 4096


def plan_figures(plan: KVCachePlan) -> PlanFigures | None:
    """The plan's figures on its limiting worker (``None``: no worker holds a KV layer)."""
    best: PlanFigures | None = None
    for worker in plan.workers:
        bpb, need = worker.pool_bytes_per_block, worker.needed_memory
        if bpb <= 0 or need <= 0:
            continue
        requests = max(plan.num_blocks - 1, 0) * bpb / need
        if best is None or requests < best.requests:
            best = PlanFigures(
                bytes_per_block=bpb,
                need_bytes=need,
                groups=len(plan.global_groups),
                num_blocks=plan.num_blocks,
                max_model_len=plan.max_model_len,
                requests=requests,
            )
    return best


def compare_plans(
    builder: PlanFigures, reference: PlanFigures, *, scenario: str, example: str
) -> WasteWarning | None:
    """A warning when ``builder`` holds more than :data:`THRESHOLD` times less (``None``: not)."""
    ours: float
    theirs: float
    if builder.max_model_len != reference.max_model_len:
        # Auto-fit lowered one of the lengths: requests of different lengths do
        # not compare, the lengths do.
        figure, ours, theirs = "max_model_len", builder.max_model_len, reference.max_model_len
    else:
        figure, ours, theirs = "requests", builder.requests, reference.requests
    ratio = theirs / ours if ours > 0 else None
    if theirs <= 0 or (ratio is not None and ratio <= THRESHOLD):
        return None
    return WasteWarning(
        scenario=scenario,
        figure=figure,
        ratio=ratio,
        builder=builder,
        reference=reference,
        example=example,
    )


def _worst_first(warning: WasteWarning) -> tuple[float, str]:
    return (-(warning.ratio if warning.ratio is not None else float("inf")), warning.example)


@attrs.define
class WasteMeter:
    """Collects a run's comparisons, one per ``core`` example with a plan.

    Attributes:
        is_reference: the builder under check is the reference itself: its
            own plans are the reference's, so nothing is planned twice.
    """

    is_reference: bool = False
    compared: int = 0
    warnings: list[WasteWarning] = attrs.field(factory=list)

    @classmethod
    def for_builder(cls, builder: object) -> WasteMeter:
        """A meter for ``builder`` (an instance or class, or an isolated run's proxy)."""
        cls_ = builder if isinstance(builder, type) else type(builder)
        # An isolated run's proxy stands for its class, when it names it.
        cls_ = getattr(cls_, "kvref_target", cls_)
        return cls(is_reference=cls_ is ReferenceKVCacheConfigBuilder)

    def add(self, obs: Any, example: Any) -> None:
        """Compare the plan of one ``core`` observation with the reference's on ``example``."""
        plan = getattr(obs, "plan", None)
        config = getattr(example, "config", None)
        if not isinstance(plan, KVCachePlan) or config is None:
            return
        if config.num_gpu_blocks_override is not None:
            # The override fixes the block count: no "blocks in the same memory".
            return
        ours = plan_figures(plan)
        if ours is None:
            return
        if self.is_reference:
            self.compared += 1
            return
        theirs = _reference_figures(example, ReferenceKVCacheConfigBuilder)
        if theirs is None:
            return
        self.compared += 1
        found = compare_plans(ours, theirs, scenario="core", example=repr(example)[:2000])
        if found is None:
            return
        # Only now (rarely) plan the page-rounded reference: is it more than page rounding?
        rounded = _reference_figures(example, _PageRoundedReference)
        if rounded is None or compare_plans(ours, rounded, scenario="core", example="") is not None:
            self.warnings.append(found)

    def summary(self) -> WasteSummary:
        """What the report shows: counts and the worst cases."""
        note = None
        if not self.compared:
            note = "no core example gave a plan both with the builder and with the reference"
        return WasteSummary(
            compared=self.compared,
            warned=len(self.warnings),
            worst=tuple(sorted(self.warnings, key=_worst_first)[:LISTED]),
            note=note,
        )


class _PageRoundedReference(ReferenceKVCacheConfigBuilder):
    """The reference with every block's device bytes rounded up to :data:`PAGE` (Core's view).

    Core learns bytes per block from this hook, so the plan it makes (block
    count, admission, auto-fit) is the reference's with page-rounded blocks;
    only the figures are read, never the placement.
    """

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        # Rounded up to whole pages.
        return -(-pool_bytes_per_block(config, kv_cache_groups) // PAGE) * PAGE


def _reference_figures(example: Any, builder: BuilderLike) -> PlanFigures | None:
    """``builder``'s plan of ``example``'s problem, when it plans one."""
    try:
        plan = plan_kv_cache(
            builder,
            example.config,
            [dict(w) for w in example.workers],
            list(example.available_memory),
        )
    except Exception:  # the reference refusing the problem leaves nothing to compare with
        return None
    return plan_figures(plan)
