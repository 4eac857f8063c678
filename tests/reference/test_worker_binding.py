"""What a worker binds, and what vLLM picks when a deployment does not say: the worked numbers.

The views of specs without a dtype are the backing's ``int8`` bytes; the
kernel views keep HiSparse's raw layers; at bind time a layer's own backend
is asked again (a packed compressed cache is re-strided, other packed caches
refused); a deployment without a block size runs what its backends pick; a
HiSparse config requires its connector's layout.
``tests/vllm/test_worker_binding_vllm.py`` compares each with vLLM's own code.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import PlanningConfig, plan_kv_cache
from kvref.allocation import allocate_kv_cache
from kvref.backends import AttentionBackend, preferred_block_size
from kvref.config import HISPARSE_CONNECTOR_LAYOUT
from kvref.errors import KernelBlockError, LayoutError, UnsupportedError
from kvref.hisparse import resolve_hisparse_specs
from kvref.kernel_blocks import (
    KernelBlockSplit,
    kernel_tensor_geometries,
    prepare_kernel_block_sizes,
)
from kvref.layout import KVCacheLayout
from kvref.specs import MLAAttentionSpec, MultipleOf

FLASH_MLA = AttentionBackend(name="FLASHMLA", supported_kernel_block_sizes=[64])


def _mla(block_size: int, **kw: Any) -> MLAAttentionSpec:
    # 576 bf16 values: 1152 bytes a state.
    return MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, **kw
    )


def _packed(spec: MLAAttentionSpec, *backends: AttentionBackend) -> tuple[PlanningConfig, Any]:
    """Two layers of ``spec`` in BLHNC, each block holding both layers' pages."""
    config = PlanningConfig(
        kv_cache_layout="BLHNC",
        attention_backends=backends,
        max_model_len=1024,
        num_gpu_blocks_override=16,
    )
    return config, plan_kv_cache(None, config, [{"a": spec, "b": spec}], 1 << 28).configs[0]


class TestPackedBind:
    """A packed group is never split group-wide; each layer's backend is asked at bind time."""

    def test_flashmla_under_a_packed_128_token_block_is_refused(self) -> None:
        """64-token kernel blocks cannot split a 128-token block holding two pages."""
        config, kv_cache_config = _packed(_mla(128), FLASH_MLA)
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        assert sizes == [128]
        (tensor,) = kv_cache_config.kv_cache_tensors
        assert (tensor.layer_stride, tensor.block_stride) == (128 * 1152, 2 * 128 * 1152)
        message = r"layer 'a'.*\[64\] tokens and binds 64-token.*128-token.*block_stride=294912"
        with pytest.raises(KernelBlockError, match=message):
            kernel_tensor_geometries(kv_cache_config, sizes, KVCacheLayout.BLHNC, config)
        with pytest.raises(KernelBlockError):
            allocate_kv_cache(kv_cache_config, "meta", kernel_block_sizes=sizes, config=config)
        # Without the backends (vLLM's base backend) the view stays whole.
        (whole,) = kernel_tensor_geometries(kv_cache_config, sizes, KVCacheLayout.BLHNC)
        assert whole is not None and whole.split.kernel_blocks_per_block == 1

    def test_a_backend_taking_the_block_keeps_the_view(self) -> None:
        """A backend that also takes 128-token kernel blocks binds the packed view as it is."""
        config, kv_cache_config = _packed(
            _mla(128), AttentionBackend(name="K", supported_kernel_block_sizes=[64, 128])
        )
        (kernel,) = kernel_tensor_geometries(kv_cache_config, [128], KVCacheLayout.BLHNC, config)
        assert kernel is not None and kernel.shape[3] == 128

    def test_no_dividing_size_is_refused(self) -> None:
        """A backend of 48-token kernel blocks has none dividing 128: refused, naming it."""
        backend = AttentionBackend(name="K48", supported_kernel_block_sizes=[48])
        config, kv_cache_config = _packed(_mla(128), backend)
        with pytest.raises(KernelBlockError, match=r"layer 'a'.*128-token blocks.*K48: \[48\]"):
            kernel_tensor_geometries(kv_cache_config, [128], KVCacheLayout.BLHNC, config)

    def test_compressed_cache_is_restrided(self) -> None:
        """4 tokens a state, 256-token blocks: 64 states a page, 16 a 64-token kernel page.

        A block holds both layers' pages (2 x 64 x 1152 bytes), 8 kernel pages
        apart: kernel block j of block b is b * 8 + j, j < 4.
        """
        config, kv_cache_config = _packed(_mla(256, tokens_per_state=4), FLASH_MLA)
        (kernel,) = kernel_tensor_geometries(kv_cache_config, [256], KVCacheLayout.BLHNC, config)
        assert kernel is not None
        blocks = kv_cache_config.num_blocks
        assert kernel.shape == (2, (blocks - 1) * 8 + 4, 1, 16, 1152)
        assert kernel.strides[1] == 16 * 1152
        assert kernel.split == KernelBlockSplit(
            block_size=256, kernel_block_size=64, kernel_block_stride=8
        )
        with allocate_kv_cache(
            kv_cache_config, "cpu", kernel_block_sizes=[256], config=config
        ) as allocation:
            view, bound = allocation.views["b"], allocation.kernel_views["b"]
            view.copy_(torch.arange(view.numel(), dtype=torch.float32).reshape(view.shape))
            for block in range(blocks):
                for j, kernel_block in enumerate(kernel.split.kernel_block_ids(block)):
                    rows = view[block, :, j * 16 : (j + 1) * 16]
                    assert torch.equal(bound[kernel_block], rows)

    def test_layers_of_one_tensor_binding_different_sizes_are_not_modelled(self) -> None:
        """Two backends in one tensor wanting 64 and 32 tokens: an UnsupportedError."""
        config, kv_cache_config = _packed(
            _mla(256, tokens_per_state=4),
            AttentionBackend(name="A", layers={"a"}, supported_kernel_block_sizes=[64]),
            AttentionBackend(name="B", layers={"b"}, supported_kernel_block_sizes=[32]),
        )
        with pytest.raises(UnsupportedError, match="different kernel block sizes"):
            kernel_tensor_geometries(kv_cache_config, [256], KVCacheLayout.BLHNC, config)


class TestSplitStride:
    """KernelBlockSplit with a kernel block stride: the IDs between two blocks are no block's."""

    def test_ids_step_the_stride(self) -> None:
        """Block 1 of a 4-way split 8 kernel blocks apart is kernel blocks 8..11."""
        split = KernelBlockSplit(block_size=256, kernel_block_size=64, kernel_block_stride=8)
        assert list(split.kernel_block_ids(1)) == [8, 9, 10, 11]
        assert split.manager_block_of(10) == (1, 2)
        with pytest.raises(LayoutError, match="kernel block 12 lies between"):
            split.manager_block_of(12)

    def test_stride_below_the_split_is_refused(self) -> None:
        """Kernel blocks of two blocks cannot interleave."""
        with pytest.raises(LayoutError, match="kernel_block_stride=2"):
            KernelBlockSplit(block_size=256, kernel_block_size=64, kernel_block_stride=2)


class TestRawLayers:
    """HiSparse's resident and hot layers are bound to the int8 backing, as in the views."""

    def test_kernel_views_keep_them(self) -> None:
        """Every layer has a kernel view; the raw ones are the device backing itself."""
        source = sparse_mla_source()
        config = PlanningConfig(
            hisparse={"index_topk": 2048},
            host_pool_bytes=1 << 22,
            max_model_len=512,
            num_gpu_blocks_override=256,
        )
        indexer = sparse_mla_indexer()
        specs = resolve_hisparse_specs(config, {"m0": source, "i0": indexer})
        kv_cache_config = plan_kv_cache(None, config, [specs], 1 << 28).configs[0]
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        with allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=sizes) as allocation:
            assert set(allocation.kernel_views) == set(allocation.views)
            buffer = allocation.device_buffer
            assert buffer is not None and buffer.dtype == torch.int8
            for name in ("m0.hisparse_resident", "m0.hisparse_hot"):
                assert allocation.kernel_views[name] is buffer


class TestBlockSize:
    """PlanningConfig.block_size not given: the backends pick it from the release's default."""

    @pytest.mark.parametrize(
        ("version", "sizes", "expected"),
        [
            ("0.33", [64], 64),  # FlashMLA: 16 is no multiple of 64, its smallest size wins
            ("0.34", [64], 64),
            ("0.33", [MultipleOf(16)], 16),
            ("0.34", [MultipleOf(16)], 64),  # the default is a multiple: kept
            ("0.33", [48, 32], 32),
            ("0.33", [], 16),  # no size declared: any
        ],
    )
    def test_one_backend(self, version: str, sizes: list[Any], expected: int) -> None:
        """A lone backend asks for the default when it accepts it, else its smallest size."""
        backend = AttentionBackend(name="K", supported_kernel_block_sizes=sizes)
        config = PlanningConfig(vllm_version=version, attention_backends=[backend])
        assert config.block_size is None
        assert config.resolved_block_size == expected

    def test_several_backends_and_none(self) -> None:
        """48 and 32 share 96 first; no backend keeps the default; a given size stays."""
        backends = [
            AttentionBackend(name="A", supported_kernel_block_sizes=[48]),
            AttentionBackend(name="B", supported_kernel_block_sizes=[32]),
        ]
        assert preferred_block_size(backends, 16) == 96
        assert PlanningConfig(vllm_version="0.33").resolved_block_size == 16
        assert PlanningConfig(vllm_version="0.34").resolved_block_size == 64
        given = PlanningConfig(attention_backends=[FLASH_MLA], block_size=128)
        assert given.resolved_block_size == 128

    def test_accepting_is_not_taking(self) -> None:
        """A 128-token cache block is accepted by a 64-token kernel, which does not take it."""
        assert FLASH_MLA.accepts_block_size(128) and not FLASH_MLA.supports_block_size(128)
        assert not FLASH_MLA.accepts_block_size(96)


class TestHiSparseLayout:
    """A HiSparse config requires its connector's BLHNC without saying so."""

    def test_required_and_resolved(self) -> None:
        """No layout given: resolution runs and provisionally picks BLHNC."""
        config = PlanningConfig(hisparse={"index_topk": 2048}, host_pool_bytes=1 << 28)
        assert config.kv_connector_layout is None
        assert config.required_connector_layout is HISPARSE_CONNECTOR_LAYOUT
        assert config.resolves_kv_cache_layout
        assert config.kv_cache_layout is KVCacheLayout.BLHNC

    def test_without_hisparse_nothing_is_required(self) -> None:
        """A plain config describes no resolution and keeps LBNHC."""
        config = PlanningConfig()
        assert config.required_connector_layout is None
        assert not config.resolves_kv_cache_layout
        assert config.kv_cache_layout is KVCacheLayout.LBNHC
