"""kvref's layout resolution and kernel-block splitting against the installed vLLM's own functions.

Each test gives both sides the same description: attention backends (vLLM
``AttentionBackend`` subclasses built from kvref's :class:`AttentionBackend`
records), specs, the ``VLLM_KV_CACHE_LAYOUT`` override and the connector's
layout, and asserts that they pick the same layout, the same kernel block
sizes and the same per-layer views bound for the kernels (dtype and raw
backings included), or both refuse.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import torch
from _vllm_backends import bind_with_vllm, vllm_attention_groups, vllm_backend
from hypothesis import given, settings
from hypothesis import strategies as st
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import KVCacheLayout, PlanningConfig, plan_kv_cache
from kvref.allocation import allocate_kv_cache
from kvref.backends import (
    AttentionBackend,
    get_supported_kv_cache_layouts,
    select_common_block_size,
)
from kvref.errors import HiSparseError, KVRefError, LayoutError, LayoutResolutionError
from kvref.hisparse import resolve_hisparse_specs
from kvref.interop import vllm as iv
from kvref.kernel_blocks import prepare_kernel_block_sizes
from kvref.layout_resolution import resolve_kv_cache_layout
from kvref.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowSpec,
)

pytestmark = pytest.mark.vllm

_utils = pytest.importorskip("vllm.v1.attention.backends.utils")
_backend_mod = pytest.importorskip("vllm.v1.attention.backend")
_worker_utils = pytest.importorskip("vllm.v1.worker.utils")
_binding = pytest.importorskip("vllm.v1.hisparse.binding")
_vllm_layout = pytest.importorskip("vllm.v1.kv_cache_layout").KVCacheLayout


@contextlib.contextmanager
def layout_inputs(env: KVCacheLayout | None, connector: KVCacheLayout | None) -> Iterator[None]:
    """vLLM reads ``env`` as ``VLLM_KV_CACHE_LAYOUT`` and ``connector`` as the connector's."""
    saved_env = os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    saved = _utils.get_kv_connector_cache_layout
    if env is not None:
        os.environ["VLLM_KV_CACHE_LAYOUT"] = env.name
    _utils.get_kv_connector_cache_layout = lambda vllm_config=None: (
        None if connector is None else connector.name
    )
    try:
        with iv.quiet_vllm(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        _utils.get_kv_connector_cache_layout = saved
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        if saved_env is not None:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = saved_env


def outcome(fn: Any) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", None)`` for any refusal (kvref's typed, vLLM's raw)."""
    try:
        return "ok", fn()
    except (KVRefError, ValueError, AssertionError):
        return "error", None


# -- strategies --------------------------------------------------------------------

LAYOUTS = list(KVCacheLayout)
SIZES = st.one_of(
    st.sampled_from([1, 16, 32, 48, 64, 128, 256]),
    st.builds(MultipleOf, st.sampled_from([1, 8, 16, 32, 64])),
)


@st.composite
def backends(draw: st.DrawFn, name: str = "B") -> AttentionBackend:
    """A backend with an optional layout preference and 1-3 kernel block sizes."""
    layouts = draw(
        st.none() | st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=6, unique=True)
    )
    sizes = draw(st.lists(SIZES, min_size=1, max_size=3))
    return AttentionBackend(
        name=name, supported_kv_cache_layouts=layouts, supported_kernel_block_sizes=sizes
    )


def _backend_lists(max_size: int = 4) -> st.SearchStrategy[list[AttentionBackend]]:
    return st.lists(backends(), min_size=0, max_size=max_size).map(
        lambda bs: [
            AttentionBackend(
                name=f"B{i}",
                supported_kv_cache_layouts=b.supported_kv_cache_layouts,
                supported_kernel_block_sizes=b.supported_kernel_block_sizes,
            )
            for i, b in enumerate(bs)
        ]
    )


BF16: dict[str, Any] = {"dtype": torch.bfloat16, "head_size": 64}
SPEC_KINDS: dict[str, KVCacheSpec] = {
    "full8": FullAttentionSpec(block_size=16, num_kv_heads=8, **BF16),
    "full4": FullAttentionSpec(block_size=16, num_kv_heads=4, **BF16),
    "swa8": SlidingWindowSpec(block_size=16, num_kv_heads=8, sliding_window=256, **BF16),
    "replicated4": FullAttentionSpec(block_size=16, num_kv_heads=4, dcp_sharded=False, **BF16),
    "mla": MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16),
}


class TestSupportedLayouts:
    """``get_supported_kv_cache_layouts``: the intersection and vote of the backends' sets."""

    @settings(max_examples=150, deadline=None)
    @given(_backend_lists())
    def test_matches_vllm(self, described: list[AttentionBackend]) -> None:
        """The candidates, in order, are vLLM's, or both refuse an empty intersection."""
        ours = outcome(lambda: [m.name for m in get_supported_kv_cache_layouts(described)])
        theirs = outcome(
            lambda: [
                m.name
                for m in _utils.get_supported_kv_cache_layouts([vllm_backend(b) for b in described])
            ]
        )
        assert ours == theirs


class TestResolveLayout:
    """``resolve_kv_cache_layout``: specs narrow the candidates, then override, connector, first."""

    @settings(max_examples=150, deadline=None)
    @given(
        _backend_lists(3),
        st.lists(st.sampled_from(sorted(SPEC_KINDS)), min_size=0, max_size=4),
        st.none() | st.sampled_from(LAYOUTS),
        st.none() | st.sampled_from(LAYOUTS),
    )
    def test_matches_vllm(
        self,
        described: list[AttentionBackend],
        kinds: list[str],
        env: KVCacheLayout | None,
        connector: KVCacheLayout | None,
    ) -> None:
        """kvref resolves vLLM's layout for the same inputs, or both refuse."""
        specs = [SPEC_KINDS[k] for k in kinds]
        supported = outcome(lambda: get_supported_kv_cache_layouts(described))
        if supported[0] == "error":
            return  # TestSupportedLayouts covers the empty intersection
        reported = [supported[1]]
        with layout_inputs(env, connector):
            ours = outcome(
                lambda: (
                    resolve_kv_cache_layout(
                        reported, specs, env_layout=env, connector_layout=connector
                    ).name
                )
            )
            vcfg = iv.to_vllm_config(PlanningConfig())
            vcfg.cache_config.kv_cache_layout = None
            vspecs = list(iv.specs_to_vllm({f"l{i}": s for i, s in enumerate(specs)}).values())
            theirs = outcome(
                lambda: (
                    _utils.resolve_kv_cache_layout(
                        vcfg, [[m.name for m in reported[0]]], vspecs
                    ).name
                )
            )
        assert ours == theirs

    def test_workers_that_disagree_are_refused_naming_both(self) -> None:
        """Two workers with disjoint reports: vLLM refuses, kvref names both lists.

        vLLM 0.33.0 asserts that the lists agree; 0.34.0 merges them and finds
        no common layout (a ValueError).
        """
        reports = [[KVCacheLayout.LBNHC], [KVCacheLayout.BLHNC]]
        with pytest.raises(LayoutResolutionError, match=r"\['LBNHC'\].*\['BLHNC'\]"):
            resolve_kv_cache_layout(reports)
        vcfg = iv.to_vllm_config(PlanningConfig())
        vcfg.cache_config.kv_cache_layout = None
        with pytest.raises((AssertionError, ValueError)):
            _utils.resolve_kv_cache_layout(vcfg, [["LBNHC"], ["BLHNC"]], [])


class TestCommonBlockSize:
    """``select_common_block_size``: the kernel block size the worker splits into."""

    @settings(max_examples=200, deadline=None)
    @given(_backend_lists(3), st.sampled_from([16, 32, 64, 96, 128, 192, 256, 512]))
    def test_matches_vllm(self, described: list[AttentionBackend], block_size: int) -> None:
        """The chosen size is vLLM's, or both find none."""
        ours = outcome(lambda: select_common_block_size(block_size, described))
        theirs = outcome(
            lambda: _worker_utils.select_common_block_size(
                block_size, [vllm_backend(b) for b in described]
            )
        )
        assert ours == theirs


def _views(views: dict[str, torch.Tensor]) -> dict[str, tuple[Any, ...]]:
    """Every view's shape, strides, storage offset and dtype (raw backings included)."""
    return {
        n: (tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype)
        for n, v in views.items()
    }


KERNEL_CASES = [
    # (name, layout, specs, backends): a 64-token block split for a 16-token kernel.
    ("split_LBNHC", "LBNHC", {"a": "full8", "b": "full8"}, [[16]]),
    ("split_LBHNC_two_sizes", "LBHNC", {"a": "full4", "b": "full4"}, [[16, 32]]),
    ("no_split_multiple", "LBNHC", {"a": "full8"}, [[MultipleOf(16)]]),
    ("aliased_BLHNC_split", "BLHNC", {"a": "full8", "s": "swa8", "t": "swa8"}, [[16]]),
    ("hybrid_LBNHC", "LBNHC", {"a": "full8", "s": "swa8", "t": "swa8"}, [[32]]),
    # Two layers of one group packed in each block: never split group-wide, and
    # the backend's 16-token kernel blocks cannot be bound: both refuse.
    ("packed_BLHNC_refused", "BLHNC", {"a": "full8", "b": "full8"}, [[16]]),
    ("packed_BLNHC_takes_the_block", "BLNHC", {"a": "full8", "b": "full8"}, [[16, 64]]),
]


class TestKernelBlocks:
    """``prepare_kernel_block_sizes`` and the views vLLM's worker builds with them."""

    @pytest.mark.parametrize(("name", "layout", "layers", "sizes"), KERNEL_CASES)
    def test_sizes_and_kernel_views_match_vllm(
        self, name: str, layout: str, layers: dict[str, str], sizes: list[list[Any]]
    ) -> None:
        """Each group's kernel block size, and each layer's kernel view, are vLLM's."""
        specs = {
            n: FullAttentionSpec(block_size=64, num_kv_heads=int(k.removeprefix("full")), **BF16)
            if k.startswith("full")
            else SlidingWindowSpec(block_size=64, num_kv_heads=8, sliding_window=256, **BF16)
            for n, k in layers.items()
        }
        described = [
            AttentionBackend(name=f"K{i}", supported_kernel_block_sizes=s)
            for i, s in enumerate(sizes)
        ]
        config = PlanningConfig(
            kv_cache_layout=layout,
            attention_backends=described,
            max_model_len=128,
            num_gpu_blocks_override=32,
        )
        plan = plan_kv_cache(None, config, [specs], 1 << 26)
        kv_cache_config = plan.configs[0]
        vconfig = iv.config_to_vllm(kv_cache_config)
        ours = prepare_kernel_block_sizes(config, kv_cache_config)
        theirs = _worker_utils.prepare_kernel_block_sizes(
            vconfig, vllm_attention_groups(config, kv_cache_config, vconfig)
        )
        assert ours == theirs
        views = outcome(
            lambda: _views(
                allocate_kv_cache(
                    kv_cache_config, "cpu", kernel_block_sizes=ours, config=config
                ).kernel_views
            )
        )
        assert views == outcome(lambda: _views(bind_with_vllm(config, kv_cache_config, theirs)[0]))
        assert (views[0] == "error") == name.endswith("_refused")

    def test_split_of_a_padded_block_is_refused_by_both(self) -> None:
        """A block stride past the dense page cannot be split: both sides refuse."""
        spec = FullAttentionSpec(block_size=64, num_kv_heads=2, page_size_padded=40960, **BF16)
        config = PlanningConfig(
            kv_cache_layout="LBNHC", max_model_len=128, num_gpu_blocks_override=4
        )
        kv_cache_config = plan_kv_cache(None, config, [{"a": spec}], 1 << 26).configs[0]
        with pytest.raises(LayoutError):
            allocate_kv_cache(kv_cache_config, "cpu", kernel_block_sizes=[16])
        with pytest.raises((ValueError, AssertionError)):
            _worker_utils.allocate_kv_cache(
                iv.config_to_vllm(kv_cache_config), torch.device("cpu"), _vllm_layout.LBNHC, [16]
            )


SOURCE = sparse_mla_source(128)
INDEXER = sparse_mla_indexer(128)


class _Layer:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def get_attn_backend(self) -> Any:
        return self.backend


class TestHiSparseKernelBlock:
    """``resolve_hisparse_specs``: the MLA layers take the block size all their backends take."""

    @pytest.mark.parametrize(
        ("sparse", "indexer"),
        [
            ([MultipleOf(64)], [64]),
            ([MultipleOf(64)], [MultipleOf(32)]),
            ([64, 128], [32, 64]),
            ([48], [64]),
            ([], [64]),
        ],
    )
    def test_block_size_and_derived_layers_match_vllm(
        self, sparse: Sequence[Any], indexer: Sequence[Any]
    ) -> None:
        """The MLA specs' block size and the resident and hot layers are vLLM's, or both refuse."""
        specs: dict[str, KVCacheSpec] = {"m0": SOURCE, "m1": SOURCE, "i0": INDEXER, "i1": INDEXER}
        described = [
            AttentionBackend(
                name="SPARSE", layers={"m0", "m1"}, supported_kernel_block_sizes=sparse
            ),
            AttentionBackend(
                name="INDEXER", layers={"i0", "i1"}, supported_kernel_block_sizes=indexer
            ),
        ]
        config = PlanningConfig(
            kv_cache_layout="BLHNC",
            hisparse={"index_topk": 2048},
            host_pool_bytes=1 << 28,
            attention_backends=described,
        )
        ours = outcome(
            lambda: {n: s.block_size for n, s in resolve_hisparse_specs(config, specs).items()}
        )
        layers = {n: _Layer(vllm_backend(b)) for b in described for n in b.layers}
        vcfg = iv.to_vllm_config(config)
        with iv.hisparse_patches(config), iv.quiet_vllm():
            theirs = outcome(
                lambda: {
                    n: s.block_size
                    for n, s in _binding.resolve_hisparse_specs(
                        vcfg, iv.specs_to_vllm(specs), layers
                    ).items()
                }
            )
        assert ours == theirs
        if ours[0] == "error":
            with pytest.raises(HiSparseError, match="every sparse attention and indexer"):
                resolve_hisparse_specs(config, specs)


def test_mamba_group_keeps_its_block_size() -> None:
    """A Mamba group is never split, whatever the backends take (vLLM: no splitting)."""
    mamba = MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(torch.bfloat16,))
    config = PlanningConfig(
        attention_backends=[AttentionBackend(name="K16", supported_kernel_block_sizes=[16])]
    )
    kv_cache_config = plan_kv_cache(None, config, [{"m": mamba}], 1 << 26).configs[0]
    assert prepare_kernel_block_sizes(config, kv_cache_config) == [64]
