"""A vendor's own failure is shown even where vLLM's inherited defect fails the same invariant.

``GhostLayerBuilder`` (tests/vllm/native_builders/inherits.py) inherits vLLM
0.33.0's pipeline-projection defect through ``super()`` and adds a bug of its
own that fails the same invariants in another regime.  Before the kit asked
the parent about each failing example, the run's first failure (vLLM's)
stood for the invariant, was reported as inherited, and the vLLM 0.33.0
expectations manifest excused the vendor's bug with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import Report, check_builder
from conformance.ci.merge import merge_reports, read_shard_reports
from conformance.harness.adapters import load_builder
from conformance.report.render import report_to_dict
from conformance.upstream import DEFECTS
from kvref.versions import installed_vllm_version
from tests.shard_runs import differences, whole_and_shards
from tests.vllm.native_builders.inherits import GHOST

pytestmark = pytest.mark.vllm

GHOSTS = "tests.vllm.native_builders.inherits:GhostLayerBuilder"
PASS_THROUGH = "tests.vllm.native_builders.hydra:HydraPassThroughBuilder"
#: Invariants vLLM's defect fails on pipeline examples and the ghost fails elsewhere.
SHARED = ("KV-PLACE-UNKNOWN-LAYER", "KV-DEV-VIEWS")


def _run(qualname: str, select: tuple[str, ...] = SHARED) -> Report:
    return check_builder(load_builder(qualname), select=list(select), seed=1, reach=False)


def test_the_vendors_own_failure_is_shown() -> None:
    """Each shared invariant shows the ghost, as the builder's own (not inherited)."""
    report = _run(GHOSTS)
    for invariant in SHARED:
        result = report.result(invariant)
        assert result.status == "fail", result
        assert result.inherited is None, result.inherited
        assert any(v.layer == GHOST for v in result.violations), result.violations


def test_the_defect_alone_is_shown_as_inherited() -> None:
    """Without the vendor's bug, the same run shows vLLM's defect, marked inherited.

    Under a release whose default no longer has it (0.34.0 walks the groups'
    layer_names), the pass-through builder holds.
    """
    # The placement scenario alone: the device one repeats the same projection.
    result = _run(PASS_THROUGH, ("KV-PLACE-UNKNOWN-LAYER",)).result("KV-PLACE-UNKNOWN-LAYER")
    projection = next(d for d in DEFECTS if d.key == "pp-empty-group-projection")
    if installed_vllm_version() not in projection.versions:
        assert result.status == "pass", result
        return
    assert result.status == "fail", result
    assert result.inherited is not None and result.upstream is not None
    assert all(v.layer != GHOST for v in result.violations)


@pytest.mark.slow
def test_shards_merge_to_the_vendors_own_failure(tmp_path: Path) -> None:
    """The merge prefers a shard's own failure to another shard's earlier inherited one."""
    whole, paths = whole_and_shards(GHOSTS, tmp_path, select=",".join(SHARED), examples=50)
    merged: dict[str, Any] = json.loads(
        json.dumps(report_to_dict(merge_reports(read_shard_reports(paths))), default=str)
    )
    assert differences(whole, merged) == []
    for result in merged["results"]:
        assert result["inherited"] is None, result
