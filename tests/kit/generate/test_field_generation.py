"""The default generation reaches field regimes as classes, not tuned examples.

Each broken builder of ``broken_builders.FIELD_REGIMES`` has one bug that
only a regime of the default run meets (plans past 4 GiB in a layer-outer
layout, padded pages stepped densely, kernel blocks below the cache block,
compressed MLA placed layer-outer, a pipeline worker without any layer of a
uniform-type group); the default run (50 examples per scenario) must catch
it with its meant invariant.  The regimes themselves are drawn by the default
generation (the tests at the end); the legal builders at their edges pass
(tests/kit/check/test_power.py).  Seed 1 runs by default;
``KVREF_POWER_SEEDS=1,2,3,4,5`` runs the sweep the issue asks for.
"""

from __future__ import annotations

import math
import os

import broken_builders
import pytest
from hypothesis import Phase, find, settings
from hypothesis.errors import NoSuchExample

from conformance.generate import strategies as cs
from conformance.generate.families import family_strategy
from conformance.generate.problems import FOUR_GIB, TWO_GIB
from conformance.generate.records import PlanningProblem
from conformance.run.runner import check_builder
from kvref import KVCacheLayout, ReferenceKVCacheConfigBuilder
from kvref.planning import project_kv_cache_groups_to_worker
from kvref.specs import CircularBufferSpec, KVCacheSpec, MLAAttentionSpec, MultipleOf

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]
_SEEDS = [int(s) for s in os.environ.get("KVREF_POWER_SEEDS", "1").split(",")]


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize(
    "builder", (*broken_builders.FIELD, *broken_builders.FIELD_REGIMES), ids=lambda b: b.__name__
)
def test_field_regime_caught_at_default_count(builder: type, seed: int) -> None:
    """The class's broken builder fails its meant invariant, and only those it declares.

    ``broken_builders.FIELD`` (the clauses that had no invariant: draft
    groups, HiSparse's hot blocks, roles and host runs, TP shard counts) is
    swept beside the regimes.
    """
    report = check_builder(
        builder, select=_PAPER, max_examples=50, seed=seed, shrink=False, reach=False
    )
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


def test_one_layer_run_between_2_and_4_gib() -> None:
    """Counts whose layer run wraps a signed 32-bit field but not an unsigned one are drawn."""
    page = 1 << 16
    strategy = cs.num_blocks_for(64 * page, layer_bytes=page)
    n = find(
        strategy,
        lambda n: TWO_GIB < n * page < FOUR_GIB,
        settings=settings(max_examples=2000),
    )
    assert TWO_GIB < n * page < FOUR_GIB


# -- the generation reaches each class of field regime ----------------------------

_REACH = settings(max_examples=400, database=None, phases=[Phase.generate], deadline=None)


def _kernel_below_block(spec: KVCacheSpec) -> bool:
    wanted = spec.block_stride_alignment
    return isinstance(wanted, MultipleOf) and math.gcd(wanted.n, spec.block_size) < spec.block_size


def _compressed(spec: KVCacheSpec) -> bool:
    return isinstance(spec, MLAAttentionSpec) and spec.tokens_per_state_value > 1


def _worker_misses_a_group(problem: PlanningProblem) -> bool:
    config = problem.config
    groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, dict(problem.specs))
    return any(
        not g.layer_names
        for worker in problem.workers
        for g in project_kv_cache_groups_to_worker(groups, worker)
    )


@pytest.mark.parametrize(
    ("family", "regime"),
    [
        ("deepseek_v4", "a compressed indexer read in kernel blocks below its cache block"),
        ("glm5", "a compressed indexer read in kernel blocks below its cache block"),
        ("deepseek_v32", "an indexer read in kernel blocks below its cache block"),
    ],
)
def test_indexer_kernel_blocks_below_the_cache_block(family: str, regime: str) -> None:
    """The sparse-MLA families draw indexers whose kernel block undercuts the cache block."""
    model = find(
        family_strategy(family),
        lambda m: any(".indexer." in n and _kernel_below_block(s) for n, s in m.specs.items()),
        settings=_REACH,
    )
    assert any(_kernel_below_block(s) for s in model.specs.values()), regime


def test_compressed_mla_placed_layer_outer() -> None:
    """The default families draw compressed MLA latents planned in a layer-outer layout.

    Asked of the MLA family, which draws them in half its models: over every
    family the regime is about one problem in 300, too rare for a sure find.
    """
    problem = find(
        cs.planning_problems(models_strategy=family_strategy("mla")),
        lambda p: (
            not p.config.kv_cache_layout.is_block_outermost
            and any(_compressed(s) for s in p.specs.values())
        ),
        settings=_REACH,
    )
    assert any(_compressed(s) for s in problem.specs.values())


def test_layer_outer_refused_where_unification_refuses() -> None:
    """No GLM-5 problem is drawn layer-outer: vLLM's unification (and kvref's) refuses them.

    Field builders place GLM-5 layer-outer with their own placement; the
    reference cannot plan those inputs, so the kit would only reject them.
    Block-outer ringless GLM-5 problems are drawn instead (BLNHC too).
    """
    problem = find(
        cs.planning_problems(models_strategy=family_strategy("glm5")),
        lambda p: p.config.kv_cache_layout is KVCacheLayout.BLNHC,
        settings=_REACH,
    )
    assert not any(isinstance(s, CircularBufferSpec) for s in problem.specs.values())
    model = {n: s for w in problem.workers for n, s in w.items()}
    assert all(m.is_block_outermost for m in cs.allowed_layouts(model))


def test_deepseek_v4_backends_stay_block_outer() -> None:
    """DeepSeek-V4's own backends keep their block-outer layouts (contract.md#layouts)."""
    model = find(family_strategy("deepseek_v4"), lambda m: True, settings=_REACH)
    assert all(layout.is_block_outermost for layout in cs.allowed_layouts(model))


def test_pipeline_worker_without_any_layer_of_a_group() -> None:
    """Default problems include pipeline splits where a worker holds no layer of some group."""
    problem = find(cs.planning_problems(), _worker_misses_a_group, settings=_REACH)
    assert len(problem.workers) > 1
