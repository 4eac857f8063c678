"""KV-HOST-HISPARSE-RUNS: each HiSparse source layer's host pages are one run, tiling the pool.

The plans are the reference's for a two-layer HiSparse model, judged as
placed and after one change each, so a check that goes quiet or too strict
shows here without a kit run.
"""

from __future__ import annotations

import attrs
import broken_builders
import pytest
import torch

from conformance.extensions.hisparse.runs import host_run_findings
from kvref import ReferenceKVCacheConfigBuilder
from kvref.config import HiSparseConfig, PlanningConfig
from kvref.hisparse import resolve_hisparse_specs
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import MLAAttentionSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

_LATENT = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.bfloat16
)  # 73,728 B per block
_INDEXER = attrs.evolve(_LATENT, head_size=132, dtype=torch.uint8, cache_role="INDEXER")
_PAGE = 73_728


def _config(shared: bool = False) -> PlanningConfig:
    return PlanningConfig(
        hisparse=HiSparseConfig(index_topk=2048, shared_host_pool=shared),
        host_pool_bytes=80 * 2 * _PAGE + 100,
        kv_cache_layout=KVCacheLayout.BLHNC,
        max_model_len=4096,
    )


def _plan(builder: object, config: PlanningConfig) -> KVCacheConfig:
    specs = {}
    for i in range(2):
        specs[f"model.layers.{i}.self_attn.attn"] = _LATENT
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = _INDEXER
    worker = resolve_hisparse_specs(config, specs)
    groups = builder.get_kv_cache_groups(config, worker)  # type: ignore[attr-defined]
    placed: KVCacheConfig = builder.get_kv_cache_config_from_groups(  # type: ignore[attr-defined]
        config, groups, 5
    )
    return placed


def _host(placed: KVCacheConfig, **changes: int) -> KVCacheConfig:
    tensors = [
        attrs.evolve(t, **changes) if t.host_resident else t for t in placed.kv_cache_tensors
    ]
    return attrs.evolve(placed, kv_cache_tensors=tensors)


def test_reference_host_pool_is_one_run_per_layer() -> None:
    """The reference's LBNHC host pool passes, private or shared."""
    for shared in (False, True):
        placed = _plan(ReferenceKVCacheConfigBuilder(), _config(shared))
        host = [t for t in placed.kv_cache_tensors if t.host_resident]
        assert host and host[0].layer_stride == 80 * _PAGE
        assert host_run_findings(placed) == []


def test_block_interleaved_host_pool_fails() -> None:
    """Each host block holding every source page: the layer's run is one page, not 80."""
    placed = _plan(broken_builders.InterleavedHostPool(), _config())
    found = host_run_findings(placed)
    assert found and "layer_stride=73728 B apart" in found[0]
    assert "host_num_blocks=80 blocks, layer_stride=11796480 B" in found[0]


def test_gap_between_runs_fails() -> None:
    """Runs that start one page late leave a gap at byte 0 the runtime does not skip."""
    placed = _plan(ReferenceKVCacheConfigBuilder(), _config())
    found = host_run_findings(_host(placed, offset=_PAGE))
    assert found and "starts at byte 73728" in found[0]


def test_shared_pool_overrun_fails() -> None:
    """A shared pool's runs must fit in host_num_blocks x host_block_stride."""
    placed = _plan(ReferenceKVCacheConfigBuilder(), _config(shared=True))
    stride = placed.host_block_stride
    assert stride is not None
    smaller = attrs.evolve(placed, host_block_stride=stride // 2)
    found = host_run_findings(smaller)
    assert found and "more than the shared pool" in found[-1]
    # The same stride in a private pool: the runtime sizes the pool from the tensors.
    assert host_run_findings(attrs.evolve(smaller, shared_host_pool=False)) == []
