"""Hostile vLLM-native builders: answers built to break the kit's reading of them.

Each one calls ``super()`` and then plants, in an answer of the documented
vLLM type, a value whose methods raise: a field whose truth value raises, a
size that is an ``int`` whose comparisons raise.  Reading such an answer is
the builder's failure (the answer is not what the contract promises), never
an internal error of the kit, which would exit 2 and let a builder turn its
own failure into the kit's.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder


class _Raises:
    """Every question about it raises (truth, text, comparison, iteration)."""

    def __bool__(self) -> bool:
        raise RuntimeError("no truth value here")

    def __repr__(self) -> str:
        raise RuntimeError("no text here")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison here")

    __hash__ = None  # type: ignore[assignment]


class _RaisingInt(int):
    """An ``int`` whose comparisons and text raise."""

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no order here")

    __le__ = __gt__ = __ge__ = __lt__  # type: ignore[assignment]

    def __repr__(self) -> str:
        raise RuntimeError("no text here")


class _PlantsInFirstTensor(DefaultKVCacheConfigBuilder):
    """vLLM's placement, then :meth:`plant` on its first tensor."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        if config.kv_cache_tensors:
            self.plant(config.kv_cache_tensors[0])
        return config

    def plant(self, tensor: Any) -> None:
        raise NotImplementedError


class TruthRaisingField(_PlantsInFirstTensor):
    """The first tensor's ``host_resident`` is a value whose truth raises."""

    def plant(self, tensor: Any) -> None:
        tensor.host_resident = _Raises()


class RaisingIntSize(_PlantsInFirstTensor):
    """The first tensor's size is an ``int`` subclass whose comparisons raise."""

    def plant(self, tensor: Any) -> None:
        tensor.size = _RaisingInt(tensor.size)


class RaisesKitError(DefaultKVCacheConfigBuilder):
    """vLLM's placement, but the kit's own ``KitError`` from every placement of many blocks.

    Were that taken for the kit's failure, the run would end with exit 2 (no
    verdict) instead of failing the builder (KV-CALL-RAISES).
    """

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        from conformance.errors import KitError

        if num_blocks > 1:
            raise KitError("vLLM adapter", "converting the placement input to vLLM: forged")
        return super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
