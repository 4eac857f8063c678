"""Output records of planning (contract.md#records): tensors, groups and configs.

vLLM's records are mutable dataclasses; kvref's are frozen attrs classes so
that nobody (Core, a builder, the kit) can change a plan behind another's
back.  Lists given to them are copied into tuples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from kvref.errors import ConfigError, PlacementError
from kvref.layout import KVCacheLayout
from kvref.specs import (
    AttentionSpec,
    GroupKVCacheSpec,
    KVCacheSpec,
    MambaSpec,
    UniformTypeKVCacheSpecs,
    iter_layer_specs,
)

__all__ = ["KVCacheConfig", "KVCacheGroupSpec", "KVCacheTensor"]


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise PlacementError(f"layer names {value!r} must be a list or tuple of str")
    for name in value:
        if not isinstance(name, str):
            raise PlacementError(f"layer name {name!r} in {value!r} must be a str")
    return tuple(value)


def _int_at_least(minimum: int) -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PlacementError(
                f"{type(inst).__name__}.{attribute.name}={value!r} must be an int >= {minimum}"
            )

    return check


def _bool(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise PlacementError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a bool")


@attrs.frozen(kw_only=True)
class KVCacheTensor:
    """One strided run of layers inside a backing allocation.

    Layer ``layers[l]`` at block ``b`` starts at byte
    ``offset + l * layer_stride + b * block_stride`` of the backing; heads,
    states and content follow the layout (contract.md#layouts).

    Attributes:
        size: bytes of the whole backing allocation (not of this tensor's footprint).
        layers: layer names, all sharing one per-layer spec.
        layer_stride, block_stride, offset: bytes.
        host_resident: the tensor lives in the host pool, not on the device.
    """

    size: int = attrs.field(validator=_int_at_least(0))
    layers: tuple[str, ...] = attrs.field(converter=_names)
    layer_stride: int = attrs.field(validator=_int_at_least(0))
    block_stride: int = attrs.field(validator=_int_at_least(0))
    offset: int = attrs.field(default=0, validator=_int_at_least(0))
    host_resident: bool = attrs.field(default=False, validator=_bool)


def _group_spec(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, (KVCacheSpec, UniformTypeKVCacheSpecs)):
        raise PlacementError(f"KVCacheGroupSpec.kv_cache_spec={value!r} must be a KV cache spec")


@attrs.frozen(kw_only=True)
class KVCacheGroupSpec:
    """One block table: layers that share block IDs (vLLM ``KVCacheGroupSpec``).

    Attributes:
        layer_names: the group's layers.
        kv_cache_spec: a merged per-layer spec or a :class:`UniformTypeKVCacheSpecs`.
        is_eagle_group: holds draft layers and takes the EAGLE last-block drop.
        host_resident: uses the host block pool with its own block-ID space.
        enable_kv_transfer: whether KV connectors transfer this group.
        role: ``"DEFAULT"``, ``"HISPARSE_SOURCE"`` or ``"HISPARSE_INDEXER"``.
    """

    layer_names: tuple[str, ...] = attrs.field(converter=_names)
    kv_cache_spec: GroupKVCacheSpec = attrs.field(validator=_group_spec)
    is_eagle_group: bool = attrs.field(default=False, validator=_bool)
    host_resident: bool = attrs.field(default=False, validator=_bool)
    enable_kv_transfer: bool = attrs.field(default=True, validator=_bool)
    role: str = attrs.field(default="DEFAULT")

    def layer_spec(self, layer_name: str) -> KVCacheSpec:
        """The per-layer spec of ``layer_name`` in this group.

        Raises:
            PlacementError: the wrapper has no spec for ``layer_name``.
        """
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            try:
                return spec.kv_cache_specs[layer_name]
            except KeyError:
                raise PlacementError(
                    f"layer {layer_name!r} has no spec in its group's UniformTypeKVCacheSpecs"
                ) from None
        return spec

    def layer_specs(self) -> Iterator[tuple[str, KVCacheSpec]]:
        """``(name, per-layer spec)`` for every layer of the group, in group order."""
        for name in self.layer_names:
            yield name, self.layer_spec(name)


def _tensors(value: object) -> tuple[KVCacheTensor, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, KVCacheTensor) for t in value):
        raise PlacementError(f"kv_cache_tensors={value!r} must be a list of KVCacheTensor")
    return tuple(value)


def _groups(value: object) -> tuple[KVCacheGroupSpec, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(g, KVCacheGroupSpec) for g in value
    ):
        raise PlacementError(f"kv_cache_groups={value!r} must be a list of KVCacheGroupSpec")
    return tuple(value)


def _layout(value: object) -> KVCacheLayout | None:
    if value is None:
        return None
    if isinstance(value, (KVCacheLayout, str)):
        return KVCacheLayout.parse(value)
    raise ConfigError(f"kv_cache_layout={value!r} must be a KVCacheLayout, a name or None")


def _optional_int_at_least(minimum: int) -> Any:
    check = _int_at_least(minimum)

    def optional(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            check(inst, attribute, value)

    return optional


@attrs.frozen(kw_only=True)
class KVCacheConfig:
    """A worker's plan: block count, tensors and groups (vLLM ``KVCacheConfig``).

    Attributes:
        num_blocks: device block IDs (block 0 is the null block).
        kv_cache_tensors: device and host tensors.
        kv_cache_groups: the groups, in the order given to placement.
        prefix_cache_retention_interval: copied from the config (``None``: dense checkpoints).
        kv_cache_layout: the layout the plan was made for (set by Core).
        host_num_blocks: block IDs of the host pool (``hisparse_host_num_blocks``).
        kv_tp_replicas: consecutive TP ranks holding identical KV (set by Core).
        host_block_stride: HiSparse's host bytes per host block
            (``hisparse_host_block_stride``; ``None`` without HiSparse).
        shared_host_pool: local TP ranks share HiSparse's host pool
            (``hisparse_shared_host_pool``).
        resolved_kv_cache_zeroing: Core's answer to :attr:`needs_kv_cache_zeroing`
            for every worker (vLLM 0.34.0 resolves it as an OR across the
            workers' configs); ``None``: derived from this config alone, as
            vLLM 0.33.0 does and as a builder's placement returns it.
    """

    num_blocks: int = attrs.field(validator=_int_at_least(0))
    kv_cache_tensors: tuple[KVCacheTensor, ...] = attrs.field(converter=_tensors)
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = attrs.field(converter=_groups)
    prefix_cache_retention_interval: int | None = attrs.field(
        default=0, validator=_optional_int_at_least(0)
    )
    kv_cache_layout: KVCacheLayout | None = attrs.field(default=None, converter=_layout)
    host_num_blocks: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))
    kv_tp_replicas: int = attrs.field(default=1, validator=_int_at_least(1))
    host_block_stride: int | None = attrs.field(default=None, validator=_optional_int_at_least(1))
    shared_host_pool: bool = attrs.field(default=False, validator=_bool)
    resolved_kv_cache_zeroing: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(_bool)
    )

    def num_blocks_of(self, tensor: KVCacheTensor) -> int:
        """Blocks of ``tensor``: ``num_blocks`` on the device, ``host_num_blocks`` on the host."""
        if tensor.host_resident:
            return self.host_num_blocks or 0
        return self.num_blocks

    @property
    def device_tensors(self) -> tuple[KVCacheTensor, ...]:
        """Tensors backed by the device allocation."""
        return tuple(t for t in self.kv_cache_tensors if not t.host_resident)

    @property
    def host_tensors(self) -> tuple[KVCacheTensor, ...]:
        """Tensors backed by the host pool."""
        return tuple(t for t in self.kv_cache_tensors if t.host_resident)

    @property
    def device_size(self) -> int:
        """Bytes of the device backing (0 without device tensors)."""
        return max((t.size for t in self.device_tensors), default=0)

    @property
    def host_group_ids(self) -> tuple[int, ...]:
        """Indices of host-resident groups."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.host_resident)

    def layer_specs(self) -> Mapping[str, KVCacheSpec]:
        """Per-layer spec of every layer of every group."""
        out: dict[str, KVCacheSpec] = {}
        for group in self.kv_cache_groups:
            out.update(group.layer_specs())
        return out

    @property
    def has_mamba_layers(self) -> bool:
        """Whether any group holds a Mamba layer."""
        return any(
            isinstance(s, MambaSpec)
            for g in self.kv_cache_groups
            for s in iter_layer_specs(g.kv_cache_spec)
        )

    @property
    def has_mixed_precision_kv_cache(self) -> bool:
        """More than one ``(dtype, kv_quant_mode)`` among device attention specs."""
        kinds = {
            (s.dtype, s.kv_quant_mode)
            for g in self.kv_cache_groups
            if not g.host_resident
            for s in iter_layer_specs(g.kv_cache_spec)
            if isinstance(s, AttentionSpec)
        }
        return len(kinds) > 1

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Blocks move between groups, so stale bytes must be zeroed (contract.md#records).

        :attr:`resolved_kv_cache_zeroing` when Core set it, else this config's
        own answer: Mamba layers or a mixed-precision cache.
        """
        if self.resolved_kv_cache_zeroing is not None:
            return self.resolved_kv_cache_zeroing
        return self.has_mamba_layers or self.has_mixed_precision_kv_cache
