"""What the examples of a run said about each invariant, and which invariants a run selects."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from conformance.check.catalog import Invariant, Unjudged
from conformance.run.examples import Example
from conformance.run.options import OptionError
from conformance.run.strata import Stratum

__all__ = ["Tally", "select_invariants"]


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

    def add(
        self,
        outcome: Any,
        scenario: str,
        example: Example,
        *,
        primary: bool,
        stratum: Stratum,
        spoiled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Count what one example's judgement (``outcome``) said.

        ``primary``: the example is of the invariant's own scenario, whose
        reason for not judging explains best; ``spoiled``: whether a call of
        the builder failed on it (asked only of unjudged examples).
        """
        if outcome is None or isinstance(outcome, Unjudged):
            if isinstance(outcome, Unjudged) and not outcome.applicable:
                self.not_applicable += 1
                self.na_reason = outcome.reason
            else:
                self.unjudged += 1
                self.spoiled += spoiled()
                # The invariant's own scenario explains best why it was not judged.
                if isinstance(outcome, Unjudged) and (primary or self.reason is None):
                    self.reason = outcome.reason
            return
        self.judged += 1
        if outcome and self.failure is None:
            self.failure = (scenario, example, stratum)
            self.found = tuple(outcome)


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
