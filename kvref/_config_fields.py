"""The field checks and converters of :class:`kvref.config.PlanningConfig`.

Each names the field and the value it refuses (:class:`kvref.errors.ConfigError`),
so a bad config fails where it is built, before any planning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kvref.axes import KVCacheLayout
from kvref.backends import AttentionBackend
from kvref.errors import BuilderResolutionError, ConfigError, KVRefError
from kvref.versions import VllmVersion, parse_version

_MAMBA_CACHE_MODES = ("none", "align", "all")

#: Speculative methods whose drafter reads the target's hidden states: vLLM's
#: ``use_eagle()`` (DFlash and DSpark, which size their lookahead otherwise,
#: are not modelled).  They drop the trailing prefix-cache block.
EAGLE_METHODS = ("eagle", "eagle3", "mtp")
#: Speculative methods without a draft model, hence without draft KV cache layers.
DRAFTLESS_METHODS = ("ngram", "suffix")
#: The speculative methods a :class:`PlanningConfig` describes (vLLM's
#: ``SpeculativeConfig.method`` names, after vLLM maps ``deepseek_mtp`` & co. to ``mtp``).
SPECULATIVE_METHODS = (
    *EAGLE_METHODS,
    "draft_model",
    "extract_hidden_states",
    *DRAFTLESS_METHODS,
)


def int_check(minimum: int, *, optional: bool = False, owner: str = "PlanningConfig") -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "an int" if not optional else "an int or None"
            raise ConfigError(f"{owner}.{attribute.name}={value!r} must be {kind} >= {minimum}")

    return check


def bool_check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a bool")


def mamba_mode(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _MAMBA_CACHE_MODES:
        raise ConfigError(
            f"PlanningConfig.mamba_cache_mode={value!r} must be one of {_MAMBA_CACHE_MODES}"
        )


def to_layer_names(value: object) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigError(f"PlanningConfig.host_resident_layers={value!r} must be a set of names")
    for name in value:
        if not isinstance(name, str):
            raise ConfigError(
                f"PlanningConfig.host_resident_layers contains {name!r}, which is not a str"
            )
    return frozenset(value)


def cache_dtype_check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"PlanningConfig.cache_dtype={value!r} must be a non-empty string")


def speculative_method_check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and value not in SPECULATIVE_METHODS:
        raise ConfigError(
            f"PlanningConfig.speculative_method={value!r} must be None or one of "
            f"{SPECULATIVE_METHODS}"
        )


def to_vllm_version(value: object) -> VllmVersion:
    return parse_version(value, "PlanningConfig.vllm_version")


def to_layout(value: object) -> KVCacheLayout:
    if isinstance(value, (KVCacheLayout, str)):
        return KVCacheLayout.parse(value)
    raise ConfigError(f"PlanningConfig.kv_cache_layout={value!r} must be a KVCacheLayout or name")


#: The layout HiSparse's connector requires (vLLM
#: ``HiSparseConnector.get_required_kvcache_layout``).
HISPARSE_CONNECTOR_LAYOUT = KVCacheLayout.BLHNC

#: vLLM's legacy names for two layouts (``_LAYOUT_COMPAT_ALIASES``).
_LAYOUT_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


def to_optional_layout(field: str) -> Callable[[object], KVCacheLayout | None]:
    def convert(value: object) -> KVCacheLayout | None:
        if value is None or isinstance(value, KVCacheLayout):
            return value
        if isinstance(value, str):
            try:
                return KVCacheLayout.parse(_LAYOUT_ALIASES.get(value.upper(), value))
            except KVRefError:
                pass
        names = [m.name for m in KVCacheLayout] + list(_LAYOUT_ALIASES)
        raise ConfigError(f"PlanningConfig.{field}={value!r} must be None or a layout in {names}")

    return convert


def to_connector_layout(value: object) -> KVCacheLayout | None:
    return to_optional_layout("kv_connector_layout")(value)


def to_env_layout(value: object) -> KVCacheLayout | None:
    return to_optional_layout("env_kv_cache_layout")(value)


def to_backends(value: object) -> tuple[AttentionBackend, ...]:
    if not isinstance(value, Iterable) or isinstance(value, (str, AttentionBackend)):
        raise ConfigError(
            f"PlanningConfig.attention_backends={value!r} must be a sequence of AttentionBackend"
        )
    backends = tuple(value)
    owner: dict[str, str] = {}
    catch_all: list[str] = []
    for backend in backends:
        if not isinstance(backend, AttentionBackend):
            raise ConfigError(
                f"PlanningConfig.attention_backends contains {backend!r}, which is not an "
                "AttentionBackend"
            )
        if not backend.layers:
            catch_all.append(backend.name)
        for name in sorted(backend.layers):
            if name in owner:
                raise ConfigError(
                    f"PlanningConfig.attention_backends: layer {name!r} runs both "
                    f"{owner[name]!r} and {backend.name!r}; a layer has one backend"
                )
            owner[name] = backend.name
    if len(catch_all) > 1:
        raise ConfigError(
            f"PlanningConfig.attention_backends: {catch_all} all name no layers; at most one "
            "backend runs the layers no other backend names"
        )
    return backends


def qualname_parts(qualname: object, field: str) -> tuple[str, str]:
    """``(module, attribute)`` of a builder qualname, ``module.Class`` or ``module:Class``.

    Only the form is checked: as in vLLM, the name is resolved (its module
    imported) when a builder is asked for (:mod:`kvref.resolution`).

    Raises:
        BuilderResolutionError: ``qualname`` is not a str of either form.
    """
    if not isinstance(qualname, str):
        raise BuilderResolutionError(f"{field}={qualname!r} must be a qualname str")
    if ":" in qualname:
        module, _, attr = qualname.partition(":")
    else:
        module, _, attr = qualname.rpartition(".")
    if not module or not attr:
        raise BuilderResolutionError(
            f"{field}={qualname!r} must be a qualname, 'module.Class' or 'module:Class'"
        )
    return module, attr


def builder_qualname(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        qualname_parts(value, f"PlanningConfig.{attribute.name}")
