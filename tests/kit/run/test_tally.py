"""The reason an unjudged invariant's row gives matches what happened (contract.md#verdicts)."""

from __future__ import annotations

from conformance.run.tally import Tally, verdict


def _tally(**counts: int) -> Tally:
    tally = Tally()
    for name, value in counts.items():
        setattr(tally, name, value)
    return tally


def test_examples_without_a_failed_call_do_not_blame_calls() -> None:
    # Two `core` examples where Core returned a plan: KV-CORE-ERROR-TYPED has
    # nothing to read, and no call of the builder failed.
    status, reason = verdict(_tally(unjudged=2), interrupted=False)
    assert status == "inconclusive"
    assert reason is not None
    assert "KV-CALL" not in reason and "--max-examples" in reason


def test_examples_spoiled_by_failed_calls_say_so() -> None:
    status, reason = verdict(_tally(unjudged=2, spoiled=2), interrupted=False)
    assert status == "inconclusive"
    assert reason is not None and "KV-CALL" in reason


def test_a_checks_own_reason_is_kept() -> None:
    tally = _tally(unjudged=1)
    tally.reason = "the twin cannot import the builder"
    assert verdict(tally, interrupted=False) == (
        "inconclusive",
        "none of the 1 examples that reached it could judge it: the twin cannot import the builder",
    )


def test_the_builders_own_failure_is_shown_before_an_inherited_one() -> None:
    from conformance.run.tally import INHERIT_CHECKS

    tally = _tally()
    first, own = ("placement", "inherited", "s"), ("placement", "own", "s")
    tally.failure, tally.failure_key = first, (0, 1)  # type: ignore[assignment]
    assert tally.shown == first and tally.wants_parent_check()
    tally.introduced, tally.introduced_key = own, (3, 7)  # type: ignore[assignment]
    assert tally.shown == own and tally.as_dict()["failure_key"] == [3, 7]
    assert not tally.wants_parent_check()
    # A builder that inherits a defect on every example is asked about a bounded number.
    bounded = _tally(inherit_checks=INHERIT_CHECKS)
    bounded.failure = first  # type: ignore[assignment]
    assert not bounded.wants_parent_check()
