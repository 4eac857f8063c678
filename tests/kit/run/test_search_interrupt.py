"""A shrinking search stops on an interrupt, even one Hypothesis reports as its own error.

Before, the search suppressed every exception to end with its best example,
so a Ctrl-C that Hypothesis re-raised as its own error was swallowed and the
run went on.  A real failure of the search still ends it quietly.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from conformance.check.catalog import by_id
from conformance.run.search import search

_PHASES = [hypothesis.Phase.generate]


def _search(observe: Any) -> object:
    return search(
        by_id()["KV-GROUP-PARTITION"],
        "grouping",
        st.just("an example"),  # type: ignore[arg-type]
        observe,
        1,
        database=None,
        phases=_PHASES,
        failing=None,
        max_examples=3,
    )


def test_a_masked_interrupt_stops_the_search() -> None:
    """An error raised while handling KeyboardInterrupt comes out as the interrupt."""

    def observe(_scenario: str, _ex: object) -> object:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("Hypothesis' own error") from None

    with pytest.raises(KeyboardInterrupt):
        _search(observe)


def test_a_real_error_ends_the_search_with_its_best_example() -> None:
    """Any other failure of the search's own machinery keeps the example it had."""

    def observe(_scenario: str, _ex: object) -> object:
        raise RuntimeError("not an interrupt")

    assert _search(observe) is None
