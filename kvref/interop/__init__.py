"""Bridges between kvref and other implementations of KV cache planning.

Each submodule imports its counterpart lazily, so ``import kvref.interop``
works everywhere; :mod:`kvref.interop.vllm` converts to and from vLLM 0.33.0
(:mod:`~kvref.interop.vllm_convert`, :mod:`~kvref.interop.vllm_config`) and
runs its Core flow (:mod:`~kvref.interop.vllm_core`).
"""

from __future__ import annotations

__all__: list[str] = []
