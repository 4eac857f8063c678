"""Kernel-block splitting (kvref.kernel_blocks, kvref.backends) and the kernel views of allocation.

Pure tests of the worked cases of vLLM 0.33.0's ``select_common_block_size``,
``prepare_kernel_block_sizes``, ``create_kv_cache_views`` with a kernel block
size and HiSparse's kernel block size; ``tests/vllm/test_layout_kernel_diff.py``
compares the same functions with vLLM's own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import PlanningConfig, plan_kv_cache
from kvref.allocation import allocate_kv_cache, kernel_geometries
from kvref.backends import AttentionBackend, block_size_is_supported, select_common_block_size
from kvref.errors import ConfigError, HiSparseError, LayoutError
from kvref.extra_specs import HiSparseHotSpec
from kvref.hisparse import resolve_hisparse_specs
from kvref.kernel_blocks import (
    KernelBlockSplit,
    hisparse_kernel_block_size,
    kernel_block_split,
    kernel_tensor_geometries,
    prepare_kernel_block_sizes,
)
from kvref.specs import FullAttentionSpec, MLAAttentionSpec, MultipleOf, SlidingWindowSpec

BF16: dict[str, Any] = {"dtype": torch.bfloat16, "head_size": 64, "block_size": 64}
FULL = FullAttentionSpec(num_kv_heads=2, **BF16)
SWA = SlidingWindowSpec(num_kv_heads=2, sliding_window=128, **BF16)


def _backend(*sizes: Any, name: str = "K", layers: Any = ()) -> AttentionBackend:
    return AttentionBackend(name=name, layers=layers, supported_kernel_block_sizes=sizes)


def _plan(layout: str, specs: dict[str, Any], *backends: AttentionBackend) -> tuple[Any, Any]:
    config = PlanningConfig(
        kv_cache_layout=layout,
        attention_backends=backends,
        max_model_len=128,
        num_gpu_blocks_override=16,
    )
    return config, plan_kv_cache(None, config, [specs], 1 << 24).configs[0]


class TestSplit:
    """KernelBlockSplit: manager block b holds kernel blocks b * r + j."""

    def test_ids_and_their_manager_block(self) -> None:
        """Block 3 of 64 tokens in 16-token kernel blocks is kernel blocks 12..15."""
        split = KernelBlockSplit(block_size=64, kernel_block_size=16)
        assert split.kernel_blocks_per_block == 4
        assert list(split.kernel_block_ids(3)) == [12, 13, 14, 15]
        assert split.manager_block_of(14) == (3, 2)

    def test_kernel_size_must_divide(self) -> None:
        """A kernel block size that does not divide the block size is a LayoutError."""
        with pytest.raises(LayoutError, match="kernel_block_size=48 must divide block_size=64"):
            KernelBlockSplit(block_size=64, kernel_block_size=48)

    def test_split_from_backends(self) -> None:
        """kernel_block_split picks the common size of the backends."""
        assert kernel_block_split(64, [_backend(16, 32)]).kernel_block_size == 32


class TestCommonBlockSize:
    """select_common_block_size: the block size itself, else the largest shared exact size."""

    def test_supported_block_size_is_kept(self) -> None:
        """A block size every backend takes is not split."""
        assert select_common_block_size(64, [_backend(MultipleOf(16)), _backend(64)]) == 64
        assert select_common_block_size(64, []) == 64

    def test_largest_shared_exact_size(self) -> None:
        """Otherwise the largest exact size dividing the block that every backend takes."""
        backends = [_backend(16, 32, name="a"), _backend(MultipleOf(16), name="b")]
        assert select_common_block_size(128, backends) == 32

    def test_no_shared_size_names_every_backend(self) -> None:
        """No common size is a LayoutError naming the block size and each backend's sizes."""
        backends = [_backend(48, name="a"), _backend(64, name="b")]
        with pytest.raises(LayoutError, match=r"block_size=192 .*a: \[48\]; b: \[64\]"):
            select_common_block_size(192, backends)

    def test_a_backend_without_sizes_takes_none(self) -> None:
        """An empty size list supports no block size, as in vLLM."""
        assert not block_size_is_supported(
            [AttentionBackend(name="e", supported_kernel_block_sizes=())], 16
        )


class TestPrepareSizes:
    """prepare_kernel_block_sizes: one size per group, as the worker computes it."""

    def test_layer_outer_group_is_split(self) -> None:
        """An LBNHC group whose backend takes 16-token blocks gets 16."""
        config, kv_cache_config = _plan("LBNHC", {"a": FULL, "b": FULL}, _backend(16))
        assert prepare_kernel_block_sizes(config, kv_cache_config) == [16]

    def test_packed_group_is_not_split(self) -> None:
        """A block-outermost packed group keeps its block size whatever its backends take."""
        config, kv_cache_config = _plan("BLHNC", {"a": FULL, "b": FULL}, _backend(16))
        (tensor,) = kv_cache_config.kv_cache_tensors
        assert tensor.block_stride > tensor.layer_stride
        assert prepare_kernel_block_sizes(config, kv_cache_config) == [64]

    def test_each_group_uses_its_own_layers_backends(self) -> None:
        """Backends are per layer: only the group whose layers run the 16-token kernel splits."""
        config, kv_cache_config = _plan(
            "LBNHC",
            {"a": FULL, "s": SWA, "t": SWA},
            _backend(16, name="full", layers={"a"}),
            _backend(MultipleOf(16), name="swa", layers={"s", "t"}),
        )
        by_group = {
            tuple(g.layer_names): size
            for g, size in zip(
                kv_cache_config.kv_cache_groups,
                prepare_kernel_block_sizes(config, kv_cache_config),
                strict=True,
            )
        }
        assert by_group == {("a",): 16, ("s",): 64, ("t",): 64}


class TestKernelViews:
    """kernel_tensor_geometries and allocate_kv_cache's kernel views."""

    def test_geometry_counts_and_steps_kernel_blocks(self) -> None:
        """A 4-way split has 4x the blocks, a quarter of the block stride and of the states."""
        _, kv_cache_config = _plan("LBNHC", {"a": FULL, "b": FULL}, _backend(16))
        (kernel,) = kernel_tensor_geometries(kv_cache_config, [16], kv_cache_config.kv_cache_layout)
        assert kernel is not None
        tensor = kv_cache_config.kv_cache_tensors[0]
        assert kernel.shape[1] == 4 * kv_cache_config.num_blocks
        assert kernel.shape[3] == 16
        assert kernel.strides[:2] == (tensor.layer_stride, tensor.block_stride // 4)
        assert (
            kernel.kernel_block_address(1, 5) == tensor.layer_stride + 5 * tensor.block_stride // 4
        )

    def test_kernel_views_read_the_manager_views_bytes(self) -> None:
        """In LBNHC kernel block b * r + j is tokens j * 16 .. of manager block b, byte for byte."""
        config, kv_cache_config = _plan("LBNHC", {"a": FULL, "b": FULL}, _backend(16))
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        with allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=sizes) as allocation:
            view, kernel = allocation.views["b"], allocation.kernel_views["b"]
            view.copy_(torch.arange(view.numel(), dtype=torch.float32).reshape(view.shape))
            assert kernel.data_ptr() == view.data_ptr()
            for block in range(kv_cache_config.num_blocks):
                for j in range(4):
                    assert torch.equal(kernel[block * 4 + j], view[block, :, j * 16 : (j + 1) * 16])
            assert allocation.kernel_block_sizes == (16,)

    def test_without_sizes_there_are_no_kernel_views(self) -> None:
        """Existing callers see no change: no kernel sizes, no kernel views."""
        _, kv_cache_config = _plan("LBNHC", {"a": FULL}, _backend(16))
        with allocate_kv_cache(kv_cache_config, "cpu") as allocation:
            assert allocation.kernel_views == {} and allocation.kernel_block_sizes is None

    def test_unsplit_kernel_views_equal_the_views(self) -> None:
        """With the manager block size as kernel size the kernel view is the layer's view."""
        _, kv_cache_config = _plan("LBHNC", {"a": FULL}, _backend(MultipleOf(16)))
        with allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=[64]) as allocation:
            view, kernel = allocation.views["a"], allocation.kernel_views["a"]
            assert (kernel.shape, kernel.stride()) == (view.shape, view.stride())

    def test_split_of_a_padded_page_is_refused(self) -> None:
        """A block stride past the dense page cannot be split into kernel blocks."""
        padded = FullAttentionSpec(num_kv_heads=2, page_size_padded=40960, **BF16)
        _, kv_cache_config = _plan("LBNHC", {"a": padded}, _backend(16))
        with pytest.raises(LayoutError, match="does not store blocks as dense, unpadded pages"):
            kernel_geometries(kv_cache_config, [16])
        with pytest.raises(LayoutError, match="block_stride=40960 != page 32768"):
            allocate_kv_cache(kv_cache_config, "meta", kernel_block_sizes=[16])


SOURCE = sparse_mla_source(128)
INDEXER = sparse_mla_indexer(128)


def _hisparse(*backends: AttentionBackend) -> PlanningConfig:
    return PlanningConfig(
        kv_cache_layout="BLHNC",
        hisparse={"index_topk": 2048},
        host_pool_bytes=1 << 28,
        attention_backends=backends,
    )


class TestHiSparseKernelBlock:
    """hisparse_kernel_block_size and resolve_hisparse_specs: the MLA layers' block size."""

    def test_mla_layers_take_the_shared_kernel_size(self) -> None:
        """128-token MLA blocks with a 64-token indexer kernel become 64-token blocks."""
        config = _hisparse(
            _backend(MultipleOf(64), name="sparse", layers={"m0"}),
            _backend(64, name="indexer", layers={"i0"}),
        )
        specs = {"m0": SOURCE, "i0": INDEXER}
        assert hisparse_kernel_block_size(config, specs) == 64
        resolved = resolve_hisparse_specs(config, specs)
        assert {n: s.block_size for n, s in resolved.items()} == dict.fromkeys(resolved, 64)
        assert any(isinstance(s, HiSparseHotSpec) for s in resolved.values())

    def test_without_backends_the_block_size_stays(self) -> None:
        """No backend described: vLLM's base backend takes any size, so nothing changes."""
        config = _hisparse()
        assert hisparse_kernel_block_size(config, {"m0": SOURCE, "i0": INDEXER}) == 128
        assert hisparse_kernel_block_size(config, {}) is None

    def test_no_shared_size_is_a_hisparse_error(self) -> None:
        """Backends that share no size, or MLA layers of two block sizes, are HiSparseErrors."""
        config = _hisparse(
            _backend(48, name="sparse", layers={"m0"}), _backend(64, name="indexer", layers={"i0"})
        )
        with pytest.raises(HiSparseError, match="every sparse attention and indexer backend"):
            resolve_hisparse_specs(config, {"m0": SOURCE, "i0": INDEXER})
        small = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=128, dtype=torch.uint8)
        with pytest.raises(HiSparseError, match=r"one scheduler block size.*\[64, 128\]"):
            hisparse_kernel_block_size(_hisparse(), {"m0": SOURCE, "i0": small})

    def test_hisparse_error_is_a_config_error(self) -> None:
        """The refusal is caught by callers that catch ConfigError."""
        assert issubclass(HiSparseError, ConfigError)
