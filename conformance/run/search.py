"""Hypothesis searches for one invariant: replay saved counterexamples, shrink a failure."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import hypothesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase

from conformance.check.catalog import Invariant, Unjudged
from conformance.generate.determinism import seed_only_draws
from conformance.run.interrupts import interrupts_unmasked
from conformance.scenarios.examples import Example

__all__ = ["Namespaced", "fails", "search"]

#: The key under which a corner lists its strata that saved something.
_STRATA = b"\x00strata"

#: Observes one example in a scenario (the runner binds the builder and the guard).
Observer = Callable[[str, Example], Any]


class Namespaced(ExampleDatabase):
    """One builder's and one invariant's corner of a shared example database.

    Every invariant's search runs the same test function, so Hypothesis would
    give them one key; the prefix keeps their counterexamples apart.
    """

    def __init__(self, inner: ExampleDatabase, prefix: str, *, stratum: str | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.base = prefix.encode()
        self.stratum = stratum
        # Each stratum (conformance.run.strata) draws with its own strategy, so a
        # saved choice sequence replays only under the stratum that saved it.
        self.prefix = self.base + (b"" if stratum is None else stratum.encode() + b"|")

    def strata(self) -> set[str]:
        """The strata that saved counterexamples in this corner."""
        return {raw.decode() for raw in self.inner.fetch(self.base + _STRATA)}

    def save(self, key: bytes, value: bytes) -> None:
        """Save under this corner's prefix, and note the stratum for the replay."""
        self.inner.save(self.prefix + key, value)
        if self.stratum is not None:
            self.inner.save(self.base + _STRATA, self.stratum.encode())

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """Fetch from this corner."""
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        """Delete from this corner."""
        self.inner.delete(self.prefix + key, value)


def fails(inv: Invariant, obs: Any) -> bool:
    """Whether ``obs`` breaks ``inv``."""
    outcome = inv.check(obs)
    return bool(outcome) and not isinstance(outcome, Unjudged)


def search(
    inv: Invariant,
    scenario: str,
    strategy: st.SearchStrategy[Example],
    observe: Observer,
    seed: int,
    *,
    database: ExampleDatabase | None,
    phases: Sequence[hypothesis.Phase],
    failing: Example | None = None,
    seconds: float = 8.0,
    max_examples: int = 50,
) -> Example | None:
    """The smallest failing example a Hypothesis search finds (``failing`` if none).

    With ``database`` set, examples saved by earlier runs are replayed first
    and the new minimal counterexample is saved, so a failure reproduces
    from the database as well as from the seed.
    """
    stop_at = time.perf_counter() + seconds
    smallest = [failing]

    class _StillFailsError(Exception):
        pass

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=database,
        suppress_health_check=list(HealthCheck),
        phases=list(phases),
        report_multiple_bugs=False,
    )
    @hypothesis.seed(seed)
    @hypothesis.given(strategy)
    def run(ex: Example) -> None:
        # Hypothesis shrinks towards smaller inputs, so the last failing example
        # it tries is the smallest.  Past the time budget nothing fails any more,
        # which ends the search with the best example so far.
        if time.perf_counter() > stop_at:
            return
        if fails(inv, observe(scenario, ex)):
            smallest[0] = ex
            raise _StillFailsError

    # The search ends, with its best example, on any failure of its own; an
    # interrupt Hypothesis reported as its error stops the run.
    with seed_only_draws(), contextlib.suppress(Exception), interrupts_unmasked():
        run()
    return smallest[0]
