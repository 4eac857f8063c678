"""A shrinking search is bounded by observations, so a seed shrinks alike on any machine.

Bounded by a clock (8 s), how far the shrink got depended on the machine's
load: a run and its shards, or two runs of one seed, reported different
minimal counterexamples for one failure.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from conformance.run import search as search_module
from conformance.run.search import search

_PHASES = [hypothesis.Phase.generate, hypothesis.Phase.shrink]


class _AboveTen:
    """An invariant broken by every number above 10 (its smallest failure is 11)."""

    def check(self, observation: int) -> list[str]:
        return ["too large"] if observation > 10 else []


def _shrink(observe: Any, **budget: Any) -> object:
    return search(
        _AboveTen(),  # type: ignore[arg-type]
        "grouping",
        st.integers(0, 10_000),  # type: ignore[arg-type]
        observe,
        7,
        database=None,
        phases=_PHASES,
        max_examples=100,
        **budget,
    )


def test_a_loaded_machine_shrinks_as_far_as_an_idle_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same minimal example when every observation seems to take a second.

    The full shrink makes 18 observations: a clock of 8 s cut it short.
    """

    def observe(_scenario: str, example: int) -> int:
        return example

    idle = _shrink(observe)

    class _Loaded:
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.now += 1.0
            return cls.now

    monkeypatch.setattr(search_module, "time", _Loaded)
    assert _shrink(observe) == idle == 11


def test_the_observations_bound_the_search() -> None:
    seen: list[int] = []

    def observe(_scenario: str, example: int) -> int:
        seen.append(example)
        return example

    found = _shrink(observe, max_observations=3)
    assert len(seen) == 3
    # Cut short: the best failing example of the three, or none of them failed.
    assert found is None or (isinstance(found, int) and found > 10 and found in seen)
