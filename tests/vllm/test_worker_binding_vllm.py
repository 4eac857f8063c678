"""What vLLM's worker binds and picks by itself, against kvref, under the installed vLLM.

Five places where kvref differed from vLLM without a reason, each
compared with vLLM's own functions on the same description:

1. the views of specs without a dtype (Mamba states, HiSparse's raw pages)
   are the backing's ``int8`` bytes (vLLM ``allocate_kv_cache``);
2. the kernel views include HiSparse's resident and hot layers, bound to the
   raw backing (vLLM ``map_kv_caches_to_kernel_blocks`` keeps every view);
3. with no block size given, the deployment runs the block size the attention
   backends pick (vLLM ``update_block_size_for_backend``), from the release's
   default (16 in 0.33.0, 64 in 0.34.0);
4. a backend whose kernel blocks cannot split a packed cache block is refused
   at bind time, and a packed compressed cache is re-strided
   (vLLM ``AttentionGroup.map_kv_cache_to_kernel_blocks``);
5. a HiSparse config requires its connector's layout, BLHNC, by itself
   (vLLM ``HiSparseConnector.get_required_kvcache_layout``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import torch
from _vllm_backends import bind_with_vllm, vllm_attention_groups, vllm_backend
from hypothesis import given, settings
from hypothesis import strategies as st
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import PlanningConfig, plan_kv_cache
from kvref.allocation import allocate_kv_cache
from kvref.backends import AttentionBackend, get_supported_kv_cache_layouts, preferred_block_size
from kvref.errors import KernelBlockError, KVRefError
from kvref.hisparse import resolve_hisparse_specs
from kvref.interop import vllm as iv
from kvref.kernel_blocks import kernel_tensor_geometries, prepare_kernel_block_sizes
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec, MambaSpec, MLAAttentionSpec, MultipleOf
from kvref.versions import installed_vllm_version, rules

pytestmark = pytest.mark.vllm

_worker_utils = pytest.importorskip("vllm.v1.worker.utils")
_binding = pytest.importorskip("vllm.v1.hisparse.binding")
_attn_utils = pytest.importorskip("vllm.v1.attention.backends.utils")
_interface = pytest.importorskip("vllm.platforms.interface")
_cache = pytest.importorskip("vllm.config.cache")
_vllm_layout = pytest.importorskip("vllm.v1.kv_cache_layout").KVCacheLayout

#: The installed release: vLLM plans only as itself, so kvref plans as it here.
VERSION = installed_vllm_version()

FLASH_MLA = AttentionBackend(name="FLASHMLA", supported_kernel_block_sizes=[64])


def _config(**kw: Any) -> PlanningConfig:
    return PlanningConfig(vllm_version=VERSION, **kw)


def _described(views: dict[str, torch.Tensor]) -> dict[str, tuple[Any, ...]]:
    """Each view's shape, strides, storage offset and dtype.

    The stride of an axis of extent 1 addresses nothing and is left out: vLLM
    views HiSparse's host tensors with the device layout's strides, kvref with
    LBNHC's, which differ only on the one-slot head axis of their MLA pages.
    """
    return {
        n: (
            tuple(v.shape),
            tuple(None if e == 1 else s for e, s in zip(v.shape, v.stride(), strict=True)),
            v.storage_offset(),
            v.dtype,
        )
        for n, v in views.items()
    }


def _plan(config: PlanningConfig, specs: dict[str, KVCacheSpec]) -> KVCacheConfig:
    return plan_kv_cache(None, config, [specs], 1 << 28).configs[0]


def _mla(block_size: int, **kw: Any) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, **kw
    )


class TestRawBytes:
    """1 and 2: specs without a dtype are viewed as vLLM's int8 backing, and bound as such."""

    def test_mamba_views_are_vllms(self) -> None:
        """A Mamba layer's planning and bound views are vLLM's, int8 included."""
        mamba = MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(torch.bfloat16,))
        config = _config(num_gpu_blocks_override=8)
        kv_cache_config = _plan(config, {"m": mamba})
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        with allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=sizes) as allocation:
            ours, bound = _described(allocation.views), _described(allocation.kernel_views)
        theirs, _ = bind_with_vllm(config, kv_cache_config, sizes)
        assert ours == bound == _described(theirs)
        assert ours["m"][3] == torch.int8

    def test_hisparse_views_are_vllms(self) -> None:
        """HiSparse's resident and hot layers are bound to the int8 backing, as in vLLM."""
        source = sparse_mla_source()
        indexer = sparse_mla_indexer()
        config = _config(
            hisparse={"index_topk": 2048},
            kv_cache_layout="BLHNC",
            host_pool_bytes=1 << 22,
            num_gpu_blocks_override=256,
            max_model_len=512,
        )
        specs = resolve_hisparse_specs(config, {"m0": source, "m1": source, "i0": indexer})
        kv_cache_config = _plan(config, specs)
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        with allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=sizes) as allocation:
            ours = _described(allocation.kernel_views)

        class HostPool:
            """vLLM's host pool allocates int8 too (``allocate_pinned_host_pool``), pinned."""

            def allocate(self, size: int) -> torch.Tensor:
                return torch.zeros(size, dtype=torch.int8)

        def allocate(vconfig: Any, device: Any, layout: Any, kernel: list[int]) -> Any:
            return _binding.allocate_hisparse_kv_caches(vconfig, device, layout, kernel, HostPool())

        with iv.hisparse_patches(config):
            theirs = _described(bind_with_vllm(config, kv_cache_config, sizes, allocate)[0])
        raw = [n for n in theirs if n.endswith((".hisparse_resident", ".hisparse_hot"))]
        assert raw and all(theirs[n][3] == torch.int8 and len(theirs[n][0]) == 1 for n in raw)
        assert ours == theirs


class TestPackedKernelBlocks:
    """4: at bind time each layer's own backend is asked again, in packed groups too."""

    def _packed(self, spec: MLAAttentionSpec) -> tuple[PlanningConfig, KVCacheConfig, list[int]]:
        config = _config(
            kv_cache_layout="BLHNC",
            attention_backends=[FLASH_MLA],
            num_gpu_blocks_override=16,
            max_model_len=1024,
        )
        kv_cache_config = _plan(config, {"model.layers.0.attn": spec, "model.layers.1.attn": spec})
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        assert sizes == [spec.block_size]  # block-outermost packing: never split group-wide
        return config, kv_cache_config, sizes

    def test_flashmla_under_a_packed_128_token_block_is_refused_by_both(self) -> None:
        """FlashMLA's 64-token kernel blocks cannot split a packed 128-token block: both refuse."""
        config, kv_cache_config, sizes = self._packed(_mla(128))
        with pytest.raises(ValueError, match="needs 64-token kernel blocks"):
            bind_with_vllm(config, kv_cache_config, sizes)
        with pytest.raises(KernelBlockError, match=r"model\.layers\.0\.attn.*\[64\].*128-token"):
            allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=sizes, config=config)

    def test_packed_compressed_cache_is_restrided_as_vllm_does(self) -> None:
        """A compressed cache (4 tokens a state) is re-strided: kernel block j of b is b * s + j."""
        config, kv_cache_config, sizes = self._packed(_mla(256, tokens_per_state=4))
        theirs, groups = bind_with_vllm(config, kv_cache_config, sizes)
        with allocate_kv_cache(
            kv_cache_config, "cpu", kernel_block_sizes=sizes, config=config
        ) as allocation:
            assert _described(allocation.kernel_views) == _described(theirs)
        (kernel,) = kernel_tensor_geometries(kv_cache_config, sizes, KVCacheLayout.BLHNC, config)
        assert kernel is not None
        # Two layers' 64-state pages per block, 16 states a kernel page: s = 8.
        assert kernel.split.kernel_block_stride == groups[0].kernel_block_stride == 8
        assert list(kernel.split.kernel_block_ids(1)) == [8, 9, 10, 11]


class TestBlockSize:
    """3: a deployment that gives no block size runs what its backends pick."""

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(
            st.lists(
                st.sampled_from([16, 32, 48, 64, 128, 256])
                | st.builds(MultipleOf, st.sampled_from([1, 16, 32, 64])),
                max_size=3,
            ),
            min_size=1,
            max_size=3,
        ),
        st.sampled_from([16, 64]),
    )
    def test_pick_matches_vllm(self, sizes: list[list[Any]], default: int) -> None:
        """kvref's pick is vLLM's ``_preferred_block_size_for_backends`` (which never refuses)."""
        described = [
            AttentionBackend(name=f"B{i}", supported_kernel_block_sizes=s)
            for i, s in enumerate(sizes)
        ]
        ours = preferred_block_size(described, default)
        vcfg = iv.to_vllm_config(_config())
        theirs = _interface.Platform._preferred_block_size_for_backends(
            [vllm_backend(b) for b in described], default, vcfg
        )
        assert ours == theirs

    def test_default_is_the_installed_releases(self) -> None:
        """The block size a deployment starts from is the installed release's default."""
        assert rules(VERSION).default_block_size == _cache.CacheConfig.DEFAULT_BLOCK_SIZE

    def _vllm_block_size(self, config: PlanningConfig, backends: list[AttentionBackend]) -> int:
        classes = [vllm_backend(b) for b in backends]

        class Platform(_interface.Platform):  # type: ignore[misc, name-defined]
            @classmethod
            def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
                return classes

        vcfg = iv.to_vllm_config(config)
        vcfg.cache_config.block_size = _cache.CacheConfig.DEFAULT_BLOCK_SIZE
        vcfg.cache_config.user_specified_block_size = config.block_size is not None
        if config.block_size is not None:
            vcfg.cache_config.block_size = config.block_size
        with iv.quiet_vllm():
            Platform.update_block_size_for_backend(vcfg)
        return int(vcfg.cache_config.block_size)

    @pytest.mark.parametrize("given_size", [None, 128])
    def test_flashmla_deployment_plans_as_vllm(self, given_size: int | None) -> None:
        """Not given, a FlashMLA deployment runs 64-token blocks; given, the given size."""
        config = _config(attention_backends=[FLASH_MLA], block_size=given_size, max_model_len=4096)
        expected = 64 if given_size is None else given_size
        assert config.resolved_block_size == self._vllm_block_size(config, [FLASH_MLA]) == expected
        spec = _mla(config.resolved_block_size)
        kv_cache_config = _plan(config, {"l0": spec, "l1": spec})
        assert kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size == expected
        sizes = prepare_kernel_block_sizes(config, kv_cache_config)
        vconfig = iv.config_to_vllm(kv_cache_config)
        theirs = _worker_utils.prepare_kernel_block_sizes(
            vconfig, vllm_attention_groups(config, kv_cache_config, vconfig)
        )
        assert sizes == theirs == [64]

    def test_several_backends_take_the_smallest_common_multiple(self) -> None:
        """Backends of 48- and 32-token kernel blocks, not given a size: 96, as in vLLM."""
        backends = [
            AttentionBackend(name="A", layers={"l0"}, supported_kernel_block_sizes=[48]),
            AttentionBackend(
                name="B", layers={"l1"}, supported_kernel_block_sizes=[32, MultipleOf(64)]
            ),
        ]
        config = _config(attention_backends=backends)
        assert config.resolved_block_size == self._vllm_block_size(config, backends) == 96


class TestHiSparseLayout:
    """5: HiSparse's connector requires BLHNC, and a HiSparse config requires it by itself."""

    def test_hisparse_config_resolves_its_connectors_layout(self) -> None:
        """No layout and no connector layout given: kvref resolves vLLM's BLHNC."""
        spec = _mla(64)
        specs: dict[str, KVCacheSpec] = {"m0": spec, "m1": spec}
        config = _config(hisparse={"index_topk": 2048}, host_pool_bytes=1 << 28)
        ours = config.with_resolved_layout([specs]).kv_cache_layout
        vcfg = iv.to_vllm_config(config)
        vcfg.cache_config.kv_cache_layout = None
        reported = [[m.name for m in get_supported_kv_cache_layouts(config.attention_backends)]]
        saved = os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        try:
            with iv.quiet_vllm():
                theirs = _attn_utils.resolve_kv_cache_layout(
                    vcfg, reported, list(iv.specs_to_vllm(specs).values())
                )
        finally:
            if saved is not None:
                os.environ["VLLM_KV_CACHE_LAYOUT"] = saved
        assert ours.name == theirs.name == "BLHNC"
        assert config.resolves_kv_cache_layout

    def test_a_given_layout_still_wins(self) -> None:
        """A layout set on the config is used as is, HiSparse or not (vLLM: it wins outright)."""
        config = _config(
            hisparse={"index_topk": 2048}, host_pool_bytes=1 << 28, kv_cache_layout="BLNHC"
        )
        assert config.kv_cache_layout is KVCacheLayout.BLNHC
        assert not config.resolves_kv_cache_layout


def test_kvref_errors_are_value_errors() -> None:
    """The new refusal is a typed kvref error, hence a ValueError as vLLM's is."""
    assert issubclass(KernelBlockError, KVRefError) and issubclass(KernelBlockError, ValueError)
