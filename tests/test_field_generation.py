"""Issue 23: the default generation reaches field regimes as classes, not tuned examples.

Each broken builder of ``broken_builders.FIELD_REGIMES`` has one bug that
only a regime of the default run meets (plans past 4 GiB in a layer-outer
layout, padded pages stepped densely); the default run (50 examples per
scenario) must catch it with its meant invariant.  Seed 1 runs by default;
``KVREF_POWER_SEEDS=1,2,3,4,5`` runs the sweep the issue asks for.
"""

from __future__ import annotations

import os

import broken_builders
import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from conformance.generate import strategies as cs
from conformance.generate.problems import FOUR_GIB
from conformance.run.runner import check_builder

_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]
_SEEDS = [int(s) for s in os.environ.get("KVREF_POWER_SEEDS", "1").split(",")]


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize("builder", broken_builders.FIELD_REGIMES, ids=lambda b: b.__name__)
def test_field_regime_caught_at_default_count(builder: type, seed: int) -> None:
    """The regime's broken builder fails its meant invariant, and only those it declares."""
    report = check_builder(builder, select=_PAPER, max_examples=50, seed=seed, shrink=False)
    broken_builders.assert_caught(report, builder.CAUGHT_BY, builder.ALSO)


def test_one_layer_run_passes_4_gib() -> None:
    """Block counts at which one layer's run (num_blocks x its page) passes 4 GiB are drawn."""
    page = 1 << 16
    strategy = cs.num_blocks_for(64 * page, layer_bytes=page)
    n = find(strategy, lambda n: n * page > FOUR_GIB, settings=settings(max_examples=2000))
    assert n * page > FOUR_GIB
    # Without the layer's bytes only the whole block's 4 GiB bucket exists.
    with pytest.raises(NoSuchExample):
        find(
            cs.num_blocks_for(64 * page),
            lambda n: n * page > FOUR_GIB,
            settings=settings(max_examples=2000),
        )
