"""Which builder plans a model: resolution by qualname (vLLM ``get_kv_cache_config_builder``).

vLLM asks the current platform for the qualname of its builder class
(``Platform.get_kv_cache_config_builder_cls``, which defaults to vLLM's
default builder) and returns a new instance of that class on every call.
kvref reads the same choice from :class:`~kvref.config.PlanningConfig`,
which checks only the names' form; they are resolved here, when a builder
is asked for, as vLLM resolves the platform's answer:

1. ``platform_builder_cls``, the platform hook's answer, if set;
2. else ``model_builder_cls``, a builder the model declares, if set;
3. else the reference builder, :class:`kvref.ReferenceKVCacheConfigBuilder`.

Builders are stateless, so every call returns a fresh instance: planning,
each placement phase and each worker's profiling get distinct objects.
"""

from __future__ import annotations

import functools
import importlib
import inspect

from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig, qualname_parts
from kvref.errors import BuilderResolutionError

__all__ = [
    "DEFAULT_BUILDER_QUALNAME",
    "BuilderResolutionError",
    "get_kv_cache_config_builder",
    "get_kv_cache_config_builder_cls",
    "resolve_builder_class",
]

#: The builder used when neither the platform nor the model names one.
DEFAULT_BUILDER_QUALNAME = "kvref.builder.ReferenceKVCacheConfigBuilder"


@functools.lru_cache(maxsize=128)
def _resolve(qualname: str, field: str) -> type[KVCacheConfigBuilder]:
    module_name, attr = qualname_parts(qualname, field)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure makes the name unusable
        raise BuilderResolutionError(
            f"{field}={qualname!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BuilderResolutionError(
                f"{field}={qualname!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not (isinstance(obj, type) and issubclass(obj, KVCacheConfigBuilder)):
        raise BuilderResolutionError(
            f"{field}={qualname!r} names {obj!r}, which is not a subclass of "
            "kvref.KVCacheConfigBuilder"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise BuilderResolutionError(
            f"{field}={qualname!r} names the abstract class {obj.__qualname__}, which does "
            f"not implement {missing}"
        )
    return obj


def resolve_builder_class(qualname: object, field: str = "builder") -> type[KVCacheConfigBuilder]:
    """The concrete builder class ``qualname`` names (``module.Class`` or ``module:Class``).

    Args:
        qualname: the name to resolve.
        field: what to call the name in error messages (a config field).

    Raises:
        BuilderResolutionError: ``qualname`` is not a str, cannot be imported,
            or names something that is not a concrete ``KVCacheConfigBuilder`` subclass.
    """
    if not isinstance(qualname, str):
        raise BuilderResolutionError(f"{field}={qualname!r} must be a qualname str")
    return _resolve(qualname, field)


def get_kv_cache_config_builder_cls(config: PlanningConfig) -> str:
    """The qualname of the builder ``config`` selects: platform, else model, else the reference."""
    if config.platform_builder_cls is not None:
        return config.platform_builder_cls
    if config.model_builder_cls is not None:
        return config.model_builder_cls
    return DEFAULT_BUILDER_QUALNAME


def get_kv_cache_config_builder(config: PlanningConfig) -> KVCacheConfigBuilder:
    """A new instance of the builder ``config`` selects (a fresh one on every call).

    Raises:
        BuilderResolutionError: the selected qualname does not resolve to a
            concrete builder class, or the class cannot be built without arguments.
    """
    qualname = get_kv_cache_config_builder_cls(config)
    field = (
        "PlanningConfig.platform_builder_cls"
        if config.platform_builder_cls is not None
        else "PlanningConfig.model_builder_cls"
        if config.model_builder_cls is not None
        else "default builder"
    )
    cls = resolve_builder_class(qualname, field)
    try:
        return cls()
    except TypeError as exc:
        raise BuilderResolutionError(
            f"{field}={qualname!r}: {cls.__qualname__}() cannot be built without arguments ({exc})"
        ) from exc
