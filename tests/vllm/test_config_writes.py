"""A vLLM-native hook that writes its ``VllmConfig`` is named by field, isolated or not."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder

pytestmark = pytest.mark.vllm

PKG = "tests.vllm.native_builders.config_writes"
_HOOK_PURITY = ["KV-GROUP-INPUT-UNCHANGED", "KV-PLACE-INPUT-UNCHANGED"]


class TestVllmConfigWrites:
    """The adapter's comparison of the native config reaches the verdict on both paths."""

    @pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
    @pytest.mark.parametrize(
        ("name", "meant", "field"),
        [
            (
                "ShrinksModelLen",
                "KV-GROUP-INPUT-UNCHANGED",
                "vllm_config.model_config.max_model_len",
            ),
            (
                "PinsBlockOverride",
                "KV-PLACE-INPUT-UNCHANGED",
                "vllm_config.cache_config.num_gpu_blocks_override: None -> ",
            ),
            (
                "LeavesUnreadable",
                "KV-GROUP-INPUT-UNCHANGED",
                "vllm_config: the hook left a value that cannot be read (RuntimeError)",
            ),
            (
                "PinsOverrideInPoolBytes",
                "KV-PLACE-INPUT-UNCHANGED",
                "_get_pool_bytes_per_block changed vllm_config.cache_config.num_gpu_blocks",
            ),
            (
                "AlignsEngineBlockSize",
                "KV-GROUP-INPUT-UNCHANGED",
                "vllm_config.cache_config.block_size: 16 -> ",
            ),
            (
                "RaisesBatchedTokens",
                "KV-PLACE-INPUT-UNCHANGED",
                "vllm_config.scheduler_config.max_num_batched_tokens: ",
            ),
        ],
        ids=["grouping", "placement", "unreadable", "pool-bytes", "block-size", "scheduler"],
    )
    def test_a_written_vllm_config_fails_the_hooks_purity(
        self, name: str, meant: str, field: str, isolate: bool
    ) -> None:
        """The meant invariant fails naming the native field; the other one passes."""
        report = check_builder(
            f"{PKG}:{name}",
            select=_HOOK_PURITY,
            max_examples=5,
            seed=1,
            isolate=isolate,
            shrink=False,
            timeout=120,
        )
        assert {r.id for r in report.failures} == {meant}
        (failure,) = report.failures
        assert any(field in v.message for v in failure.violations), failure.violations

    def test_vllms_default_builder_writes_no_config(self) -> None:
        """vLLM's own hooks leave the config alone: no false alarm from the comparison."""
        report = check_builder(
            "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder",
            select=_HOOK_PURITY,
            max_examples=20,
            seed=3,
            timeout=120,
        )
        assert report.ok, [r.violations for r in report.failures]
        assert all(r.examples > 0 for r in report.results)
