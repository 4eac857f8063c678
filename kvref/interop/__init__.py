"""Bridges between kvref and other implementations of KV cache planning.

Each submodule imports its counterpart lazily, so ``import kvref.interop``
works everywhere; :mod:`kvref.interop.vllm` converts to and from vLLM
(:mod:`~kvref.interop.vllm_convert`, :mod:`~kvref.interop.vllm_config`) and
runs its Core flow (:mod:`~kvref.interop.vllm_core`).

For platforms running vLLM, the public API is also available here (each
name imports its module, and vLLM only where it needs it):

- :class:`~kvref.interop.vllm_builder.KvrefKVCacheConfigBuilder`: kvref's
  reference as a vLLM ``KVCacheConfigBuilder`` (importing it imports vLLM);
- :func:`~kvref.interop.vllm_reading.planning_config_from_vllm` and
  :func:`~kvref.interop.vllm_reading.read_vllm_config`: a ``VllmConfig`` as
  a :class:`~kvref.config.PlanningConfig`;
- :class:`~kvref.interop.vllm_reading.VllmModelGrouping`: a vLLM model's
  declared grouping (``SupportsKVCacheGrouping``) as a kvref grouping hook;
- :func:`~kvref.interop.vllm_reading.hisparse_from_vllm`: HiSparse's
  engine-derived settings, read through vLLM's own functions.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KvrefKVCacheConfigBuilder": "kvref.interop.vllm_builder",
    "VllmModelGrouping": "kvref.interop.vllm_reading",
    "VllmReading": "kvref.interop.vllm_reading",
    "hisparse_from_vllm": "kvref.interop.vllm_reading",
    "planning_config_from_vllm": "kvref.interop.vllm_reading",
    "read_vllm_config": "kvref.interop.vllm_reading",
}

__all__ = [
    "KvrefKVCacheConfigBuilder",
    "VllmModelGrouping",
    "VllmReading",
    "hisparse_from_vllm",
    "planning_config_from_vllm",
    "read_vllm_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
