"""What a KV cache group carries: a merged per-layer spec or the uniform-type wrapper.

Import the names from :mod:`kvref.specs` (contract.md#uniform-type-groups).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

import attrs

from kvref._math import cdiv
from kvref._spec_base import KVCacheSpec, MemoryInputs
from kvref._spec_fields import homed
from kvref.errors import SpecError

__all__ = ["GroupKVCacheSpec", "UniformTypeKVCacheSpecs", "iter_layer_specs"]


def _convert_layer_specs(value: object) -> Mapping[str, KVCacheSpec]:
    if not isinstance(value, Mapping) or not value:
        raise SpecError(
            f"UniformTypeKVCacheSpecs.kv_cache_specs={value!r} must be a non-empty mapping "
            "of layer name to spec"
        )
    for name, spec in value.items():
        if not isinstance(name, str) or not isinstance(spec, KVCacheSpec):
            raise SpecError(
                f"UniformTypeKVCacheSpecs.kv_cache_specs[{name!r}]={spec!r} must map a layer "
                "name to a per-layer KVCacheSpec"
            )
    # A private copy: the caller's dict stays theirs, and ours cannot change.
    return MappingProxyType(dict(value))


@homed
@attrs.frozen(kw_only=True)
class UniformTypeKVCacheSpecs:
    """One group whose layers keep their own specs.

    See contract.md#uniform-type-groups (vLLM ``UniformTypeKVCacheSpecs``).

    The specs share a type (see :meth:`is_uniform_type`), one block size and
    one ``dcp_sharded``; their pages may differ.  Not hashable, like vLLM's.

    Attributes:
        kv_cache_specs: ``{layer: spec}``, in the group's layer order.
        declared_block_size: the block size the group's block table counts
            tokens in, where the wrapper declares one of its own (vLLM's
            wrapper carries a ``block_size`` field; every wrapper vLLM and
            kvref build sets it to the layers' shared block size).  ``None``,
            the default: the layers' block size.  A declared size other than
            the layers' is recorded as it was, so a checker sees what the
            block table would count (contract.md#grouping-group-specs).
    """

    kind: ClassVar[str] = "uniform_type"

    kv_cache_specs: Mapping[str, KVCacheSpec] = attrs.field(converter=_convert_layer_specs)
    declared_block_size: int | None = attrs.field(default=None)

    @declared_block_size.validator
    def _check_declared(self, attribute: Any, value: int | None) -> None:
        if value is not None and (type(value) is not int or value <= 0):
            raise SpecError(
                f"UniformTypeKVCacheSpecs.declared_block_size={value!r} must be a positive "
                "int or None"
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> UniformTypeKVCacheSpecs:
        # The read-only mapping proxy cannot be pickled; copy through a dict.
        import copy

        return UniformTypeKVCacheSpecs(
            kv_cache_specs=copy.deepcopy(dict(self.kv_cache_specs), memo),
            declared_block_size=self.declared_block_size,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_uniform_type, (dict(self.kv_cache_specs), self.declared_block_size))

    @property
    def first(self) -> KVCacheSpec:
        """The first layer's spec, which decides the type."""
        return next(iter(self.kv_cache_specs.values()))

    @property
    def block_size(self) -> int:
        """The block size the group's block table counts in.

        The declared one where the wrapper has one, else the first spec's
        (the layers' sizes are equal in every wrapper vLLM builds).
        """
        if self.declared_block_size is not None:
            return self.declared_block_size
        return self.first.block_size

    @property
    def dcp_sharded(self) -> bool:
        """The first spec's ``dcp_sharded`` (all are equal)."""
        return self.first.dcp_sharded

    @functools.cached_property
    def page_size_bytes(self) -> int:
        """Sum of the layers' pages: the group's bytes per block before alignment (memoised)."""
        return sum(s.page_size_bytes for s in self.kv_cache_specs.values())

    def max_memory_usage_pages(self, config: MemoryInputs) -> int:
        """``max_i cdiv(maxmem_i, page_i)``: blocks one request needs."""
        return max(
            cdiv(s.max_memory_usage_bytes(config), s.page_size_bytes)
            for s in self.kv_cache_specs.values()
        )

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``max_memory_usage_pages * Σ page``."""
        return self.max_memory_usage_pages(config) * self.page_size_bytes

    def get_max_layers_per_page_size(self) -> int:
        """Size of the largest class of layers sharing one page size."""
        counts: dict[int, int] = {}
        for s in self.kv_cache_specs.values():
            counts[s.page_size_bytes] = counts.get(s.page_size_bytes, 0) + 1
        return max(counts.values())

    @staticmethod
    def is_uniform_type(specs: Sequence[KVCacheSpec]) -> bool:
        """Equal block sizes, equal ``dcp_sharded``, and the first spec's same-type test.

        The test is asymmetric on purpose: vLLM lets the first spec decide.
        """
        if not specs:
            return False
        first = specs[0]
        return (
            all(s.block_size == first.block_size for s in specs)
            and all(s.dcp_sharded == first.dcp_sharded for s in specs)
            and first.is_uniform_with_collection(specs)
        )

    @classmethod
    def from_specs(cls, specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """The wrapper over ``specs`` if they are of one type, else ``None``."""
        if cls.is_uniform_type(list(specs.values())):
            return cls(kv_cache_specs=specs)
        return None


@homed
def _rebuild_uniform_type(
    specs: dict[str, KVCacheSpec], declared_block_size: int | None = None
) -> UniformTypeKVCacheSpecs:
    return UniformTypeKVCacheSpecs(kv_cache_specs=specs, declared_block_size=declared_block_size)


#: What a group carries: a merged per-layer spec or a uniform-type wrapper.
GroupKVCacheSpec: TypeAlias = KVCacheSpec | UniformTypeKVCacheSpecs


def iter_layer_specs(spec: GroupKVCacheSpec) -> Iterator[KVCacheSpec]:
    """The per-layer specs of a wrapper, or the spec itself."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        yield from spec.kv_cache_specs.values()
    else:
        yield spec
