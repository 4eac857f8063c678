"""Core's second sizing step of vLLM 0.34.0's extensible KV cache (``kvref.extensible``).

The expected figures are worked out by hand from the page formula: four
full-attention layers of 8 heads x 128 x bf16 at block 16 take 65,536 bytes
each per block, so one block ID is 262,144 bytes and one GiB holds 4,096.
A request of 8,192 tokens needs 512 blocks.
"""

from __future__ import annotations

import attrs
import pytest

from kvref import (
    ConfigError,
    FullAttentionSpec,
    InsufficientMemoryError,
    KVCacheLayout,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    UnsupportedError,
    finalize_extensible_kv_cache,
    plan_kv_cache,
    shrink_kv_cache_configs,
)
from kvref.records import KVCacheConfig
from kvref.versions import V0_33, V0_34

GIB = 2**30
FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
LAYERS = {f"f{i}": FULL for i in range(4)}


def _capacity(**changes: object) -> tuple[PlanningConfig, list[KVCacheConfig]]:
    config = PlanningConfig(vllm_version=V0_34, kv_cache_layout=KVCacheLayout.LBNHC, **changes)  # type: ignore[arg-type]
    workers = [dict(LAYERS)]
    plan = plan_kv_cache(ReferenceKVCacheConfigBuilder, config, workers, GIB)
    # Three device layers (one host-resident) leave 5,461 blocks of 196,608 bytes.
    assert plan.num_blocks == (5461 if config.host_resident_layers else 4096)
    return config.with_max_model_len(plan.max_model_len), list(plan.configs)


class TestShrink:
    def test_device_sizes_scale_and_the_rest_stays(self) -> None:
        """Sizes become N' * size // N; strides, offsets and the inputs do not change."""
        config, configs = _capacity()
        [before] = configs
        [after] = shrink_kv_cache_configs(config, configs, 1000)
        assert after.num_blocks == 1000
        assert [t.size for t in after.kv_cache_tensors] == [262_144_000]
        assert [(t.layer_stride, t.block_stride, t.offset) for t in after.kv_cache_tensors] == [
            (4096 * 65_536, 65_536, 0)
        ]
        assert after.kv_cache_groups == before.kv_cache_groups
        assert before.num_blocks == 4096 and before.kv_cache_tensors[0].size == GIB

    def test_host_tensors_keep_their_size(self) -> None:
        """A host-resident tensor is not part of the device reservation: its size stays."""
        config, configs = _capacity(host_resident_layers={"f3"}, host_pool_bytes=2**24)
        [before] = configs
        [after] = shrink_kv_cache_configs(config, configs, 1000)
        host_before = [t.size for t in before.kv_cache_tensors if t.host_resident]
        assert host_before and [t.size for t in after.kv_cache_tensors if t.host_resident] == (
            host_before
        )
        assert all(t.size < GIB for t in after.device_tensors)

    def test_refusal_leaves_the_inputs_and_estimates_the_length(self) -> None:
        """511 usable blocks hold 8,176 tokens, not 8,192: refused; nothing was changed."""
        config, configs = _capacity()
        with pytest.raises(InsufficientMemoryError) as caught:
            shrink_kv_cache_configs(config, configs, 512)
        assert caught.value.estimated_max_model_len == 8176
        assert caught.value.available_bytes == 511 * 262_144
        assert configs[0].num_blocks == 4096 and configs[0].kv_cache_tensors[0].size == GIB

    def test_one_block_is_only_the_null_block(self) -> None:
        """N' = 1 leaves no block beside the null block: no memory at all."""
        config, configs = _capacity()
        with pytest.raises(InsufficientMemoryError, match="no available memory"):
            shrink_kv_cache_configs(config, configs, 1)

    def test_growing_is_refused(self) -> None:
        """The capacity is reserved: a larger count is a usage error naming both."""
        config, configs = _capacity()
        with pytest.raises(ConfigError, match=r"4097.*4096"):
            shrink_kv_cache_configs(config, configs, 4097)

    def test_refused_as_0_33(self) -> None:
        """VLLM 0.33.0 has no extensible KV cache."""
        config, configs = _capacity()
        with pytest.raises(UnsupportedError, match=r"0\.33\.0 has no extensible KV cache"):
            shrink_kv_cache_configs(config.with_vllm_version(V0_33), configs, 1000)


class TestFinalize:
    def test_smallest_measurement_wins(self) -> None:
        """N' is the smallest count a rank measured; ranks without one do not count."""
        config, configs = _capacity()
        done = finalize_extensible_kv_cache(config, configs, [3000, None, 2500])
        assert done.num_blocks == 2500
        assert done.configs[0].num_blocks == 2500
        assert done.max_model_len == 8192

    def test_capacity_caps_the_count(self) -> None:
        """A rank measuring more than the reservation still gets the reservation."""
        config, configs = _capacity()
        assert finalize_extensible_kv_cache(config, configs, [9999]).num_blocks == 4096
        assert finalize_extensible_kv_cache(config, configs, [None]).num_blocks == 4096

    def test_auto_fit_fits_the_length_again(self) -> None:
        """Auto-fit: 299 usable blocks serve 4,784 tokens, so the length drops to that."""
        config, configs = _capacity(auto_fit_max_model_len=True)
        assert config.max_model_len == 8192
        done = finalize_extensible_kv_cache(config, configs, [300])
        assert (done.num_blocks, done.max_model_len) == (300, 4784)

    def test_without_auto_fit_the_length_stays_and_may_be_refused(self) -> None:
        """A fixed length is re-checked, not re-fitted: 300 blocks cannot serve 8,192 tokens."""
        config, configs = _capacity()
        with pytest.raises(InsufficientMemoryError):
            finalize_extensible_kv_cache(config, configs, [300])

    def test_refused_as_0_33(self) -> None:
        """VLLM 0.33.0 has no extensible KV cache."""
        config, configs = _capacity()
        old = attrs.evolve(config, vllm_version=V0_33)
        with pytest.raises(UnsupportedError, match=r"vllm_version=0\.33\.0"):
            finalize_extensible_kv_cache(old, configs, [100])
