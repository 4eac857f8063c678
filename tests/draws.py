"""Values of a Hypothesis strategy, for tests that check what a strategy draws."""

from __future__ import annotations

from typing import TypeVar

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

T = TypeVar("T")


def draws(strategy: st.SearchStrategy[T], count: int, *, at: int | None = None) -> list[T]:
    """Up to ``count`` values of ``strategy``, as a property test draws them.

    No example database (nothing another run saved comes back), no deadline
    and no health check (a slow or filtering strategy is what some tests
    check).  ``at``: Hypothesis' seed, for the same values on every run
    (``None``: a random one, as a property test has).
    """
    found: list[T] = []

    @settings(
        max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def collect(value: T) -> None:
        found.append(value)

    (collect if at is None else seed(at)(collect))()
    return found
