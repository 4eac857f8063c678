"""vLLM attention backends and attention groups built from kvref's descriptions, for the tests.

vLLM answers the kernel block and layout questions through backend classes
and binds caches through ``AttentionGroup`` objects; these helpers build
both from kvref's :class:`~kvref.backends.AttentionBackend` records, so the
differential tests give vLLM's own functions the inputs kvref gets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import torch

from kvref import PlanningConfig
from kvref.backends import DEFAULT_BACKEND, AttentionBackend
from kvref.interop import vllm as iv
from kvref.records import KVCacheConfig
from kvref.specs import MultipleOf, UniformTypeKVCacheSpecs
from kvref.views import resolve_layout

_backend_mod = pytest.importorskip("vllm.v1.attention.backend")
_worker_utils = pytest.importorskip("vllm.v1.worker.utils")
_vllm_layout = pytest.importorskip("vllm.v1.kv_cache_layout").KVCacheLayout

__all__ = ["Allocate", "bind_with_vllm", "vllm_attention_groups", "vllm_backend"]


class _NoMetadata:
    """A metadata builder that builds nothing: binding only reads the backend's sizes."""

    requires_block_table_width = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        del args, kwargs


def vllm_backend(backend: AttentionBackend) -> Any:
    """A vLLM backend class answering as ``backend`` does (never instantiated)."""
    layouts = backend.supported_kv_cache_layouts
    vllm_layouts = None if layouts is None else tuple(_vllm_layout[m.name] for m in layouts)
    sizes = [
        _backend_mod.MultipleOf(s.n) if isinstance(s, MultipleOf) else s
        for s in backend.supported_kernel_block_sizes
    ]
    namespace = {
        "supported_kv_cache_layouts": classmethod(lambda cls: vllm_layouts),
        "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None: list(sizes)),
        "get_name": staticmethod(lambda: backend.name),
        "get_builder_cls": staticmethod(lambda: _NoMetadata),
    }
    return type(backend.name, (_backend_mod.AttentionBackend,), namespace)


def vllm_attention_groups(
    config: PlanningConfig, kv_cache_config: KVCacheConfig, vllm_kv_cache_config: Any
) -> list[list[Any]]:
    """vLLM's attention groups: per KV cache group, one per backend over its layers.

    Each carries its layers' own spec (vLLM's runner groups layers by
    backend and per-layer spec; the layers of one kvref backend here share one).
    """
    out = []
    for gid, (group, vgroup) in enumerate(
        zip(kv_cache_config.kv_cache_groups, vllm_kv_cache_config.kv_cache_groups, strict=True)
    ):
        per_group = []
        for backend in config.backends_of(group.layer_names) or [DEFAULT_BACKEND]:
            names = [n for n in group.layer_names if config.backends_of([n]) in ([backend], [])]
            spec = vgroup.kv_cache_spec
            if isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs):
                spec = spec.kv_cache_specs[names[0]]
            per_group.append(_worker_utils.AttentionGroup(vllm_backend(backend), names, spec, gid))
        out.append(per_group)
    return out


#: How vLLM allocates and views a config's caches: ``(vLLM config, device, layout, sizes)``.
Allocate = Callable[[Any, torch.device, Any, list[int]], dict[str, torch.Tensor]]


def bind_with_vllm(
    config: PlanningConfig,
    kv_cache_config: KVCacheConfig,
    kernel_block_sizes: list[int],
    allocate: Allocate | None = None,
) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """The views vLLM's worker binds to the layers of ``kv_cache_config``, and its attention groups.

    vLLM's own code throughout: ``create_metadata_builders`` gives each
    attention group its kernel block size, ``allocate`` (default vLLM's
    ``allocate_kv_cache``, which takes device tensors only) views the
    backing and ``map_kv_caches_to_kernel_blocks`` maps them for binding
    (setting a packed group's ``kernel_block_stride``).  Raises what vLLM raises.
    """
    vconfig = iv.config_to_vllm(kv_cache_config)
    vcfg = iv.to_vllm_config(config)
    groups = [
        g
        for per_group in vllm_attention_groups(config, kv_cache_config, vconfig)
        for g in per_group
    ]
    cpu = torch.device("cpu")
    with iv.quiet_vllm():
        for group in groups:
            gid = group.kv_cache_group_id
            size = kernel_block_sizes[gid] if gid < len(kernel_block_sizes) else None
            group.create_metadata_builders(vcfg, cpu, size)
        layout = _vllm_layout[resolve_layout(kv_cache_config).name]
        views = (allocate or _worker_utils.allocate_kv_cache)(
            vconfig, cpu, layout, kernel_block_sizes
        )
        bound: dict[str, torch.Tensor] = _worker_utils.map_kv_caches_to_kernel_blocks(views, groups)
    return bound, groups
