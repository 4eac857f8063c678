"""Exploration on vLLM-native builders: a gate the default run never opens
(tests/extensions/test_explore.py).

The vLLM form of the kvref-native proof: ``explore_gated`` specialises the
IndexCache-style GLM-5 variant (fewer indexers than latents), which no
built-in family draws.  Each run costs minutes on 2 cores (the worker converts every
candidate to vLLM), so both live in the slow tier; the fast tier proves the
same on the kvref-native pair.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import Report, check_builder

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PKG = "tests.vllm.native_builders.explore_gated"
MEANT = "KV-PLACE-BACKING-SIZE"
#: Candidates end the exploration (the same at any load); the time limit is far beyond it.
CANDIDATES = 400


def _run(name: str, explore: float) -> Report:
    return check_builder(
        f"{PKG}:{name}",
        select=[MEANT],
        seed=1,
        shrink=False,
        explore=explore,
        explore_candidates=CANDIDATES,
    )


def test_the_default_run_misses_the_planted_bug() -> None:
    report = check_builder(
        f"{PKG}:IndexCacheShortBackingNative", select=[MEANT], seed=1, shrink=False
    )
    assert report.results[0].status == "pass"
    assert "IndexCacheShortBackingNative._specialise()" in " ".join(report.reach["lines"])


def test_exploration_finds_it_and_keeps_the_legal_twin_green() -> None:
    broken = _run("IndexCacheShortBackingNative", 900.0)
    assert broken.results[0].status == "fail", broken.reach["explore"]
    assert "explored:" in broken.results[0].counterexample
    legal = _run("IndexCacheReorderedNative", 900.0)
    assert legal.results[0].status == "pass", legal.results[0]
    assert legal.reach["explore"]["kept"] >= 1
