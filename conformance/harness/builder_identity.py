"""What the kit knows of a builder without running its hooks: names, parent, resolution.

Of a builder run in a worker process (:mod:`conformance.harness.isolate`)
the kit reads only what the worker said of it, as data stored on its proxy
class (:class:`DescribedBuilder`); of a builder in this process it reads its
class.  The worker answers the same questions with these same functions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kvref.builder import KVCacheConfigBuilder

__all__ = [
    "DescribedBuilder",
    "builder_name",
    "is_vllm_native",
    "isolated_resolver",
    "parent_builder",
    "resolvable_qualname",
    "vllm_default_builder",
]


class DescribedBuilder(KVCacheConfigBuilder):
    """A stand-in for a builder the kit does not import: its worker described it.

    What the worker said (``kvref_name``, ``kvref_parent``, ``kvref_native``,
    ``kvref_qualname``) sits in the stand-in class's own ``__dict__``.
    """


def builder_name(builder: object) -> str | None:
    """The builder's importable ``module:Class`` (a file path for ``__main__``; ``None``: none)."""
    if isinstance(builder, str):
        return builder
    cls = builder if isinstance(builder, type) else type(builder)
    named = cls.__dict__.get("kvref_name")  # an isolated run's proxy names its builder
    if isinstance(named, str):
        return named
    if "<locals>" in cls.__qualname__:
        return None
    module = cls.__module__
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if path is None:
            return None
        return f"{Path(path).resolve()}:{cls.__qualname__}"
    return f"{module}:{cls.__qualname__}"


def _described(builder: object, key: str) -> Any:
    """What the worker said of an isolated builder (``KeyError``: not an isolated proxy)."""
    cls = builder if isinstance(builder, type) else type(builder)
    if not issubclass(cls, DescribedBuilder):
        raise KeyError(key)
    return cls.__dict__.get(key)


def parent_builder(builder: object) -> type[KVCacheConfigBuilder] | None:
    """The default builder a builder specialises, when it subclasses one (``None``: none).

    A subclass of kvref's reference has the reference as parent; a vLLM-native
    subclass of vLLM's ``DefaultKVCacheConfigBuilder`` has vLLM's default.  For
    an isolated builder the worker says which (the kit reads no class of the
    builder's).
    """
    from kvref.builder import ReferenceKVCacheConfigBuilder

    try:
        kind = _described(builder, "kvref_parent")
    except KeyError:
        pass
    else:
        if kind == "reference":
            return ReferenceKVCacheConfigBuilder
        return vllm_default_builder() if kind == "vllm-default" else None
    cls = builder if isinstance(builder, type) else type(builder)
    if cls is not ReferenceKVCacheConfigBuilder and issubclass(cls, ReferenceKVCacheConfigBuilder):
        return ReferenceKVCacheConfigBuilder
    native = getattr(cls, "native_cls", None)
    if native is None:
        return None
    for base in native.__mro__[1:]:
        if base.__name__ == "DefaultKVCacheConfigBuilder" and base.__module__.startswith("vllm."):
            from conformance.harness.vllm_adapter import wrap_vllm_builder

            return wrap_vllm_builder(base)
    return None


def is_vllm_native(builder: object) -> bool:
    """Whether the builder is vLLM-native (run through the vLLM adapter, maybe isolated)."""
    try:
        return bool(_described(builder, "kvref_native"))
    except KeyError:
        cls = builder if isinstance(builder, type) else type(builder)
        return isinstance(getattr(cls, "native_cls", None), type)


def vllm_default_builder() -> type[KVCacheConfigBuilder] | None:
    """VLLM's own ``DefaultKVCacheConfigBuilder`` behind the adapter (``None``: no vLLM)."""
    from conformance.harness.vllm_adapter import wrap_vllm_builder
    from kvref.interop.vllm import VLLMUnavailableError, vllm_modules

    try:
        return wrap_vllm_builder(vllm_modules().kvp.DefaultKVCacheConfigBuilder)
    except (VLLMUnavailableError, AttributeError):
        return None


def resolvable_qualname(builder: object, name: str | None) -> tuple[str | None, str]:
    """``(qualname, note)``: the name a platform could give for ``builder``, or why there is none.

    The name qualifies when kvref's resolution maps it to the very class under
    check (a builder wrapped from vLLM or named by a file path does not:
    resolution would build another class).  For a builder run isolated, the
    class its worker runs is compared (:func:`isolated_resolver` gives the
    proxy that resolves there).
    """
    from kvref.resolution import BuilderResolutionError, resolve_builder_class

    proxy = isolated_resolver(builder)
    if proxy is not None:
        # Decided in the worker (resolution imports the builder's module): data here.
        described = proxy.__dict__.get("kvref_qualname")
        if isinstance(described, tuple) and len(described) == 2:
            qualname, note = described
            return (qualname if isinstance(qualname, str) else None), str(note)
    if name is None:
        return None, "the builder was given as an object without an importable qualname"
    cls = builder if isinstance(builder, type) else type(builder)
    native = getattr(cls, "native_cls", None)
    if isinstance(native, type):
        return _vllm_qualname(native, name)
    checked = cls
    # Finding the class imports its module only; nothing of the builder is constructed.
    try:
        resolved = resolve_builder_class(name, "builder")
    except BuilderResolutionError as exc:
        return None, f"{name!r} is not a qualname kvref's resolution accepts ({exc})"
    if resolved is not checked:
        return None, (
            f"{name!r} resolves to {resolved.__qualname__}, not the class under check "
            f"({checked.__qualname__}: adapted)"
        )
    return name, ""


def _vllm_qualname(native: type[Any], name: str) -> tuple[str | None, str]:
    """Whether vLLM's platform resolution of ``name`` gives the vLLM-native class under check."""
    from conformance.harness.vllm_adapter import resolve_vllm_class

    try:
        resolved = resolve_vllm_class(name)
    except Exception as exc:
        return None, f"{name!r} is not a qualname vLLM's resolution accepts ({exc})"
    if resolved is not native:
        return None, f"{name!r} resolves in vLLM to {resolved!r}, not the class under check"
    return name, ""


def isolated_resolver(builder: object) -> type[DescribedBuilder] | None:
    """The isolated proxy class of ``builder``, whose worker resolves qualnames (``None``: none)."""
    cls = builder if isinstance(builder, type) else type(builder)
    return cls if issubclass(cls, DescribedBuilder) else None
