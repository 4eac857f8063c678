"""``kvref.extensible`` against the installed vLLM's own second sizing step.

Under vLLM 0.34.0 both sides shrink the same capacity plan (``shrink_kv_cache_configs``)
and settle the same measurements (``finalize_extensible_kv_cache``); the
results must be equal, and where vLLM refuses, kvref refuses with its
inputs unchanged while vLLM's config keeps scaled tensors beside its old
block count (its quirk, docs/vllm.md).  Under vLLM 0.33.0, which has no
extensible KV cache, vLLM lacks both functions and kvref refuses a config
planned as it.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from _vllm_diff import INSTALLED, describe_tensors

from kvref import (
    FullAttentionSpec,
    InsufficientMemoryError,
    KVCacheLayout,
    KVCachePlan,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    UnsupportedError,
    finalize_extensible_kv_cache,
    plan_kv_cache,
    shrink_kv_cache_configs,
)
from kvref.interop import vllm as iv
from kvref.specs import KVCacheSpec
from kvref.versions import V0_34

pytestmark = pytest.mark.vllm

GIB = 2**30
KW: dict[str, Any] = {"block_size": 16, "head_size": 128, "dtype": "bfloat16"}
FULL = FullAttentionSpec(num_kv_heads=8, **KW)
SWA = SlidingWindowSpec(num_kv_heads=8, sliding_window=1024, **KW)
#: Whether the installed release has the extensible KV cache (only its class is defined).
EXTENSIBLE = INSTALLED >= V0_34


def _problem(name: str) -> tuple[PlanningConfig, list[dict[str, KVCacheSpec]]]:
    if name == "uniform":
        config = PlanningConfig(kv_cache_layout=KVCacheLayout.LBNHC, vllm_version=INSTALLED)
        return config, [{f"l{i}": FULL for i in range(4)}]
    hybrid = {f"l{i}": FULL if i % 6 == 5 else SWA for i in range(12)}
    items = list(hybrid.items())
    config = PlanningConfig(
        kv_cache_layout=KVCacheLayout.BLHNC,
        pipeline_parallel_size=2,
        auto_fit_max_model_len=name == "hybrid-auto-fit",
        max_model_len=32768,
        vllm_version=INSTALLED,
    )
    return config, [dict(items[:6]), dict(items[6:])]


def _kvref_plan(config: PlanningConfig, workers: list[dict[str, KVCacheSpec]]) -> KVCachePlan:
    return plan_kv_cache(ReferenceKVCacheConfigBuilder, config, workers, [GIB] * len(workers))


def _vllm_capacity(
    config: PlanningConfig, workers: list[dict[str, KVCacheSpec]]
) -> tuple[Any, Any]:
    """VLLM's own Core flow: its ``VllmConfig`` (length auto-fitted) and worker configs."""
    kvp = iv.vllm_modules().kvp
    vcfg = iv.to_vllm_config(config)
    specs = [iv.specs_to_vllm(w) for w in workers]
    with iv.installed_builder(kvp.DefaultKVCacheConfigBuilder), iv.quiet_vllm():
        groups = kvp.get_global_kv_cache_groups(vcfg, specs)
        configs = kvp.get_kv_cache_configs(vcfg, specs, [GIB] * len(specs), groups)
    return vcfg, configs


def _converted(configs: list[Any]) -> KVCachePlan:
    kvref_configs = tuple(iv.config_from_vllm(c) for c in configs)
    return KVCachePlan(
        global_groups=(),
        configs=kvref_configs,
        workers=(),
        max_model_len=0,
        num_blocks=kvref_configs[0].num_blocks,
    )


def _ours(configs: list[Any]) -> KVCachePlan:
    return KVCachePlan(
        global_groups=(), configs=tuple(configs), workers=(), max_model_len=0, num_blocks=0
    )


class TestAgainstVLLM:
    @pytest.mark.parametrize(("name", "num_blocks"), [("uniform", 1000), ("hybrid", 8192)])
    def test_shrink_agrees(self, name: str, num_blocks: int) -> None:
        """Both shrink the capacity to the same sizes, strides, offsets and block count."""
        config, workers = _problem(name)
        plan = _kvref_plan(config, workers)
        vcfg, configs = _vllm_capacity(config, workers)
        assert describe_tensors(_converted(configs)) == describe_tensors(plan)
        kvp = iv.vllm_modules().kvp
        with iv.installed_builder(kvp.DefaultKVCacheConfigBuilder), iv.quiet_vllm():
            kvp.shrink_kv_cache_configs(vcfg, configs, num_blocks)
        ours = shrink_kv_cache_configs(
            config.with_max_model_len(plan.max_model_len), list(plan.configs), num_blocks
        )
        assert describe_tensors(_converted(configs)) == describe_tensors(_ours(ours))
        assert (
            [c.num_blocks for c in configs]
            == [c.num_blocks for c in ours]
            == [num_blocks] * len(ours)
        )

    def test_refusal_agrees_and_vllm_keeps_scaled_tensors(self) -> None:
        """Too few blocks: both refuse; vLLM's config is half-shrunk, kvref's input untouched."""
        config, workers = _problem("uniform")
        plan = _kvref_plan(config, workers)
        vcfg, configs = _vllm_capacity(config, workers)
        kvp = iv.vllm_modules().kvp
        with (
            iv.installed_builder(kvp.DefaultKVCacheConfigBuilder),
            iv.quiet_vllm(),
            pytest.raises(ValueError, match="To serve at least one request"),
        ):
            kvp.shrink_kv_cache_configs(vcfg, configs, 512)
        assert configs[0].num_blocks == plan.num_blocks
        assert configs[0].kv_cache_tensors[0].size == 512 * GIB // plan.num_blocks
        with pytest.raises(InsufficientMemoryError):
            shrink_kv_cache_configs(config, list(plan.configs), 512)
        assert plan.configs[0].kv_cache_tensors[0].size == GIB

    @pytest.mark.parametrize(("name", "measured"), [("hybrid", 5461), ("hybrid-auto-fit", 2000)])
    def test_finalize_agrees(self, name: str, measured: int) -> None:
        """The settled block count, the (re-fitted) length and the configs are vLLM's.

        The capacity is 16,384 blocks and one 32,768-token request needs 4,293:
        5,461 keeps the length, 2,000 makes auto-fit lower it.
        """
        config, workers = _problem(name)
        plan = _kvref_plan(config, workers)
        vcfg, configs = _vllm_capacity(config, workers)
        counts = [measured, None]
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        times = importlib.import_module("vllm.v1.worker.worker_base").CompilationTimes
        kvp = iv.vllm_modules().kvp
        scheduler = utils.generate_scheduler_kv_cache_config(configs)
        with iv.installed_builder(kvp.DefaultKVCacheConfigBuilder), iv.quiet_vllm():
            theirs = kvp.finalize_extensible_kv_cache(
                vcfg, configs, scheduler, [times(0.0, 0.0, m) for m in counts]
            )
        done = finalize_extensible_kv_cache(
            config.with_max_model_len(plan.max_model_len), list(plan.configs), counts
        )
        assert done.num_blocks == theirs
        assert done.max_model_len == vcfg.model_config.max_model_len
        assert describe_tensors(_converted(configs)) == describe_tensors(_ours(list(done.configs)))
        if config.auto_fit_max_model_len:
            assert done.max_model_len < plan.max_model_len


if not EXTENSIBLE:
    # Defined per release so that neither run reports the other's tests as skipped.
    del TestAgainstVLLM


class TestWithout:
    def test_vllm_has_no_second_step_and_kvref_refuses(self) -> None:
        """VLLM 0.33.0 has neither function; kvref refuses a config planned as 0.33.0."""
        kvp = iv.vllm_modules().kvp
        assert not hasattr(kvp, "shrink_kv_cache_configs")
        assert not hasattr(kvp, "finalize_extensible_kv_cache")
        config, workers = _problem("uniform")
        plan = _kvref_plan(config, workers)
        with pytest.raises(UnsupportedError, match="has no extensible KV cache"):
            shrink_kv_cache_configs(config, list(plan.configs), 1000)
        with pytest.raises(UnsupportedError, match="has no extensible KV cache"):
            finalize_extensible_kv_cache(config, list(plan.configs), [1000])


if EXTENSIBLE:
    del TestWithout
