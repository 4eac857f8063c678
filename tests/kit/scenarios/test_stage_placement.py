"""Placement and device scenarios place a pipeline-parallel problem one stage at a time.

Core never places a pipeline-parallel model whole: each stage's worker places
the whole model's groups projected onto its layers, and a stage that holds no
layer of some group is where placements go wrong (contract.md#pipeline-splits).
"""

from __future__ import annotations

import broken_builders

from conformance.run.runner import check_builder
from conformance.scenarios.placement import _stage_to_place
from kvref import FullAttentionSpec, KVCacheGroupSpec, UniformTypeKVCacheSpecs

_SPEC = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")


def _group(*names: str) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(
        layer_names=list(names),
        kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=dict.fromkeys(names, _SPEC)),
    )


def test_the_edge_stage_and_the_fullest_stage_are_placed() -> None:
    """Over problems, the stage without a group's layers and the stage with most layers are placed.

    The choice is a function of the problem: the same problem places the same stage.
    """
    groups = [_group("a0", "a1", "a2"), _group("b0")]
    workers = [{"a0": _SPEC, "b0": _SPEC}, {"a1": _SPEC}, {"a2": _SPEC}]
    # Stage 2 (no layer of b, the last on ties) is the edge; stage 0 the fullest.
    chosen = {_stage_to_place(groups, workers, n) for n in range(1, 40)}
    assert chosen == {0, 2}
    assert _stage_to_place(groups, workers, 7) == _stage_to_place(groups, workers, 7)


def test_placing_absent_layers_fails_in_the_placement_scenario() -> None:
    """A builder that places a projected group's absent layers fails where placement is judged.

    Before stages were placed one at a time, only Core's flow met an empty
    projected group, so the placement scenario passed this builder.
    """
    builder = broken_builders.PlacesAbsentLayers
    report = check_builder(
        builder, select=[builder.CAUGHT_BY], max_examples=builder.EXAMPLES, seed=1, shrink=False
    )
    result = report.result(builder.CAUGHT_BY)
    assert result.status == "fail", result
    assert result.scenario in ("placement", "device"), result.scenario


def test_the_reference_places_every_stage() -> None:
    """The reference passes the placement and device invariants on staged problems."""
    report = check_builder(
        "kvref:ReferenceKVCacheConfigBuilder",
        select=["KV-PLACE", "KV-DEV-VIEWS", "KV-DEV-TAGS"],
        max_examples=30,
        seed=3,
    )
    assert report.ok, [(r.id, r.violations) for r in report.failures]
    # Most of those examples have several stages: staged placements were judged.
    workers = report.coverage["placement"]["workers"]
    assert sum(n for stages, n in workers.items() if int(stages) > 1) >= 10, workers
