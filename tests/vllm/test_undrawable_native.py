"""A vLLM-native builder's host invariants with models that are not HiSparse-served: N/A.

vLLM 0.33.0 keeps groups on the host only as HiSparse's source storage, so
with ``models_only`` and none of the vendor's models HiSparse-served, the
host scenario has nothing to draw: the run's limit, reported N/A with the
reason, never a failure of the vendor's builder.  A builder whose own calls
fail is still not excused.  The kvref-native form: tests/kit/run/test_undrawable.py.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from tests.kit.run.test_undrawable import (
    HOST,
    UNDRAWABLE,
    assert_failed_calls_decide,
    run_on_models,
)

pytestmark = pytest.mark.vllm


class VendorDefault(DefaultKVCacheConfigBuilder):  # type: ignore[misc]
    """A vendor's builder that defers to vLLM's default everywhere."""

    def get_kv_cache_groups(self, *args: Any, **kwargs: Any) -> Any:
        return super().get_kv_cache_groups(*args, **kwargs)


class VendorRaisesOnPlacement(VendorDefault):
    """The same, broken: every placement raises."""

    def get_kv_cache_config_from_groups(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted placement failure")


def test_host_invariants_are_not_applicable_with_the_reason() -> None:
    """Every host invariant N/A, naming vLLM's HiSparse-only host tier; the run OK."""
    report = run_on_models(VendorDefault, models_only=True)
    assert {r.id: r.status for r in report.results} == dict.fromkeys(HOST, "not-applicable")
    for result in report.results:
        assert UNDRAWABLE in (result.reason or ""), result.reason
        assert "as vLLM 0.33.0's adapter does" in (result.reason or ""), result.reason
    assert report.ok


def test_a_builder_whose_calls_fail_is_not_excused() -> None:
    """Its failed placements decide: inconclusive and a call failure, the run not OK."""
    assert_failed_calls_decide(VendorRaisesOnPlacement)
