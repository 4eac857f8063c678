"""An example the builder's own answer made unjudgeable is INCONCLUSIVE, never N/A."""

from __future__ import annotations

from typing import Any

from broken_builders.placement import SizeOneBlockTooBig

from conformance.check.catalog import Unjudged
from conformance.run.runner import check_builder
from conformance.run.tally import Tally, verdict
from kvref import ReferenceKVCacheConfigBuilder


def _count(tally: Tally, *outcomes: Any) -> None:
    for outcome in outcomes:
        tally.add(outcome, "placement", None, primary=True, stratum=None)  # type: ignore[arg-type]


def test_a_spoiled_example_beats_not_applicable() -> None:
    tally = Tally()
    _count(tally, Unjudged("layer-outer", applicable=False), Unjudged("no step", spoiled=True))
    status, reason = verdict(tally, interrupted=False)
    assert status == "inconclusive"
    assert reason is not None and "its answer could not be judged" in reason


def test_not_applicable_stays_so_beside_neutral_examples() -> None:
    """What no builder could change (the layout, the device) keeps N/A: a legal builder's counts."""
    tally = Tally()
    _count(tally, Unjudged("layer-outer", applicable=False), None, Unjudged("no example"))
    assert verdict(tally, interrupted=False)[0] == "not-applicable"


def _block_stride(builder: object, seed: int) -> Any:
    report = check_builder(
        builder,  # type: ignore[arg-type]
        select=["KV-PLACE-BLOCK-STRIDE", "KV-PLACE-BACKING-SIZE"],
        max_examples=12,
        seed=seed,
        isolate=False,
        reach=False,
        shrink=False,
        replays=0,
        focus="off",
    )
    return report


def test_a_backing_that_does_not_grow_by_blocks_leaves_the_step_inconclusive() -> None:
    """Seen at seed 7: the block-stride step was N/A for a builder whose backing size was off."""
    broken = _block_stride(SizeOneBlockTooBig, 7)
    assert broken.result("KV-PLACE-BACKING-SIZE").status == "fail"
    assert broken.result("KV-PLACE-BLOCK-STRIDE").status == "inconclusive"
    reference = _block_stride(ReferenceKVCacheConfigBuilder, 7)
    assert reference.result("KV-PLACE-BLOCK-STRIDE").status == "pass"
    assert reference.ok
