"""Placement examples drawn from the kit's own generation, for tests that need some."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from conformance.generate.families import family_strategy
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import examples


def drawn_examples(count: int, family: str | None = None) -> list[Example]:
    """Up to ``count`` placement examples, of one built-in ``family`` or of all of them.

    Derandomized: a test that needs an example of some kind finds the same
    ones on every run, not whatever a random seed draws.
    """
    models = family_strategy(family) if family is not None else None
    found: list[Example] = []

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(examples("placement", models))
    def collect(example: Example) -> None:
        found.append(example)

    collect()
    return found
