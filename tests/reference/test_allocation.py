"""kvref.allocation: backings and per-layer views of hand-built configs.

See contract.md#views-and-strides and contract.md#host-residency and contract.md#default-placement.

Device-dependent tests run on ``KVREF_TEST_DEVICE`` (default cpu) and, where
only shapes matter, on meta.
"""

from __future__ import annotations

import pytest
import torch
from _devcases import (
    SHAPE_DEVICES,
    TEST_DEVICE,
    full,
    host_config,
    interleaved,
    mamba_config,
    worked_example,
)

import kvref
from kvref.allocation import (
    HOST_LAYOUT,
    KVCacheAllocation,
    allocate_backings,
    allocate_kv_cache,
    planned_device_bytes,
    planned_host_bytes,
    resolve_layout,
    tensor_geometries,
    view_problems,
)
from kvref.errors import PlacementError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor


def byte_address(view: torch.Tensor, block: int) -> int:
    """Byte offset in the backing where ``view``'s block ``block`` starts."""
    return int((view.storage_offset() + block * view.stride(0)) * view.element_size())


def byte_strides(view: torch.Tensor) -> tuple[int, ...]:
    """The view's strides in bytes."""
    return tuple(s * view.element_size() for s in view.stride())


def with_tensors(config: KVCacheConfig, tensors: list[KVCacheTensor]) -> KVCacheConfig:
    """``config`` with its tensors replaced."""
    return KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=config.kv_cache_groups,
        kv_cache_layout=config.kv_cache_layout,
        host_num_blocks=config.host_num_blocks,
    )


class TestResolveLayout:
    def test_explicit_layout_wins(self) -> None:
        """An explicit layout overrides the config's."""
        config = worked_example(KVCacheLayout.LBNHC)
        assert resolve_layout(config, "blhnc") is KVCacheLayout.BLHNC

    def test_config_layout_is_default(self) -> None:
        """Without an explicit layout the config's is used."""
        assert resolve_layout(worked_example(KVCacheLayout.BLHNC)) is KVCacheLayout.BLHNC

    def test_lbnhc_when_config_has_none(self) -> None:
        """A config without a layout is viewed in LBNHC."""
        config = worked_example(KVCacheLayout.LBNHC)
        bare = KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=config.kv_cache_tensors,
            kv_cache_groups=config.kv_cache_groups,
        )
        assert resolve_layout(bare) is KVCacheLayout.LBNHC


class TestPlannedBytes:
    def test_device_bytes_of_worked_example(self) -> None:
        """contract.md#default-placement's backing is 256 bytes."""
        assert planned_device_bytes(worked_example(KVCacheLayout.LBNHC)) == 256

    def test_host_bytes_excluded_from_device_bytes(self) -> None:
        """Host tensors count in the host figure only."""
        config = host_config()
        assert planned_device_bytes(config) == 256
        assert planned_host_bytes(config) == 160

    def test_no_tensors(self) -> None:
        """An attention-free config plans no bytes."""
        empty = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
        assert planned_device_bytes(empty) == 0
        assert planned_host_bytes(empty) == 0


class TestTensorGeometry:
    def test_worked_example_lbnhc(self) -> None:
        """LBNHC strides of the contract are (128, 32, 16, 16, 1) with shape (2, 4, 1, 2, 16).

        See contract.md#default-placement.
        """
        geometry = tensor_geometries(worked_example(KVCacheLayout.LBNHC))[0]
        assert geometry.shape == (2, 4, 1, 2, 16)
        assert geometry.strides == (128, 32, 16, 16, 1)
        assert geometry.end == 256
        assert geometry.page_bytes == 32

    def test_host_tensors_use_host_layout(self) -> None:
        """Host-resident tensors are LBNHC with host_num_blocks whatever the device layout."""
        geometries = tensor_geometries(host_config(), KVCacheLayout.BLHNC)
        host = next(g for g in geometries if g.tensor.host_resident)
        assert host.layout is HOST_LAYOUT
        assert host.shape[1] == 5

    def test_valid_views_have_no_problems(self) -> None:
        """Every tensor of contract.md#default-placement fits its backing and its dtype."""
        for geometry in tensor_geometries(worked_example(KVCacheLayout.BLHNC)):
            assert view_problems(geometry, geometry.tensor.size) == []

    def test_first_out_of_bounds_layer_reported(self) -> None:
        """The problem names the first layer whose footprint leaves the backing."""
        geometry = tensor_geometries(worked_example(KVCacheLayout.LBNHC))[0]
        (problem,) = view_problems(geometry, 200)
        assert problem.kind == "bounds"
        assert problem.layer == "L3"
        assert problem.byte_range == (128, 256)


@pytest.mark.parametrize("device", SHAPE_DEVICES)
class TestAllocateKVCache:
    def test_worked_example_lbnhc(self, device: str) -> None:
        """Placement example in LBNHC: block 2 of L3 is bytes 192..224, aliasing L4's block 2.

        See contract.md#default-placement.
        """
        with allocate_kv_cache(worked_example(KVCacheLayout.LBNHC), device) as allocation:
            assert allocation.device_buffer is not None
            assert allocation.device_buffer.numel() == 256
            # vLLM's worker allocates int8 bytes (vllm/v1/worker/utils.py allocate_kv_cache).
            assert allocation.device_buffer.dtype == torch.int8
            assert allocation.device_buffer.device.type == torch.device(device).type
            l3, l4 = allocation.views["L3"], allocation.views["L4"]
            assert l3.dtype == torch.float16
            assert tuple(l3.shape) == (4, 1, 2, 8)
            assert byte_address(l3, 2) == 192
            assert byte_address(l4, 2) == 192
            assert allocation.layout is KVCacheLayout.LBNHC

    def test_worked_example_blhnc(self, device: str) -> None:
        """Placement example in BLHNC: block 2 of L3 starts at byte 160, blocks 64 bytes apart.

        See contract.md#default-placement.
        """
        with allocate_kv_cache(worked_example(KVCacheLayout.BLHNC), device) as allocation:
            l3 = allocation.views["L3"]
            assert byte_address(l3, 2) == 160
            assert byte_strides(l3)[0] == 64

    def test_mamba_stays_raw_bytes(self, device: str) -> None:
        """A Mamba layer's view is vLLM's int8 bytes, shape (N, 1, 1, C) with its 44-byte page."""
        with allocate_kv_cache(mamba_config(), device) as allocation:
            view = allocation.views["m0"]
            assert view.dtype == torch.int8
            assert tuple(view.shape) == (3, 1, 1, 44)
            assert view.stride() == (44, 44, 44, 1)

    @pytest.mark.parametrize(
        ("layout", "strides", "b_start"),
        [
            pytest.param(KVCacheLayout.LHBNC, (32, 96, 16, 2), 192, id="lhbnc-split-per-head"),
            pytest.param(KVCacheLayout.BHLNC, (128, 64, 16, 2), 32, id="bhlnc-interleaves-layers"),
        ],
    )
    def test_head_outer_layouts(
        self, device: str, layout: KVCacheLayout, strides: tuple[int, ...], b_start: int
    ) -> None:
        """Each keeps the contract's strides and layer b's start.

        LHBNC splits pages per head: B 32, H 96, S 16, and b starts at 192.
        BHLNC interleaves layers: B 128, H 64, S 16, and b starts at 32.
        See contract.md#layouts.
        """
        with allocate_kv_cache(interleaved(layout), device) as allocation:
            a, b = allocation.views["a"], allocation.views["b"]
            assert byte_strides(a) == strides
            assert byte_address(b, 0) == b_start

    def test_host_tensors_on_cpu(self, device: str) -> None:
        """Host-resident layers get views of a CPU pool sized by host_num_blocks."""
        with allocate_kv_cache(host_config(), device, pin_host=False) as allocation:
            (pool,) = allocation.host_buffers
            assert pool.device.type == "cpu"
            assert pool.numel() == 160
            assert allocation.views["h0"].device.type == "cpu"
            assert tuple(allocation.views["h0"].shape) == (5, 1, 2, 8)
            assert allocation.views["a0"].device.type == torch.device(device).type
            assert allocation.host_pinned is False
            assert allocation.backing(0) is pool

    def test_layout_argument_overrides_config(self, device: str) -> None:
        """An explicit layout changes the head and state strides of the views."""
        config = interleaved(KVCacheLayout.LHBNC)
        with allocate_kv_cache(config, device, layout=KVCacheLayout.LBHNC) as allocation:
            assert allocation.layout is KVCacheLayout.LBHNC
            assert byte_strides(allocation.views["a"])[1:3] == (32, 16)

    def test_no_tensors(self, device: str) -> None:
        """An attention-free config allocates nothing and has no views."""
        empty = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
        with allocate_kv_cache(empty, device) as allocation:
            assert allocation.device_buffer is None
            assert allocation.views == {}

    def test_close_drops_references(self, device: str) -> None:
        """close() leaves no buffer or view behind and marks the allocation closed."""
        allocation = allocate_kv_cache(worked_example(KVCacheLayout.LBNHC), device)
        allocation.close()
        assert allocation.closed
        assert allocation.device_buffer is None
        assert allocation.views == {}
        assert allocation.tensor_views == ()


@pytest.mark.skipif(TEST_DEVICE == "meta", reason="needs data")
class TestAllocationData:
    def test_backing_is_zeroed(self) -> None:
        """The device backing starts as zeros."""
        with allocate_kv_cache(worked_example(KVCacheLayout.LBNHC), TEST_DEVICE) as allocation:
            assert allocation.device_buffer is not None
            assert int(allocation.device_buffer.count_nonzero()) == 0

    def test_views_alias_the_backing(self) -> None:
        """Writing through L3's view lands at the contract's bytes 192..224 of the backing.

        See contract.md#default-placement.
        """
        with allocate_kv_cache(worked_example(KVCacheLayout.LBNHC), TEST_DEVICE) as allocation:
            allocation.views["L3"][2].fill_(1.0)
            assert allocation.device_buffer is not None
            touched = allocation.device_buffer.nonzero().flatten().cpu()
            assert int(touched.min()) >= 192
            assert int(touched.max()) < 224

    def test_views_cover_each_page_once(self) -> None:
        """Placement example in BLHNC: G0's layers, all blocks, cover 4 x 2 x 32 distinct bytes.

        See contract.md#default-placement.
        """
        with allocate_kv_cache(worked_example(KVCacheLayout.BLHNC), TEST_DEVICE) as allocation:
            for name in ("L0", "L3"):
                allocation.views[name].view(torch.uint8).add_(1)
            assert allocation.device_buffer is not None
            assert int(allocation.device_buffer.sum()) == 4 * 2 * 32
            assert int(allocation.device_buffer.max()) == 1


class TestAllocationErrors:
    def test_mismatched_sizes(self) -> None:
        """Device tensors of two sizes are refused, naming both sizes."""
        config = worked_example(KVCacheLayout.LBNHC)
        tensors = list(config.kv_cache_tensors)
        tensors[1] = KVCacheTensor(size=512, layers=["L1", "L4"], layer_stride=128, block_stride=32)
        with pytest.raises(PlacementError, match=r"sizes \[256, 512\]"):
            allocate_kv_cache(with_tensors(config, tensors), "meta")

    def test_out_of_bounds_view(self) -> None:
        """A backing too small for the last layer is refused before as_strided, naming it."""
        with pytest.raises(PlacementError, match=r"'L3'.*\[128, 256\).*240 bytes"):
            allocate_kv_cache(worked_example(KVCacheLayout.LBNHC, size=240), "cpu")

    def test_misaligned_block_stride(self) -> None:
        """A block stride that is not a multiple of sizeof(float16) names the layer and stride."""
        config = worked_example(KVCacheLayout.LBNHC, size=512)
        tensors = list(config.kv_cache_tensors)
        tensors[0] = KVCacheTensor(size=512, layers=["L0", "L3"], layer_stride=160, block_stride=33)
        with pytest.raises(PlacementError, match=r"'L0'.*block_stride=33.*sizeof\(torch.float16\)"):
            allocate_kv_cache(with_tensors(config, tensors), "cpu")

    def test_misaligned_offset(self) -> None:
        """An odd offset cannot start a float16 view."""
        config = worked_example(KVCacheLayout.LBNHC, size=512)
        tensors = list(config.kv_cache_tensors)
        tensors[2] = KVCacheTensor(
            size=512, layers=["L2", "L5"], layer_stride=128, block_stride=32, offset=1
        )
        with pytest.raises(PlacementError, match=r"'L2'.*offset=1"):
            allocate_kv_cache(with_tensors(config, tensors), "cpu")

    @pytest.mark.parametrize(
        ("layer", "match"),
        [
            pytest.param("X", "'X' belongs to no KV cache group", id="layer-without-group"),
            pytest.param("L0", "'L0' appears in", id="layer-in-two-tensors"),
        ],
    )
    def test_extra_tensor_of_a_layer(self, layer: str, match: str) -> None:
        """An extra tensor of one layer is refused.

        A layer no group holds has no spec to view it with; a layer placed
        twice would get two views.
        """
        config = worked_example(KVCacheLayout.LBNHC)
        tensors = [
            *config.kv_cache_tensors,
            KVCacheTensor(size=256, layers=[layer], layer_stride=128, block_stride=32),
        ]
        with pytest.raises(PlacementError, match=match):
            allocate_kv_cache(with_tensors(config, tensors), "cpu")

    @pytest.mark.skipif(torch.cuda.is_available(), reason="pinning works here")
    def test_explicit_pinning_without_accelerator(self) -> None:
        """pin_host=True is an error where no accelerator can pin memory."""
        with pytest.raises(RuntimeError):
            allocate_backings(host_config(), "cpu", pin_host=True)


class TestAllocationObject:
    def test_is_exported_from_kvref(self) -> None:
        """allocate_kv_cache and KVCacheAllocation are public API."""
        assert kvref.allocate_kv_cache is allocate_kv_cache
        assert kvref.KVCacheAllocation is KVCacheAllocation

    def test_views_follow_config_order(self) -> None:
        """tensor_views and backing_of follow kv_cache_tensors, host first here."""
        config = host_config()
        with allocate_kv_cache(config, "meta") as allocation:
            assert len(allocation.tensor_views) == 2
            assert allocation.backing_of == (0, -1)
            assert tuple(allocation.tensor_views[1].shape) == (2, 4, 1, 2, 16)

    def test_group_spec_decides_dtype(self) -> None:
        """A float32 group's views are float32."""
        spec = full(dtype=torch.float32)
        config = KVCacheConfig(
            num_blocks=2,
            kv_cache_tensors=[
                KVCacheTensor(size=128, layers=["x"], layer_stride=128, block_stride=64)
            ],
            kv_cache_groups=[KVCacheGroupSpec(layer_names=["x"], kv_cache_spec=spec)],
        )
        with allocate_kv_cache(config, "meta") as allocation:
            assert allocation.views["x"].dtype == torch.float32
            assert tuple(allocation.views["x"].shape) == (2, 1, 2, 8)
