"""The kit as pytest items: one per invariant (collected by ``pytest --pyargs conformance``)."""

from __future__ import annotations

import pytest

from conformance.check.catalog import catalog
from conformance.plugin import run_item, run_reach_item


@pytest.mark.parametrize("invariant", [inv.id for inv in catalog()])
def test_invariant(invariant: str, request: pytest.FixtureRequest) -> None:
    """The builder keeps ``invariant`` on every generated example that judged it."""
    run_item(invariant, request)


def test_reach_minimum(request: pytest.FixtureRequest) -> None:
    """The builder's lines the run reached are at least ``--kv-min-reach`` percent of them."""
    run_reach_item(request)
