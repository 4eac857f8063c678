"""Load a builder by name, and recognise builders written against vLLM's own types."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from conformance.harness.vllm_adapter import wrap_vllm_builder
from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.interop.vllm import INSTALL_HINT, VLLMUnavailableError

__all__ = [
    "DEFAULT_BUILDER",
    "BuilderLoadError",
    "is_vllm_native",
    "load_builder",
    "native_adapter",
]

#: What ``kvref-conformance`` checks when no builder is named.
DEFAULT_BUILDER = "kvref:ReferenceKVCacheConfigBuilder"


class BuilderLoadError(ValueError):
    """The named builder cannot be imported or is not a builder."""


def is_vllm_native(obj: object) -> bool:
    """Whether ``obj`` is a builder class written against vLLM's ``KVCacheConfigBuilder``."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(
        base.__module__.startswith("vllm.") and base.__name__ == "KVCacheConfigBuilder"
        for base in cls.__mro__
    )


def load_builder(spec: str) -> type[KVCacheConfigBuilder] | KVCacheConfigBuilder:
    """Import ``module:Class`` or ``module.Class`` (a class, or an instance).

    Raises:
        BuilderLoadError: the module or attribute is missing, or the object is
            not a kvref builder (vLLM-native builders need the vLLM adapter).
    """
    if spec in ("", "reference", DEFAULT_BUILDER):
        return ReferenceKVCacheConfigBuilder
    if ":" in spec:
        module_name, _, attr = spec.rpartition(":")
    else:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise BuilderLoadError(
            f"builder {spec!r} must be given as module:Class, module.Class or path/to/file.py:Class"
        )
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name))
        else:
            module = importlib.import_module(module_name)
    except BuilderLoadError:
        raise
    except (Exception, SystemExit) as exc:
        hint = ""
        if module_name.split(".")[0] == "vllm":
            hint = f". {INSTALL_HINT}"
        raise BuilderLoadError(
            f"cannot import module {module_name!r} for builder {spec!r}: {exc}{hint}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BuilderLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if is_vllm_native(obj):
        return _wrap_vllm(spec, obj)
    is_builder = (isinstance(obj, type) and issubclass(obj, KVCacheConfigBuilder)) or isinstance(
        obj, KVCacheConfigBuilder
    )
    if not is_builder:
        raise BuilderLoadError(
            f"{spec!r} is {obj!r}, not a kvref.KVCacheConfigBuilder subclass or instance"
        )
    abstract = getattr(obj, "__abstractmethods__", None) if isinstance(obj, type) else None
    if abstract:
        missing = ", ".join(sorted(abstract))
        raise BuilderLoadError(f"{spec!r} is abstract: it does not implement {missing}")
    return obj  # type: ignore[no-any-return]


def native_adapter(obj: Any, name: str | None = None) -> Any:
    """``obj`` as the kit runs it: a vLLM-native class or instance behind the vLLM adapter.

    A builder given as an object (``check_builder(AcmeBuilder)``) is adapted
    as one given by name is (:func:`load_builder`); anything else is
    returned as it is.

    Raises:
        BuilderLoadError: ``obj`` is vLLM-native, but vLLM cannot be imported.
    """
    if isinstance(obj, str) or not is_vllm_native(obj):
        return obj
    return _wrap_vllm(name or (obj if isinstance(obj, type) else type(obj)).__qualname__, obj)


def _import_file(path: Path) -> Any:
    """Import a builder's source file by path (how a ``__main__`` builder is named)."""
    if not path.is_file():
        raise BuilderLoadError(f"builder file {str(path)!r} does not exist")
    name = f"kvref_conformance_builder_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BuilderLoadError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # A __main__ guard in the file keeps its script part from running here.
    spec.loader.exec_module(module)
    return module


def _wrap_vllm(spec: str, obj: Any) -> type[KVCacheConfigBuilder]:
    """The kvref adapter class of a vLLM-native builder (class or instance)."""
    try:
        return wrap_vllm_builder(obj if isinstance(obj, type) else type(obj))
    except VLLMUnavailableError as exc:
        raise BuilderLoadError(f"{spec!r} is a vLLM-native builder, but {exc}") from exc
