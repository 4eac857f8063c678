"""The Core-flow invariants fail on broken Core flows.

Under kvref's own Core these invariants hold for any builder that keeps its
hook contract (a hook that breaks it is reported by the hook invariants), so
they are shown to catch their bugs with deliberately broken flows passed to
``observe_core`` (as a vLLM-based Core would be).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pytest
from specs import MODEL_A_PP0, MODEL_A_PP1, hydra_layers

from conformance.check.catalog import Unjudged, by_id
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.core import observe_core
from kvref import (
    KVCachePlan,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    plan_kv_cache,
)
from kvref.errors import InsufficientMemoryError
from kvref.specs import KVCacheSpec

WORKERS = [MODEL_A_PP0, MODEL_A_PP1]
MEMORY = [2 * 2**30, 3 * 2**29]
CONFIG = PlanningConfig(max_model_len=32768)


def _replan(plan: KVCachePlan, n: int, which: Sequence[int] | None = None) -> KVCachePlan:
    builder = ReferenceKVCacheConfigBuilder()
    configs = [
        builder.get_kv_cache_config_from_groups(CONFIG, c.kv_cache_groups, n)
        if which is None or w in which
        else c
        for w, c in enumerate(plan.configs)
    ]
    return attrs.evolve(plan, configs=tuple(configs), num_blocks=n)


def _run(
    core: Callable[..., Any],
    config: PlanningConfig = CONFIG,
    memory: Sequence[int] = MEMORY,
    workers: Sequence[Mapping[str, KVCacheSpec]] = WORKERS,
) -> Any:
    guard = Guard(10)
    ctx = Context(
        factory=make_factory(ReferenceKVCacheConfigBuilder, guard), guard=guard, core=core
    )
    return observe_core(ctx, config, workers, memory)


def _failed(obs: Any) -> set[str]:
    return {
        i
        for i, inv in by_id().items()
        if inv.scenario == "core" and (found := inv.check(obs)) and not isinstance(found, Unjudged)
    }


class TestHonestCore:
    """kvref's Core keeps every Core invariant on the contract.md#core-flow example."""

    def test_reference_core_clean(self) -> None:
        """No Core invariant fails on the PP=2 worked example."""
        obs = _run(plan_kv_cache)
        assert obs.plan is not None and obs.plan.num_blocks == 4915
        assert _failed(obs) == set()


class TestBrokenCores:
    """Each broken flow fails exactly its invariant."""

    def test_no_convergence(self) -> None:
        """Workers left with their own block counts fail KV-CORE-SAME-BLOCKS."""

        def core(*args: Any) -> KVCachePlan:
            plan = plan_kv_cache(*args)
            return _replan(plan, 4000, which=[1])

        assert _failed(_run(core)) == {"KV-CORE-SAME-BLOCKS"}

    def test_over_memory(self) -> None:
        """Blocks beyond the memory fail KV-CORE-MEMORY."""

        def core(*args: Any) -> KVCachePlan:
            return _replan(plan_kv_cache(*args), 6000)

        assert _failed(_run(core)) == {"KV-CORE-MEMORY"}

    def test_too_few_blocks(self) -> None:
        """Half the blocks that fit fail KV-CORE-SLACK."""

        def core(*args: Any) -> KVCachePlan:
            return _replan(plan_kv_cache(*args), 2440)

        assert _failed(_run(core)) == {"KV-CORE-SLACK"}

    def test_foreign_layers(self) -> None:
        """A worker config without one of its layers fails KV-CORE-WORKER-LAYERS."""

        def core(*args: Any) -> KVCachePlan:
            plan = plan_kv_cache(*args)
            config = plan.configs[1]
            tensors = [t for t in config.kv_cache_tensors if "l29" not in t.layers]
            broken = attrs.evolve(config, kv_cache_tensors=tensors)
            return attrs.evolve(plan, configs=(plan.configs[0], broken))

        assert _failed(_run(core)) == {"KV-CORE-WORKER-LAYERS"}

    def test_override_ignored(self) -> None:
        """A flow that ignores num_gpu_blocks_override fails KV-CORE-OVERRIDE."""

        def core(builder: Any, config: PlanningConfig, *rest: Any) -> KVCachePlan:
            return plan_kv_cache(builder, attrs.evolve(config, num_gpu_blocks_override=None), *rest)

        obs = _run(core, config=attrs.evolve(CONFIG, num_gpu_blocks_override=3000))
        assert _failed(obs) == {"KV-CORE-OVERRIDE"}

    def test_admits_too_little_memory(self) -> None:
        """A flow that plans although one request does not fit fails KV-CORE-ADMISSION."""

        def core(builder: Any, config: PlanningConfig, *rest: Any) -> KVCachePlan:
            try:
                return plan_kv_cache(builder, config, *rest)
            except InsufficientMemoryError:
                return plan_kv_cache(builder, config.with_max_model_len(1024), *rest)

        obs = _run(core, config=CONFIG.with_max_model_len(131072), memory=[2**30, 2**30])
        assert obs.plan is not None
        assert _failed(obs) == {"KV-CORE-ADMISSION"}

    def test_untyped_error(self) -> None:
        """A flow that fails with a bare AssertionError fails KV-CORE-ERROR-TYPED."""

        def core(*args: Any) -> KVCachePlan:
            raise AssertionError("Some layers are not assigned to any group.")

        assert _failed(_run(core)) == {"KV-CORE-ERROR-TYPED"}

    @pytest.mark.parametrize("memory", [[2**20, 2**20]])
    def test_typed_insufficient_memory_is_fine(self, memory: list[int]) -> None:
        """A typed InsufficientMemoryError fails no Core invariant."""
        obs = _run(plan_kv_cache, memory=memory)
        assert obs.plan is None and _failed(obs) == set()


def _hydra_workers() -> list[dict[str, KVCacheSpec]]:
    """tests/data/models/acme_hydra.json as the kit drew it (seed 8): 6 x (full + sw512)."""
    return [hydra_layers()]


#: A counterexample found in the field: auto-fit with the hybrid manager disabled.
HYDRA_CONFIG = PlanningConfig(
    auto_fit_max_model_len=True,
    max_num_batched_tokens=8192,
    disable_hybrid_kv_cache_manager=True,
    num_hidden_layers=6,
)
#: Exactly 254 blocks of 589,824 bytes: 253 after the null block.
HYDRA_MEMORY = [149815296]


class TestPromotedWindowAdmission:
    """A window promoted to full attention needs full attention's blocks, not the window's.

    With the hybrid manager disabled the sliding layers are allocated as full
    attention (SPEC 3.2): one request at L needs ``cdiv(L, 32) = 253`` blocks,
    not the window's ``cdiv(min(511 + I, L), 32) + 1 = 254``.  The kit's
    oracle once read the layers' own sliding kind and failed the reference
    (and vLLM, which plans the same) at about 1 seed in 16.
    """

    def test_reference_auto_fit_passes_admission(self) -> None:
        """kvref fits max_model_len=8096 into 253 blocks; no Core invariant fails."""
        obs = _run(plan_kv_cache, HYDRA_CONFIG, HYDRA_MEMORY, _hydra_workers())
        assert obs.plan is not None
        assert obs.plan.max_model_len == 8096 and obs.plan.num_blocks == 254
        assert obs.plan.workers[0].needed_memory == 253 * 589824
        assert _failed(obs) == set()

    def test_one_block_too_long_still_fails(self) -> None:
        """A flow that plans one block's worth of tokens longer fails KV-CORE-ADMISSION."""

        def core(*args: Any) -> KVCachePlan:
            # 8097 tokens need cdiv(8097, 32) = 254 blocks: one more than is left.
            return attrs.evolve(plan_kv_cache(*args), max_model_len=8097)

        obs = _run(core, HYDRA_CONFIG, HYDRA_MEMORY, _hydra_workers())
        assert _failed(obs) == {"KV-CORE-ADMISSION"}
        violations = by_id()["KV-CORE-ADMISSION"].check(obs)
        assert violations and "needs 149815296 bytes" in str(next(iter(violations)))
