"""The 54711 loop in a vendor placement: vLLM's defect under 0.33.0, its own under 0.34.0.

``WrapperLoopBuilder`` (tests/vllm/native_builders/wrapper_loop.py) walks a
uniform-type group's spec map, as vLLM 0.33.0's default placement did.  The
kit names a failure after an upstream defect only under a release whose own
default carries it (conformance/upstream.py): with 0.34.0 installed, the same
failure is the vendor's finding, never excused by an expectations manifest.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder
from kvref.versions import V0_33, installed_vllm_version

pytestmark = pytest.mark.vllm

LOOP = "tests.vllm.native_builders.wrapper_loop:WrapperLoopBuilder"
INVARIANT = "KV-PLACE-UNKNOWN-LAYER"


def test_the_wrapper_loop_is_upstreams_only_where_vllms_default_has_it() -> None:
    report = check_builder(LOOP, select=[INVARIANT], seed=1, reach=False, replays=0)
    result = report.result(INVARIANT)
    assert result.status == "fail", (result.status, result.reason)
    if installed_vllm_version() == V0_33:
        assert result.inherited is not None and result.upstream is not None, result
        assert "defect pp-empty-group-projection" in result.upstream
    else:
        assert result.inherited is None and result.upstream is None, result
