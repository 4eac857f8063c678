"""What the examples of a run said about each invariant, and which invariants a run selects."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from conformance.check.catalog import Invariant, Unjudged
from conformance.run.options import OptionError

if TYPE_CHECKING:
    # Types only: merge and the plugin's light paths read tallies without generation.
    from conformance.run.strata import Stratum
    from conformance.scenarios.examples import Example

__all__ = ["INHERIT_CHECKS", "Tally", "expected_status", "select_invariants", "verdict"]

#: Failing examples of one invariant asked of the builder's parent, at most: a
#: builder that inherits a defect on every example costs a parent call each.
INHERIT_CHECKS = 64


@attrs.define
class Tally:
    """What the examples of a run said about one invariant."""

    judged: int = 0
    unjudged: int = 0
    not_applicable: int = 0
    #: Unjudged examples on which one of the builder's own calls failed.
    spoiled: int = 0
    reason: str | None = None
    na_reason: str | None = None
    #: The first failing example: its scenario, and the stratum whose run drew
    #: it (that stratum's strategy shrinks it).
    failure: tuple[str, Example, Stratum] | None = None
    found: tuple[Any, ...] = ()
    #: Where the first failure falls in the whole run's order (shard.order_key).
    failure_key: tuple[int, ...] | None = None
    #: The first failing example the builder's parent does not also fail (for a
    #: builder with a parent whose first failure was inherited), and its key:
    #: the builder's own bug is reported rather than its parent's defect.
    introduced: tuple[str, Example, Stratum] | None = None
    introduced_key: tuple[int, ...] | None = None
    #: Failing examples asked of the parent so far (bounded: INHERIT_CHECKS).
    inherit_checks: int = 0

    def undrawable(self, reason: str) -> None:
        """Count a scenario of the invariant that no model of the run could give an example.

        The invariant is then not applicable (verdict) unless an example of
        another scenario judged it, or a call of the builder failed on one.
        """
        self.not_applicable += 1
        self.na_reason = reason

    def add(
        self,
        outcome: Any,
        scenario: str,
        example: Example,
        *,
        primary: bool,
        stratum: Stratum,
        spoiled: Callable[[], bool] = lambda: False,
        key: tuple[int, ...] | None = None,
    ) -> bool:
        """Count what one example's judgement (``outcome``) said; whether it failed.

        ``primary``: the example is of the invariant's own scenario, whose
        reason for not judging explains best; ``spoiled``: whether a call of
        the builder failed on it (asked only of unjudged examples); ``key``:
        where the example falls in the whole run's order (shard.order_key).
        """
        if outcome is None or isinstance(outcome, Unjudged):
            if isinstance(outcome, Unjudged) and not outcome.applicable:
                self.not_applicable += 1
                self.na_reason = outcome.reason
            else:
                self.unjudged += 1
                by_answer = isinstance(outcome, Unjudged) and outcome.spoiled
                self.spoiled += by_answer or spoiled()
                # The invariant's own scenario explains best why it was not judged.
                if isinstance(outcome, Unjudged) and (primary or self.reason is None):
                    self.reason = outcome.reason
            return False
        self.judged += 1
        if outcome and self.failure is None:
            self.failure = (scenario, example, stratum)
            self.found = tuple(outcome)
            self.failure_key = key
        return bool(outcome)

    def as_dict(self) -> dict[str, Any]:
        """The counts, as a sharded run's report carries them for the merge."""
        return {
            "judged": self.judged,
            "unjudged": self.unjudged,
            "not_applicable": self.not_applicable,
            "spoiled": self.spoiled,
            "reason": self.reason,
            "na_reason": self.na_reason,
            "failure_key": None if self.shown_key is None else list(self.shown_key),
        }

    @property
    def shown(self) -> tuple[str, Example, Stratum] | None:
        """The failure the report shows: the first introduced one, else the first."""
        return self.introduced or self.failure

    @property
    def shown_key(self) -> tuple[int, ...] | None:
        """Where :attr:`shown` falls in the whole run's order."""
        return self.introduced_key if self.introduced is not None else self.failure_key

    def wants_parent_check(self) -> bool:
        """Whether a new failing example should be asked of the builder's parent."""
        return (
            self.failure is not None
            and self.introduced is None
            and self.inherit_checks < INHERIT_CHECKS
        )


#: Why examples were unjudged when no call failed and the check gave no reason.
_NOT_MET = (
    "none had what it judges (for example no Core failure to read); "
    "more examples (--max-examples, --profile thorough) may reach it"
)


def verdict(tally: Tally, *, interrupted: bool) -> tuple[str, str | None]:  # noqa: PLR0911
    """The status the tally gives, and why where a status needs a reason.

    ``pass``, ``fail``, ``inconclusive`` or ``not-applicable``, in the order of
    contract.md#verdicts; ``interrupted``: the run was stopped before it ended.
    """
    if tally.failure is not None or tally.failure_key is not None:
        return "fail", None
    if tally.judged:
        return "pass", None
    if tally.spoiled:
        # The builder's own failed calls left these examples unjudged: what
        # it broke is not "not applicable" (contract.md#verdicts).
        return "inconclusive", (
            f"{tally.spoiled} of the examples that reached it could not judge it because "
            "a call of the builder failed (see KV-CALL-*) or its answer could not be "
            f"judged: {tally.reason or 'no answer'}"
        )
    if tally.not_applicable:
        return "not-applicable", f"not applicable in this run: {tally.na_reason}"
    if interrupted:
        return "inconclusive", "the run was interrupted before an example judged it"
    if tally.unjudged:
        # No call of the builder failed on these examples (that is ``spoiled``):
        # without a reason of the check's own, they lacked what it judges.
        return "inconclusive", (
            f"none of the {tally.unjudged} examples that reached it could judge it: "
            f"{tally.reason or _NOT_MET}"
        )
    return "inconclusive", "no example reached it"


def expected_status(status: str, expected: bool) -> str:
    """``status`` of an invariant listed as expected to fail (``expected``).

    A failure, or no judgement at all, is the expected ``xfail``; a pass is
    ``xpass``; not applicable stays so (contract.md#verdicts).
    """
    if not expected:
        return status
    return {"fail": "xfail", "inconclusive": "xfail", "pass": "xpass"}.get(status, status)


def select_invariants(
    invariants: Sequence[Invariant], select: Iterable[str] | None
) -> list[Invariant]:
    """The invariants whose id equals or starts with one of ``select`` (all if ``None``).

    Raises:
        OptionError: ``select`` is empty, or an entry matches no invariant.
    """
    if select is None:
        return list(invariants)
    chosen: list[Invariant] = []
    patterns = [raw.strip().upper() for raw in select if raw.strip()]
    if not patterns:
        raise OptionError("select names no invariant id; give at least one id or prefix")
    for pattern in patterns:
        stem = pattern.rstrip("*")
        hits = [inv for inv in invariants if inv.id == pattern or inv.id.startswith(stem)]
        if not hits:
            raise OptionError(f"select entry {pattern!r} matches no invariant id")
        chosen += [h for h in hits if h not in chosen]
    return [inv for inv in invariants if inv in chosen]
