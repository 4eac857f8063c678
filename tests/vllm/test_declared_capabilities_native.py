"""A vLLM-native class's own ``kvref_unsupported`` adds to what vLLM's adapter declares.

The adapter lacks ``host_outside_hisparse`` (vLLM keeps groups on the host
only under HiSparse); a vendor whose builder takes no host residency at all
declares ``host_resident`` on its class, and the host invariants are then
skipped rather than judged on HiSparse models.  The declaration used to be
dropped by the adapter.  The kvref-native form: tests/kit/test_declared_capabilities.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from conformance import OptionError, check_builder
from conformance.harness.adapters import native_adapter

pytestmark = pytest.mark.vllm


class NoHostTier(DefaultKVCacheConfigBuilder):  # type: ignore[misc]
    """A vendor's builder with no host tier at all."""

    kvref_unsupported = ("host_resident",)


class Misspelt(DefaultKVCacheConfigBuilder):  # type: ignore[misc]
    """The same declaration, misspelt."""

    kvref_unsupported = ("host_residnet",)


def test_the_adapter_keeps_both_declarations() -> None:
    """vLLM's own limit first, the vendor's after it."""
    adapter = native_adapter(NoHostTier)
    assert adapter.kvref_unsupported == ("host_outside_hisparse", "host_resident")


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_the_host_invariants_are_skipped(isolate: bool) -> None:
    """Skipped with the reason, not judged on HiSparse models."""
    report = check_builder(
        NoHostTier, select=["KV-HOST"], max_examples=3, seed=1, isolate=isolate, database=None
    )
    assert {r.status for r in report.results} == {"skipped"}, report.results
    assert all("host_resident" in (r.reason or "") for r in report.results)
    assert report.ok


def test_a_misspelt_capability_is_a_usage_error() -> None:
    """Refused before any example, naming the value."""
    with pytest.raises(OptionError, match="'host_residnet'"):
        check_builder(Misspelt, select=["KV-HOST-TENSORS"], max_examples=3, database=None)
