"""vLLM's Core probes placements for zero blocks: the kit's adapter must not fail there.

With HiSparse and auto-fit, vLLM 0.33.0's ``_auto_fit_max_model_len`` asks
the builder to place ``available // bytes_per_block`` blocks (0 on a short
memory) and takes a ``ValueError`` as "this length does not fit"; vLLM's own
answer there has negative sizes.  Run isolated, the kit converted that
answer to kvref records, failed, and reported vLLM's own default builder
under ``KV-CORE-ERROR-TYPED`` (seed 1, 200 examples, 2026-12-02), although
vLLM itself raises its typed ``InsufficientMemoryError`` on the same problem.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance.harness.boundary import prepare
from conformance.run.replay import replay_example
from conformance.scenarios.examples import Example

pytestmark = pytest.mark.vllm

_DATA = Path(__file__).resolve().parents[1] / "data" / "hisparse_autofit_no_block.json"
_DEFAULT = "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_vllms_default_raises_its_typed_error(isolate: bool) -> None:
    """The counterexample of that run: Core's failure is vLLM's typed error, judged as such."""
    example = Example.from_data(json.loads(_DATA.read_text()))
    prepared = prepare(_DEFAULT, _DEFAULT, isolate=isolate, reach=False, min_reach=None)
    try:
        found = replay_example(
            prepared.builder, "KV-CORE-ERROR-TYPED", "core", example, timeout=120
        )
    finally:
        close = getattr(prepared.builder, "close", None)
        if callable(close):
            close()
    assert found == [], found
