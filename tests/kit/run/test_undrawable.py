"""A scenario no model of the run can feed: its invariants are N/A with the reason, never failed.

With ``models_only``, a builder that takes host-resident layers only under
HiSparse (``host_outside_hisparse`` unsupported, as vLLM's adapter declares)
gets no host example from models that are not HiSparse-served: the host
invariants judge nothing, whatever the builder answers.  That is the run's
limit, not the builder's failure (contract.md#verdicts).  The N/A never
excuses the builder: a judgement anywhere, or a failed call of its own,
decides as before.  The vLLM-native form: tests/vllm/test_undrawable_native.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from kit_runs import quick_check

from conformance.check.catalog import catalog
from conformance.report.model import Report
from kvref import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
)

HOST = sorted(inv.id for inv in catalog() if inv.id.startswith(("KV-HOST", "KV-DEV-HOST")))
UNDRAWABLE = "the host scenario could draw no valid example from this run's models (vendor)"

_FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
_SLIDING = SlidingWindowSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=256
)
#: A small hybrid: nothing HiSparse-served.
MODELS = [{f"model.layers.{i}.attn": _SLIDING if i % 2 else _FULL for i in range(6)}]


class HostOnlyUnderHiSparse(ReferenceKVCacheConfigBuilder):
    """The reference, declaring what vLLM's adapter declares: host layers only under HiSparse."""

    kvref_unsupported = ("host_outside_hisparse",)


class RaisesOnPlacement(HostOnlyUnderHiSparse):
    """The same, broken: every placement raises."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        raise RuntimeError("planted placement failure")


def run_on_models(
    builder: type, *, models_only: bool, select: Sequence[str] = ("KV-HOST", "KV-DEV-HOST")
) -> Report:
    """A small run of ``builder`` on :data:`MODELS` (the host invariants by default).

    tests/vllm/test_undrawable_native.py runs its vLLM-native builders through it too.
    """
    return quick_check(
        builder,
        *select,
        examples=6,
        seed=1,
        models=MODELS,
        models_only=models_only,
        shrink=False,
        isolate=True,
    )


def test_host_invariants_are_not_applicable_with_the_reason() -> None:
    """Models-only, nothing HiSparse-served: every host invariant N/A, the run OK."""
    report = run_on_models(HostOnlyUnderHiSparse, models_only=True)
    statuses = {r.id: r.status for r in report.results}
    assert set(statuses) == set(HOST), statuses
    assert set(statuses.values()) == {"not-applicable"}, statuses
    for result in report.results:
        assert UNDRAWABLE in (result.reason or ""), result.reason
        assert "HiSparse-served" in (result.reason or ""), result.reason
    assert report.ok
    assert report.coverage["host"]["no_valid_examples"] == ["vendor"]


def test_the_same_invariants_are_judged_where_the_run_can_feed_them() -> None:
    """With the built-in families mixed in (HiSparse ones among them), they are judged.

    The vendor's share of host examples still draws nothing; what the other
    strata drew decides.  Two stay N/A for reasons of their own (no memory
    counter on the CPU; HiSparse has no device-only twin to compare with).
    """
    report = run_on_models(HostOnlyUnderHiSparse, models_only=False)
    assert report.coverage["host"]["no_valid_examples"] == ["vendor"]
    assert report.ok
    passed = {r.id for r in report.results if r.status == "pass"}
    assert passed == set(HOST) - {"KV-DEV-HOST", "KV-HOST-EXCLUDED"}, report.results
    assert not [r for r in report.results if UNDRAWABLE in (r.reason or "")]


def assert_failed_calls_decide(builder: type) -> None:
    """``builder``'s failed placements decide: inconclusive and a call failure, the run not OK.

    tests/vllm/test_undrawable_native.py asks it of its vLLM-native builder too.
    """
    report = run_on_models(
        builder, models_only=True, select=("KV-HOST-DEVICE-SAFE", "KV-CALL-RAISES")
    )
    statuses = {r.id: r.status for r in report.results}
    # KV-HOST-DEVICE-SAFE also reads placement, where the builder's calls failed.
    assert statuses == {"KV-HOST-DEVICE-SAFE": "inconclusive", "KV-CALL-RAISES": "fail"}
    assert not report.ok


def test_a_builder_whose_calls_fail_is_not_excused() -> None:
    """A failed call of the builder's own decides first: inconclusive and a call failure."""
    assert_failed_calls_decide(RaisesOnPlacement)
