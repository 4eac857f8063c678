"""Placement: bytes per block, layout validation, tensors, host backing.

See contract.md#default-placement.
"""

from __future__ import annotations

import pytest
from specs import full, sw

from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheLayout,
    PlanningConfig,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvref.errors import ConfigError, LayoutError, PartitionError
from kvref.placement import bytes_per_block, get_kv_cache_config_from_groups

F = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=4, dtype="float16")
S = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=4, dtype="float16", sliding_window=4)
GROUPS = [
    KVCacheGroupSpec(layer_names=["L0", "L3"], kv_cache_spec=F),
    KVCacheGroupSpec(layer_names=["L1", "L4"], kv_cache_spec=S),
    KVCacheGroupSpec(layer_names=["L2", "L5"], kv_cache_spec=S),
]


def _rows(layout: str, groups: list[KVCacheGroupSpec], n: int) -> list[tuple[object, ...]]:
    config = get_kv_cache_config_from_groups(PlanningConfig(kv_cache_layout=layout), groups, n)
    return [
        (t.layers, t.size, t.layer_stride, t.block_stride, t.offset)
        for t in config.kv_cache_tensors
    ]


class TestWorkedExample:
    """contract.md#default-placement, every tensor listed."""

    def test_lbnhc(self) -> None:
        """LBNHC: three tensors of 256 bytes, layer stride 128, block stride 32, offset 0."""
        assert _rows("LBNHC", GROUPS, 4) == [
            (("L0", "L3"), 256, 128, 32, 0),
            (("L1", "L4"), 256, 128, 32, 0),
            (("L2", "L5"), 256, 128, 32, 0),
        ]

    def test_blhnc(self) -> None:
        """BLHNC: layer stride 32, block stride 64 (the bytes per block)."""
        assert _rows("BLHNC", GROUPS, 4) == [
            (("L0", "L3"), 256, 32, 64, 0),
            (("L1", "L4"), 256, 32, 64, 0),
            (("L2", "L5"), 256, 32, 64, 0),
        ]

    def test_mixed_pages_with_alignment(self) -> None:
        """Mixed pages, alignment 128: BLHNC rounds the block to 256; LBNHC strides b0 by 128."""
        a = FullAttentionSpec(block_size=2, num_kv_heads=2, head_size=4, dtype="float16")
        b = FullAttentionSpec(
            block_size=2, num_kv_heads=1, head_size=4, dtype="float16", block_stride_alignment=128
        )
        group = [
            KVCacheGroupSpec(
                layer_names=["a0", "a1", "b0"],
                kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs={"a0": a, "a1": a, "b0": b}),
            )
        ]
        assert _rows("BLHNC", group, 3) == [
            (("a0", "a1"), 768, 64, 256, 0),
            (("b0",), 768, 32, 256, 128),
        ]
        assert _rows("LBNHC", group, 3) == [
            (("a0", "a1"), 768, 192, 64, 0),
            (("b0",), 768, 384, 128, 384),
        ]

    def test_bytes_per_block(self) -> None:
        """Bytes per block are the widest group's pages: 2 x 32 = 64 in both layout families."""
        assert bytes_per_block(GROUPS, KVCacheLayout.LBNHC) == 64
        assert bytes_per_block(GROUPS, KVCacheLayout.BLHNC) == 64


class TestExactBlocks:
    """Placement returns exactly the blocks asked for."""

    def test_override_is_not_applied(self) -> None:
        """With num_gpu_blocks_override set, the config still has the requested count."""
        config = get_kv_cache_config_from_groups(
            PlanningConfig(num_gpu_blocks_override=1000), GROUPS, 7
        )
        assert config.num_blocks == 7
        assert {t.size for t in config.kv_cache_tensors} == {7 * 64}

    def test_no_groups(self) -> None:
        """No groups give the null block and no tensors."""
        config = get_kv_cache_config_from_groups(PlanningConfig(), [], 5)
        assert config.num_blocks == 1 and config.kv_cache_tensors == ()

    @pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
    def test_bad_num_blocks(self, bad: object) -> None:
        """A block count that is not a positive int is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="num_blocks"):
            get_kv_cache_config_from_groups(PlanningConfig(), GROUPS, bad)  # type: ignore[arg-type]


class TestLayoutValidation:
    """contract.md#default-placement."""

    def test_mixed_pages_need_block_outermost(self) -> None:
        """Mixed pages across groups in LBNHC are a LayoutError that advises BLHNC."""
        big = FullAttentionSpec(block_size=2, num_kv_heads=2, head_size=4, dtype="float16")
        groups = [GROUPS[0], KVCacheGroupSpec(layer_names=["x"], kv_cache_spec=big)]
        with pytest.raises(LayoutError, match="BLHNC"):
            get_kv_cache_config_from_groups(PlanningConfig(), groups, 2)
        assert (
            get_kv_cache_config_from_groups(
                PlanningConfig(kv_cache_layout="BLHNC"), groups, 2
            ).num_blocks
            == 2
        )

    def test_layer_in_two_groups(self) -> None:
        """A layer in two groups is a PartitionError naming it."""
        groups = [GROUPS[0], KVCacheGroupSpec(layer_names=["L0"], kv_cache_spec=F)]
        with pytest.raises(PartitionError, match="L0"):
            get_kv_cache_config_from_groups(PlanningConfig(), groups, 2)


class TestDeliberateDifferences:
    """Layer-outer groups with different aligned strides share one stride.

    See contract.md#deliberate-differences.
    """

    def test_common_stride_prevents_block_aliasing(self) -> None:
        """The contract's example: vLLM strides G0 by 96 and G1 by 128; kvref strides both by 192.

        See contract.md#memory-safety.
        """
        from conformance.check.memory import find_block_overlaps

        f = full(heads=1, head_size=12, block_size=2, dtype="float16", block_stride_alignment=24)
        s = sw(8, heads=1, head_size=12, block_size=2, dtype="float16", block_stride_alignment=64)
        assert f.page_size_bytes == s.page_size_bytes == 96
        groups = [
            KVCacheGroupSpec(layer_names=["L0", "L3"], kv_cache_spec=f),
            KVCacheGroupSpec(layer_names=["L1", "L2"], kv_cache_spec=s),
        ]
        config = get_kv_cache_config_from_groups(PlanningConfig(), groups, 2)
        assert {t.block_stride for t in config.kv_cache_tensors} == {192}
        assert find_block_overlaps(config, KVCacheLayout.LBNHC) == []


class TestHostBacking:
    """Host-resident groups get their own LBNHC backing and block count."""

    def test_host_group(self) -> None:
        """Host tensors come first, sized by host_pool_bytes // host bytes per block."""
        groups = [
            GROUPS[0],
            KVCacheGroupSpec(layer_names=["h0"], kv_cache_spec=F, host_resident=True),
        ]
        config = get_kv_cache_config_from_groups(
            PlanningConfig(host_pool_bytes=32 * 10 + 5), groups, 4
        )
        host, device = config.kv_cache_tensors
        assert host.host_resident and host.size == 320 and config.host_num_blocks == 10
        assert device.size == 4 * 64 and not device.host_resident

    def test_host_without_pool(self) -> None:
        """Host groups without host_pool_bytes are a ConfigError naming the field."""
        groups = [KVCacheGroupSpec(layer_names=["h0"], kv_cache_spec=F, host_resident=True)]
        with pytest.raises(ConfigError, match="host_pool_bytes"):
            get_kv_cache_config_from_groups(PlanningConfig(), groups, 4)
