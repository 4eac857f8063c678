"""Convert kvref specs and records to and from the installed vLLM's.

vLLM is imported lazily (:mod:`kvref.interop.vllm_import`, whose names are
re-exported here), so kvref and the kit keep working where vLLM is not
installed.

What converts, both ways, field by field (vLLM's dataclasses and kvref's
attrs classes share field names; enums are matched by member name):

- per-layer specs of every kvref kind (:mod:`kvref.specs`) and
  :class:`~kvref.specs.UniformTypeKVCacheSpecs`;
- :class:`~kvref.records.KVCacheGroupSpec`, :class:`~kvref.records.KVCacheTensor`
  and :class:`~kvref.records.KVCacheConfig`;
- a vendor's own subclass of a vLLM spec class: kvref keeps it as a
  stand-in subclass of the nearest kvref kind (:mod:`kvref.interop.vllm_vendor`),
  which converts back to a fresh instance of the vendor's class, never to
  its vLLM base.

A spec field the installed vLLM lacks (:attr:`kvref.versions.Rules.spec_fields`)
converts only at its default.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kvref.errors import KVRefError, UnsupportedError
from kvref.extra_specs import HiddenStateCacheSpec, HiSparseHotSpec, HiSparseResidentSpec
from kvref.interop.vllm_import import (
    INSTALL_HINT,
    VLLM_VERSION,
    VLLMOutputError,
    VLLMUnavailableError,
    is_vllm_available,
    keep_vllm_quiet,
    quiet_vllm,
    vllm_modules,
)
from kvref.interop.vllm_vendor import VendorOrigin, vendor_origin, vendor_spec_class
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    GroupKVCacheSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "INSTALL_HINT",
    "VLLM_VERSION",
    "VLLMOutputError",
    "VLLMUnavailableError",
    "config_from_vllm",
    "config_to_vllm",
    "group_from_vllm",
    "group_to_vllm",
    "groups_from_vllm",
    "groups_to_vllm",
    "is_vllm_available",
    "layer_spec_from_vllm",
    "keep_vllm_quiet",
    "quiet_vllm",
    "spec_from_vllm",
    "spec_to_vllm",
    "specs_to_vllm",
    "vllm_modules",
]

# ---------------------------------------------------------------------------
# specs

_KVREF_KINDS: dict[str, type[KVCacheSpec]] = {
    cls.__name__: cls
    for cls in (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        SlidingWindowMLASpec,
        ChunkedLocalAttentionSpec,
        CircularBufferSpec,
        MambaSpec,
        CrossAttentionSpec,
        EncoderOnlyAttentionSpec,
        SinkFullAttentionSpec,
        RSWASpec,
        HiddenStateCacheSpec,
        HiSparseHotSpec,
        HiSparseResidentSpec,
    )
}

# Fields whose values are enums in vLLM and member names in kvref.
_ENUM_FIELDS = {
    "kv_quant_mode": ("kvi", "KVQuantMode"),
    "cache_role": ("kvi", "SparseCacheRole"),
    "mamba_type": ("registry", "MambaAttentionBackendEnum"),
}


def _enum_type(field: str) -> Any:
    where, name = _ENUM_FIELDS[field]
    if where == "kvi":
        return getattr(vllm_modules().kvi, name)
    registry = importlib.import_module("vllm.v1.attention.backends.registry")
    return getattr(registry, name)


def _value_to_vllm(field: str, value: Any) -> Any:
    if value is None:
        return None
    if field in _ENUM_FIELDS:
        enum = _enum_type(field)
        try:
            return enum[value]
        except KeyError:
            raise UnsupportedError(
                f"{field}={value!r} is not a member of vLLM's {enum.__name__}"
            ) from None
    if field == "block_stride_alignment" and isinstance(value, MultipleOf):
        return vllm_modules().multiple_of(value.n)
    return value


def _value_from_vllm(field: str, value: Any) -> Any:
    if value is None:
        return None
    if field in _ENUM_FIELDS:
        return value.name
    if field == "block_stride_alignment" and isinstance(value, vllm_modules().multiple_of):
        return MultipleOf(value.base)
    if field in ("shapes", "dtypes"):
        return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in value)
    return value


# Conversions are pure, and a kit run converts the same few specs thousands
# of times.  ``is_draft`` is left out of equality and hashing on both sides,
# so it is part of the key.
_TO_VLLM_CACHE: dict[tuple[KVCacheSpec, bool], Any] = {}
_FROM_VLLM_CACHE: dict[tuple[Any, bool], KVCacheSpec] = {}
_CACHE_LIMIT = 4096


def spec_to_vllm(spec: GroupKVCacheSpec) -> Any:
    """The vLLM spec equal to a kvref spec (per-layer or uniform-type wrapper).

    Raises:
        UnsupportedError: the spec's class or a field value has no vLLM counterpart.
    """
    if isinstance(spec, UniformTypeKVCacheSpecs):
        layers = {name: spec_to_vllm(s) for name, s in spec.kv_cache_specs.items()}
        return vllm_modules().kvi.UniformTypeKVCacheSpecs(
            block_size=spec.block_size, kv_cache_specs=layers
        )
    origin = vendor_origin(spec)
    if origin is not None:
        return _vendor_to_vllm(spec, origin)
    key = (spec, spec.is_draft)
    cached = _TO_VLLM_CACHE.get(key)
    if cached is not None:
        return cached
    cls = type(spec)
    if _KVREF_KINDS.get(cls.__name__) is not cls:
        raise UnsupportedError(f"kvref spec class {cls.__qualname__} has no vLLM counterpart")
    vcls = getattr(vllm_modules().kvi, cls.__name__)
    kwargs = _known_fields(spec, cls, vcls)
    try:
        converted = vcls(**kwargs)
    except (ValueError, AssertionError, TypeError) as exc:
        raise UnsupportedError(f"vLLM refuses {spec!r}: {exc}") from exc
    if len(_TO_VLLM_CACHE) < _CACHE_LIMIT:
        _TO_VLLM_CACHE[key] = converted
    return converted


def _known_fields(spec: KVCacheSpec, kind: type[KVCacheSpec], vcls: Any) -> dict[str, Any]:
    """``kind``'s init fields of ``spec`` as vLLM values, for vLLM's class ``vcls``.

    Raises:
        UnsupportedError: a field ``vcls`` lacks (one a later release added) is
            not at its default.
    """
    vfields = {f.name for f in dataclasses.fields(vcls) if f.init}
    kwargs: dict[str, Any] = {}
    for field in attrs.fields(kind):
        if not field.init:
            continue
        value = getattr(spec, field.name)
        if field.name not in vfields:
            if value == field.default:  # a later release's field: the same spec without it
                continue
            raise UnsupportedError(
                f"{kind.__name__}.{field.name}={value!r}: vLLM {vllm_modules().version}'s "
                f"{vcls.__name__} has no field {field.name!r}"
            )
        kwargs[field.name] = _value_to_vllm(field.name, value)
    return kwargs


def _vendor_to_vllm(spec: KVCacheSpec, origin: VendorOrigin) -> Any:
    """A fresh instance of the vendor's own class (never cached: a builder gets its own copy).

    Where the vendor's class is known by name only (a process that never
    imports the vendor's module), the instance is of a subclass of the
    nearest vLLM class named like it (:func:`_named_like`): vLLM plans it as
    that class, which kvref already requires of a vendor class (its page is
    its base's), and converting it back gives the same kvref stand-in.
    """
    base = getattr(vllm_modules().kvi, origin.kind.__name__)
    kwargs = _known_fields(spec, origin.kind, base)
    kwargs.update(origin.extra)
    target: Any = origin.vendor_cls
    if not (isinstance(target, type) and issubclass(target, base)):
        target = _named_like(target, base, tuple(name for name, _ in origin.extra))
    try:
        return target(**kwargs)
    except (ValueError, AssertionError, TypeError) as exc:
        raise UnsupportedError(
            f"{origin.vendor_cls.__qualname__} refuses the fields of {spec!r:.200}: {exc}"
        ) from exc


#: The class attribute a :func:`_named_like` class names the vendor class it stands for in.
_STANDS_FOR = "_kvref_stands_for"


@functools.lru_cache(maxsize=64)
def _named_like(vendor_cls: Any, base: Any, extra: tuple[str, ...]) -> type[Any]:
    """A frozen subclass of vLLM's ``base``, named as ``vendor_cls``, with ``extra`` fields.

    Made once per arguments, so its instances compare equal as the vendor's
    would (vLLM's spec equality is class-strict).
    """
    cls = dataclasses.make_dataclass(
        getattr(vendor_cls, "__name__", "VendorSpec"),
        [(name, Any, dataclasses.field(default=None)) for name in extra],
        bases=(base,),
        frozen=True,
        kw_only=True,
    )
    setattr(cls, _STANDS_FOR, vendor_cls)
    cls.__qualname__ = getattr(vendor_cls, "__qualname__", cls.__name__)
    return cls


def _vendor_base(vendor_cls: type[Any]) -> tuple[Any, type[KVCacheSpec]] | None:
    """The nearest vLLM spec class of a subclass that kvref models, and its kvref kind."""
    kvi = vllm_modules().kvi
    for base in vendor_cls.__mro__[1:]:
        kind = _KVREF_KINDS.get(base.__name__)
        if kind is not None and getattr(kvi, base.__name__, None) is base:
            return base, kind
    return None


def _vendor_from_vllm(spec: Any) -> KVCacheSpec | None:
    """The kvref stand-in of a vendor subclass instance (``None``: not one kvref models)."""
    found = _vendor_base(type(spec)) if dataclasses.is_dataclass(spec) else None
    if found is None:
        return None
    base, kind = found
    names = [f.name for f in dataclasses.fields(base) if f.init]
    extra = tuple(
        (f.name, getattr(spec, f.name))
        for f in dataclasses.fields(spec)
        if f.init and f.name not in names
    )
    # A class made by _named_like converts back to the vendor class it stands for.
    vendor_cls = type(spec).__dict__.get(_STANDS_FOR, type(spec))
    try:
        plain = spec_from_vllm(base(**{n: getattr(spec, n) for n in names}))
        stand_in = vendor_spec_class(kind, vendor_cls, extra)
        converted: KVCacheSpec = stand_in(
            **{f.name: getattr(plain, f.name) for f in attrs.fields(kind) if f.init}
        )
    except (KVRefError, ValueError, AssertionError, TypeError) as exc:
        raise VLLMOutputError(f"cannot convert {spec!r:.200} to kvref: {exc}") from exc
    page = getattr(spec, "page_size_bytes", None)
    if isinstance(page, int) and page != converted.page_size_bytes:
        raise VLLMOutputError(
            f"{type(spec).__qualname__} has a {page}-byte page, but its vLLM base "
            f"{base.__name__} gives {converted.page_size_bytes}; kvref cannot model the subclass"
        )
    return converted


def specs_to_vllm(specs: Mapping[str, KVCacheSpec]) -> dict[str, Any]:
    """``{layer: vLLM spec}`` for a ``{layer: kvref spec}`` mapping (a new dict, in order)."""
    return {name: spec_to_vllm(spec) for name, spec in specs.items()}


def spec_from_vllm(spec: Any) -> GroupKVCacheSpec:
    """The kvref spec equal to a vLLM spec (per-layer or ``UniformTypeKVCacheSpecs``).

    Raises:
        VLLMOutputError: the spec is of a vLLM class kvref does not model
            or carries a field kvref lacks.
    """
    kvi = vllm_modules().kvi
    if isinstance(spec, kvi.UniformTypeKVCacheSpecs):
        layers = {name: spec_from_vllm(s) for name, s in spec.kv_cache_specs.items()}
        shared = {s.block_size for s in layers.values()}
        # vLLM's wrapper carries its own block size, which its block table
        # counts in; kvref's records one other than its layers' shared size
        # as declared, for a checker to judge (vLLM itself checks nothing).
        declared = spec.block_size if len(shared) == 1 and spec.block_size not in shared else None
        try:
            return UniformTypeKVCacheSpecs(kv_cache_specs=layers, declared_block_size=declared)
        except KVRefError as exc:
            raise VLLMOutputError(f"cannot convert {spec!r}: {exc}") from exc
    try:
        key = (spec, bool(getattr(spec, "is_draft", False)))
        cached = _FROM_VLLM_CACHE.get(key)
    except TypeError:  # an unhashable field: convert without the cache
        key, cached = None, None
    if cached is not None:
        return cached
    cls = _KVREF_KINDS.get(type(spec).__name__)
    if cls is None or type(spec) is not getattr(kvi, type(spec).__name__, None):
        vendor = _vendor_from_vllm(spec)
        if vendor is None:
            raise VLLMOutputError(
                f"vLLM spec class {type(spec).__qualname__} has no kvref counterpart: {spec!r:.200}"
            )
        if key is not None and len(_FROM_VLLM_CACHE) < _CACHE_LIMIT:
            _FROM_VLLM_CACHE[key] = vendor
        return vendor
    names = {f.name for f in attrs.fields(cls)}
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if field.name in names:
            kwargs[field.name] = _value_from_vllm(field.name, value)
        elif field.init and value != field.default:
            raise VLLMOutputError(
                f"{type(spec).__name__}.{field.name}={value!r} has no kvref counterpart"
            )
    try:
        converted = cls(**kwargs)
    except (KVRefError, TypeError) as exc:
        raise VLLMOutputError(f"cannot convert {spec!r:.200} to kvref: {exc}") from exc
    if key is not None and len(_FROM_VLLM_CACHE) < _CACHE_LIMIT:
        _FROM_VLLM_CACHE[key] = converted
    return converted


def layer_spec_from_vllm(spec: Any) -> KVCacheSpec:
    """The kvref per-layer spec equal to a vLLM per-layer spec.

    Raises:
        VLLMOutputError: ``spec`` is a ``UniformTypeKVCacheSpecs`` or does not convert.
    """
    converted = spec_from_vllm(spec)
    if not isinstance(converted, KVCacheSpec):
        raise VLLMOutputError(f"expected a per-layer spec, got {spec!r:.200}")
    return converted


# ---------------------------------------------------------------------------
# records


def group_to_vllm(group: KVCacheGroupSpec) -> Any:
    """The vLLM ``KVCacheGroupSpec`` for a kvref group."""
    kvi = vllm_modules().kvi
    try:
        role = kvi.KVCacheGroupRole[group.role]
    except KeyError:
        raise UnsupportedError(f"group role {group.role!r} is not one of vLLM's") from None
    return kvi.KVCacheGroupSpec(
        layer_names=list(group.layer_names),
        kv_cache_spec=spec_to_vllm(group.kv_cache_spec),
        is_eagle_group=group.is_eagle_group,
        host_resident=group.host_resident,
        enable_kv_transfer=group.enable_kv_transfer,
        role=role,
    )


def groups_to_vllm(groups: Sequence[KVCacheGroupSpec]) -> list[Any]:
    """The vLLM groups for kvref groups, in order."""
    return [group_to_vllm(g) for g in groups]


def group_from_vllm(group: Any) -> KVCacheGroupSpec:
    """The kvref group for a vLLM ``KVCacheGroupSpec``.

    Raises:
        VLLMOutputError: ``group`` is not a vLLM group or does not convert.
    """
    kvi = vllm_modules().kvi
    if not isinstance(group, kvi.KVCacheGroupSpec):
        raise VLLMOutputError(f"{group!r:.200} is not a vLLM KVCacheGroupSpec")
    role = getattr(group.role, "name", group.role)
    try:
        return KVCacheGroupSpec(
            layer_names=list(group.layer_names),
            kv_cache_spec=spec_from_vllm(group.kv_cache_spec),
            is_eagle_group=bool(group.is_eagle_group),
            host_resident=bool(group.host_resident),
            enable_kv_transfer=bool(group.enable_kv_transfer),
            role=str(role),
        )
    except KVRefError as exc:
        raise VLLMOutputError(f"cannot convert group {group!r:.200}: {exc}") from exc


def groups_from_vllm(groups: Any) -> list[KVCacheGroupSpec]:
    """The kvref groups for a list of vLLM groups, in order.

    Raises:
        VLLMOutputError: ``groups`` is not a list of vLLM groups.
    """
    if not isinstance(groups, list):
        raise VLLMOutputError(f"expected a list of KVCacheGroupSpec, got {groups!r:.200}")
    return [group_from_vllm(g) for g in groups]


def config_to_vllm(config: KVCacheConfig) -> Any:
    """The vLLM ``KVCacheConfig`` for a kvref config."""
    kvi = vllm_modules().kvi
    tensors = [
        kvi.KVCacheTensor(
            size=t.size,
            layers=list(t.layers),
            layer_stride=t.layer_stride,
            block_stride=t.block_stride,
            offset=t.offset,
            host_resident=t.host_resident,
        )
        for t in config.kv_cache_tensors
    ]
    layout = config.kv_cache_layout
    converted = kvi.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups_to_vllm(config.kv_cache_groups),
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        kv_cache_layout=layout.name if layout is not None else None,
        hisparse_host_num_blocks=config.host_num_blocks,
        hisparse_host_block_stride=config.host_block_stride,
        hisparse_shared_host_pool=config.shared_host_pool,
        kv_tp_replicas=config.kv_tp_replicas,
    )
    if config.resolved_kv_cache_zeroing is not None and _zeroing_is_a_field():
        converted.needs_kv_cache_zeroing = config.resolved_kv_cache_zeroing
    return converted


def _zeroing_is_a_field() -> bool:
    """Whether vLLM's ``KVCacheConfig.needs_kv_cache_zeroing`` is a field Core sets (0.34.0)."""
    kvi = vllm_modules().kvi
    return any(f.name == "needs_kv_cache_zeroing" for f in dataclasses.fields(kvi.KVCacheConfig))


def config_from_vllm(config: Any) -> KVCacheConfig:
    """The kvref config for a vLLM ``KVCacheConfig``.

    Raises:
        VLLMOutputError: ``config`` is not a vLLM config, or a figure in it is
            not one kvref accepts (a negative stride, a non-int size...).
    """
    kvi = vllm_modules().kvi
    if not isinstance(config, kvi.KVCacheConfig):
        raise VLLMOutputError(f"{config!r:.200} is not a vLLM KVCacheConfig")
    try:
        tensors = [
            KVCacheTensor(
                size=t.size,
                layers=list(t.layers),
                layer_stride=t.layer_stride,
                block_stride=t.block_stride,
                offset=t.offset,
                host_resident=bool(t.host_resident),
            )
            for t in config.kv_cache_tensors
        ]
        converted = KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=tensors,
            kv_cache_groups=groups_from_vllm(list(config.kv_cache_groups)),
            prefix_cache_retention_interval=config.prefix_cache_retention_interval,
            kv_cache_layout=config.kv_cache_layout,
            host_num_blocks=config.hisparse_host_num_blocks,
            kv_tp_replicas=config.kv_tp_replicas,
            host_block_stride=config.hisparse_host_block_stride,
            shared_host_pool=bool(config.hisparse_shared_host_pool),
        )
        zeroing = config.needs_kv_cache_zeroing
        if _zeroing_is_a_field() and zeroing != converted.needs_kv_cache_zeroing:
            # Core resolved it across workers (vLLM 0.34.0): keep Core's answer.
            converted = attrs.evolve(converted, resolved_kv_cache_zeroing=bool(zeroing))
        return converted
    except (KVRefError, AttributeError, TypeError) as exc:
        raise VLLMOutputError(f"cannot convert {config!r:.300} to kvref: {exc}") from exc
