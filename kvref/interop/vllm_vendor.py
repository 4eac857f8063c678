"""kvref stand-ins for a vendor's own subclasses of vLLM's spec classes.

A vendor may report its layers with its own subclass of a vLLM spec class
(``class AcmeMLASpec(MLAAttentionSpec)``).  vLLM plans such a spec as the
vendor's class: equality is class-strict, and a vLLM-native builder may ask
``isinstance(spec, AcmeMLASpec)``.  kvref therefore keeps the class: the
spec becomes an instance of a subclass of the nearest kvref kind, made once
per (kvref kind, vendor class, vendor-only field values), that remembers
its vendor origin.  :mod:`kvref.interop.vllm_convert` hands it back to vLLM
as a fresh instance of the vendor's class.

Nothing here imports vLLM: the stand-in classes pickle (the conformance kit
sends specs to other processes) by naming their kvref kind, the vendor
class and the field values.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvref.errors import UnsupportedError
from kvref.specs import KVCacheSpec

__all__ = ["VendorOrigin", "vendor_origin", "vendor_spec_class"]

#: The class attribute a stand-in class carries its :class:`VendorOrigin` in.
ORIGIN_ATTRIBUTE = "_kvref_vendor_origin"


@attrs.frozen
class VendorOrigin:
    """Where a stand-in spec class comes from.

    Attributes:
        kind: the kvref spec class it subclasses (the vendor class's nearest vLLM kind).
        vendor_cls: the vendor's subclass of the vLLM spec class.
        extra: the vendor-only constructor fields and their values, in order.
    """

    kind: type[KVCacheSpec]
    vendor_cls: type[Any]
    extra: tuple[tuple[str, Any], ...]


_CLASSES: dict[tuple[type[KVCacheSpec], type[Any], tuple[tuple[str, Any], ...]], type[Any]] = {}


def _rebuild(
    kind: type[KVCacheSpec],
    vendor_cls: type[Any],
    extra: tuple[tuple[str, Any], ...],
    fields: dict[str, Any],
) -> KVCacheSpec:
    """Unpickle a stand-in spec (module level, so that pickle can name it)."""
    cls: type[KVCacheSpec] = vendor_spec_class(kind, vendor_cls, extra)
    return cls(**fields)


def _reduce(self: KVCacheSpec) -> tuple[Any, ...]:
    origin = vendor_origin(self)
    assert origin is not None  # installed only on stand-in classes
    fields = {f.name: getattr(self, f.name) for f in attrs.fields(origin.kind) if f.init}
    return (_rebuild, (origin.kind, origin.vendor_cls, origin.extra, fields))


def vendor_spec_class(
    kind: type[KVCacheSpec], vendor_cls: type[Any], extra: tuple[tuple[str, Any], ...] = ()
) -> type[Any]:
    """The kvref stand-in class for ``vendor_cls`` instances with vendor-only fields ``extra``.

    One class per distinct arguments (so equal vendor specs are equal kvref
    specs, and specs of other vendor classes or vendor-only values are not,
    as in vLLM); it subclasses ``kind`` and is named as the vendor's class.

    Raises:
        UnsupportedError: a vendor-only field value is not hashable (vLLM's
            specs are frozen, hashable dataclasses).
    """
    key = (kind, vendor_cls, extra)
    try:
        cls = _CLASSES.get(key)
    except TypeError:
        raise UnsupportedError(
            f"{vendor_cls.__qualname__}: vendor-only fields {extra!r:.200} are not hashable"
        ) from None
    if cls is None:
        namespace = {
            "__slots__": (),
            "__module__": __name__,
            "__qualname__": vendor_cls.__qualname__,
            "__doc__": (
                f"kvref stand-in for {vendor_cls.__module__}.{vendor_cls.__qualname__} "
                f"(a vLLM {kind.__name__})."
            ),
            ORIGIN_ATTRIBUTE: VendorOrigin(kind, vendor_cls, extra),
            "__reduce__": _reduce,
        }
        cls = _CLASSES[key] = type(vendor_cls.__name__, (kind,), namespace)
    return cls


def vendor_origin(spec: object) -> VendorOrigin | None:
    """The :class:`VendorOrigin` of a stand-in spec or class (``None`` for anything else)."""
    cls = spec if isinstance(spec, type) else type(spec)
    origin = cls.__dict__.get(ORIGIN_ATTRIBUTE)
    return origin if isinstance(origin, VendorOrigin) else None
