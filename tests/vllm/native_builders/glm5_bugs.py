"""The GLM-5 top-down builder with one planted bug per class.

Each bug sits in code the kit's default generation reaches: every GLM-5
model the kit draws is placed by the platform (its layouts are
block-outermost), and two in three carry an MTP layer.

- :class:`GLM5ShortBackingBuilder`, meant invariant ``KV-PLACE-BACKING-SIZE``
  (contract.md#placement-backing): the device backing is one block short.
- :class:`GLM5ReversingBuilder`, meant invariant ``KV-PLACE-INPUT-UNCHANGED``
  (contract.md#hook-purity: placement changes nothing it is given): it
  reverses the layer lists of the groups it is handed, in place.
- :class:`GLM5DropsMTPBuilder`, meant invariant ``KV-GROUP-PARTITION``
  (contract.md#grouping-partition): its grouping leaves the MTP layer out.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
)

from tests.vllm.native_builders._common import SlotPlan, plain_engine
from tests.vllm.native_builders.glm5 import GLM5TopDownBuilder, decoder_index, is_glm5_model

__all__ = ["GLM5DropsMTPBuilder", "GLM5ReversingBuilder", "GLM5ShortBackingBuilder"]


class GLM5ShortBackingBuilder(GLM5TopDownBuilder):
    """Allocates ``num_blocks - 1`` blocks' bytes (never fewer than one) for ``num_blocks``.

    The platform keeps the null block (block 0) in a scratch page of its own,
    so this variant "saves" it from the backing; but Core addresses block IDs
    ``0 .. num_blocks - 1`` in every tensor, so the last block's pages lie
    past the end (``KV-PLACE-IN-BOUNDS`` sees that side) and the backing is
    not ``bytes_per_block * num_blocks``.  At one block the plan is correct.
    """

    def _tensors(self, plan: SlotPlan, num_blocks: int) -> list[KVCacheTensor]:
        size = plan.bytes_per_block * max(num_blocks - 1, 1)  # the bug
        return [dataclasses.replace(t, size=size) for t in super()._tensors(plan, num_blocks)]


class GLM5ReversingBuilder(GLM5TopDownBuilder):
    """Reverses ``layer_names`` of the groups it is given, in place, to get its top-down order.

    The platform wants the last decoder layer's caches at the top of the
    block; reversing the group's own list is the shortcut.  vLLM's Core hands
    the same group objects to every placement call and then to the KV cache
    manager, whose block tables follow ``layer_names``: the groups Core keeps
    are no longer the ones it planned.  The config echoes the changed groups
    too (``KV-PLACE-GROUPS-ECHOED``).
    """

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        if self._slot_plan(vllm_config, kv_cache_groups) is not None:
            for group in kv_cache_groups:
                group.layer_names.reverse()  # the bug: the caller's list
        return super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)


class GLM5DropsMTPBuilder(GLM5TopDownBuilder):
    """Groups only the target's decoder layers: the MTP layer is left out.

    The builder reads ``hf_config.num_hidden_layers`` from the ``VllmConfig``
    and keeps the layers below it, assuming the draft runner allocates the
    MTP layer's caches itself; on this platform it does not, and vLLM's Core
    hands the builder every layer the workers report (draft layers included)
    and needs each in exactly one group.
    """

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        if not plain_engine(vllm_config) or not is_glm5_model(kv_cache_spec):
            return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        target_layers = vllm_config.model_config.hf_config.num_hidden_layers
        kept = {
            name: spec
            for name, spec in kv_cache_spec.items()
            if (decoder_index(name) or 0) < target_layers  # the bug: MTP layers are dropped
        }
        return super().get_kv_cache_groups(vllm_config, kept)
