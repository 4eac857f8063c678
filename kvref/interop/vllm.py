"""Convert kvref objects to and from vLLM 0.33.0's, and run vLLM's own planning flow.

vLLM is imported lazily, on the first call that needs it, so kvref and the
kit keep working where vLLM is not installed; the calls that need it then
raise :class:`VLLMUnavailableError` saying how to install it.

What converts:

- per-layer specs of every kvref kind (:mod:`kvref.specs`) and
  :class:`~kvref.specs.UniformTypeKVCacheSpecs`, both ways, field by field
  (vLLM's dataclasses and kvref's attrs classes share field names; enums are
  matched by member name);
- :class:`~kvref.records.KVCacheGroupSpec`, :class:`~kvref.records.KVCacheTensor`
  and :class:`~kvref.records.KVCacheConfig`, both ways;
- :class:`~kvref.config.PlanningConfig` to a real ``VllmConfig``, built
  offline over a throw-away local model directory (see :func:`to_vllm_config`).

:func:`plan_with_vllm` runs vLLM's Core flow (``get_global_kv_cache_groups``
then ``get_kv_cache_configs``) with a given vLLM builder class installed as
the platform's builder, and returns a :class:`~kvref.planning.KVCachePlan`.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import functools
import importlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, cast

import attrs

from kvref.config import PlanningConfig
from kvref.errors import (
    InsufficientMemoryError,
    KVRefError,
    PlanningError,
    UnsupportedError,
)
from kvref.planning import KVCachePlan, WorkerPlan
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
    "installed_builder",
    "is_vllm_available",
    "layer_spec_from_vllm",
    "plan_with_vllm",
    "spec_from_vllm",
    "spec_to_vllm",
    "specs_to_vllm",
    "to_vllm_config",
    "vllm_modules",
]

#: The vLLM release these conversions are written against.
VLLM_VERSION = "0.33.0"

#: How to get a vLLM this module can use.
INSTALL_HINT = (
    f"vLLM {VLLM_VERSION} is needed: run `tox -e vllm`, or install it on a CPU machine with "
    "`scripts/install-vllm-cpu.sh` (torch==2.13.0, vllm --no-deps and the deps listed in "
    "requirements/vllm-cpu.txt); see docs/vllm.md"
)


class VLLMUnavailableError(UnsupportedError):
    """vLLM cannot be imported; the message says how to install it."""


class VLLMOutputError(RuntimeError):
    """What vLLM returned cannot be expressed as kvref records.

    Deliberately not a :class:`~kvref.errors.KVRefError` (nor a
    ``ValueError``): it reports a broken result, not an input that vLLM
    refused with a clear error, so the conformance kit must not take it for
    a typed refusal.
    """


# ---------------------------------------------------------------------------
# lazy import


@attrs.frozen
class _VLLM:
    """The vLLM modules and types the conversions use."""

    kvi: Any
    kvp: Any
    builder_module: Any
    config_module: Any
    multiple_of: Any
    version: str


@functools.lru_cache(maxsize=1)
def vllm_modules() -> _VLLM:
    """Import the parts of vLLM that planning needs (once; importing vLLM takes seconds).

    Raises:
        VLLMUnavailableError: vLLM (or one of its dependencies) cannot be imported.
    """
    # A machine without network must not try to reach the Hugging Face hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        modules = {
            name: importlib.import_module(name)
            for name in (
                "vllm",
                "vllm.config",
                "vllm.v1.core.kv_cache_config_builder",
                "vllm.v1.core.kv_cache_planning",
                "vllm.v1.kv_cache_interface",
                "vllm.v1.attention.backend",
            )
        }
    except ImportError as exc:
        raise VLLMUnavailableError(f"cannot import vLLM ({exc}). {INSTALL_HINT}") from exc
    vllm = modules["vllm"]
    kvi = modules["vllm.v1.kv_cache_interface"]
    kvp = modules["vllm.v1.core.kv_cache_planning"]
    builder_module = modules["vllm.v1.core.kv_cache_config_builder"]
    config_module = modules["vllm.config"]
    VMultipleOf = modules["vllm.v1.attention.backend"].MultipleOf  # noqa: N806 - a class
    version = str(getattr(vllm, "__version__", "unknown"))
    return _VLLM(
        kvi=kvi,
        kvp=kvp,
        builder_module=builder_module,
        config_module=config_module,
        multiple_of=VMultipleOf,
        version=version,
    )


def is_vllm_available() -> bool:
    """Whether :func:`vllm_modules` can import vLLM."""
    try:
        vllm_modules()
    except VLLMUnavailableError:
        return False
    return True


@contextlib.contextmanager
def _quiet_vllm() -> Iterator[None]:
    # vLLM logs every padding layer, override and auto-fit at INFO; a kit run
    # makes thousands of planning calls, so keep only its errors.
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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
    key = (spec, spec.is_draft)
    cached = _TO_VLLM_CACHE.get(key)
    if cached is not None:
        return cached
    cls = type(spec)
    if _KVREF_KINDS.get(cls.__name__) is not cls:
        raise UnsupportedError(f"kvref spec class {cls.__qualname__} has no vLLM counterpart")
    vcls = getattr(vllm_modules().kvi, cls.__name__)
    vfields = {f.name for f in dataclasses.fields(vcls) if f.init}
    kwargs: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.name not in vfields:
            raise UnsupportedError(f"vLLM's {vcls.__name__} has no field {field.name!r}")
        kwargs[field.name] = _value_to_vllm(field.name, getattr(spec, field.name))
    try:
        converted = vcls(**kwargs)
    except (ValueError, AssertionError, TypeError) as exc:
        raise UnsupportedError(f"vLLM refuses {spec!r}: {exc}") from exc
    if len(_TO_VLLM_CACHE) < _CACHE_LIMIT:
        _TO_VLLM_CACHE[key] = converted
    return converted


def specs_to_vllm(specs: Mapping[str, KVCacheSpec]) -> dict[str, Any]:
    """``{layer: vLLM spec}`` for a ``{layer: kvref spec}`` mapping (a new dict, in order)."""
    return {name: spec_to_vllm(spec) for name, spec in specs.items()}


def spec_from_vllm(spec: Any) -> GroupKVCacheSpec:
    """The kvref spec equal to a vLLM spec (per-layer or ``UniformTypeKVCacheSpecs``).

    Raises:
        VLLMOutputError: the spec is of a vLLM class kvref does not model
            (HiSparse, sink, RSWA, hidden-state...) or carries a field kvref lacks.
    """
    kvi = vllm_modules().kvi
    if isinstance(spec, kvi.UniformTypeKVCacheSpecs):
        layers = {name: spec_from_vllm(s) for name, s in spec.kv_cache_specs.items()}
        try:
            return UniformTypeKVCacheSpecs(kv_cache_specs=layers)
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
        raise VLLMOutputError(
            f"vLLM spec class {type(spec).__qualname__} has no kvref counterpart: {spec!r:.200}"
        )
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
    return kvi.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups_to_vllm(config.kv_cache_groups),
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        kv_cache_layout=layout.name if layout is not None else None,
        hisparse_host_num_blocks=config.host_num_blocks,
        kv_tp_replicas=config.kv_tp_replicas,
    )


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
        return KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=tensors,
            kv_cache_groups=groups_from_vllm(list(config.kv_cache_groups)),
            prefix_cache_retention_interval=config.prefix_cache_retention_interval or 0,
            kv_cache_layout=config.kv_cache_layout,
            host_num_blocks=config.hisparse_host_num_blocks,
            kv_tp_replicas=config.kv_tp_replicas,
        )
    except (KVRefError, AttributeError, TypeError) as exc:
        raise VLLMOutputError(f"cannot convert {config!r:.300} to kvref: {exc}") from exc


# ---------------------------------------------------------------------------
# PlanningConfig -> VllmConfig

# A tiny Llama config: planning never looks at the model, but ModelConfig
# needs a loadable one.  max_position_embeddings is large so that any
# max_model_len kvref plans for is below the derived length.
_TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 1 << 24,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}


@functools.lru_cache(maxsize=1)
def _model_dir() -> str:
    path = tempfile.mkdtemp(prefix="kvref_vllm_model_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(_TINY_MODEL, f)
    return path


@functools.lru_cache(maxsize=32)
def _skeleton(pipeline_parallel_size: int, async_scheduling: bool) -> Any:
    """A constructed ``VllmConfig`` (slow: a few hundred ms) for one PP size and scheduling mode.

    Only what ``VllmConfig.__post_init__`` validates or derives from is
    given to the constructors; the planning figures are set on copies.
    """
    vc = vllm_modules().config_module
    base_len = 4096
    with _quiet_vllm():
        model_config = vc.ModelConfig(
            model=_model_dir(), skip_tokenizer_init=True, max_model_len=base_len, dtype="float16"
        )
        scheduler_config = vc.SchedulerConfig(
            max_model_len=base_len,
            is_encoder_decoder=False,
            max_num_batched_tokens=2048,
            async_scheduling=async_scheduling,
        )
        # Without GPUs, PP > 1 needs the executor named, or vLLM tries to
        # pick one from the device count.
        parallel_config = vc.ParallelConfig(
            pipeline_parallel_size=pipeline_parallel_size,
            distributed_executor_backend="mp" if pipeline_parallel_size > 1 else None,
        )
        return vc.VllmConfig(
            model_config=model_config,
            cache_config=vc.CacheConfig(block_size=16),
            scheduler_config=scheduler_config,
            parallel_config=parallel_config,
            # The platform is "unspecified" on a machine without an accelerator.
            device_config=vc.DeviceConfig(device="cpu"),
        )


class _EagleBlockDrop:
    """The one question planning asks a speculative config: is the EAGLE block drop on?"""

    method = "eagle"

    def use_eagle_block_drop(self) -> bool:
        return True

    def use_eagle(self) -> bool:
        return True

    def use_multi_module_mtp(self) -> bool:
        return False


@functools.lru_cache(maxsize=8)
def _pinned_class(base: Any) -> type[Any]:
    """A subclass of ``base`` (``VllmConfig``) whose derived planning figures can be pinned.

    ``max_concurrent_batches``, ``num_prefill_lookahead_tokens`` and
    ``speculative_config`` are derived by vLLM from the engine setup (model
    runner, speculative method); kvref takes them as plain numbers, so an
    instance may carry pinned values in ``__dict__`` that these properties return.
    """

    def pinned(name: str, inherited: Any) -> property:
        def get(self: Any) -> Any:
            value = self.__dict__.get(name)
            return value if value is not None else inherited(self)

        return property(get)

    def spec_config(self: Any) -> Any:
        if self.__dict__.get("_kvref_eagle_block_drop"):
            return _EagleBlockDrop()
        return self.__dict__.get("speculative_config")

    def set_spec_config(self: Any, value: Any) -> None:
        self.__dict__["speculative_config"] = value

    namespace = {
        "__doc__": "VllmConfig with planning figures pinned by kvref.",
        "max_concurrent_batches": pinned(
            "_kvref_concurrent_batches", base.max_concurrent_batches.fget
        ),
        "num_prefill_lookahead_tokens": pinned(
            "_kvref_lookahead", base.num_prefill_lookahead_tokens.fget
        ),
        "speculative_config": property(spec_config, set_spec_config),
    }
    return type("KVRefPinnedVllmConfig", (base,), namespace)


@functools.lru_cache(maxsize=256)
def _template(config: PlanningConfig) -> Any:
    if config.host_resident_layers:
        raise UnsupportedError(
            "host_resident_layers has no vLLM counterpart outside HiSparse; "
            "the vLLM adapter cannot express host-resident groups"
        )
    vcfg = copy.deepcopy(_skeleton(config.pipeline_parallel_size, config.async_scheduling))
    model, cache, sched, par = (
        vcfg.model_config,
        vcfg.cache_config,
        vcfg.scheduler_config,
        vcfg.parallel_config,
    )
    model.max_model_len = config.max_model_len
    # Core auto-fits when the user asked for max_model_len=-1; kvref's
    # max_model_len is then the upper bound, as vLLM's derived length is.
    model.original_max_model_len = -1 if config.auto_fit_max_model_len else config.max_model_len
    sched.max_model_len = config.max_model_len
    sched.max_num_batched_tokens = config.max_num_batched_tokens
    sched.max_num_encoder_input_tokens = config.encoder_input_tokens
    # Set after construction: on a CPU vLLM forces the hybrid manager off,
    # and refuses an explicit False at construction.
    sched.disable_hybrid_kv_cache_manager = config.disable_hybrid_kv_cache_manager
    cache.num_gpu_blocks_override = config.num_gpu_blocks_override
    cache.kv_cache_layout = config.kv_cache_layout.name
    cache.mamba_cache_mode = config.mamba_cache_mode
    cache.prefix_cache_retention_interval = config.prefix_cache_retention_interval
    # Planning reads only these numbers; constructing a TP/DCP engine on a
    # CPU is neither possible nor needed.
    par.tensor_parallel_size = config.tensor_parallel_size
    par.decode_context_parallel_size = config.decode_context_parallel_size

    pins: dict[str, Any] = {}
    if vcfg.max_concurrent_batches != config.concurrent_batches:
        pins["_kvref_concurrent_batches"] = config.concurrent_batches
    if vcfg.num_prefill_lookahead_tokens != config.num_prefill_lookahead_tokens:
        pins["_kvref_lookahead"] = config.num_prefill_lookahead_tokens
    if config.eagle_block_drop:
        pins["_kvref_eagle_block_drop"] = True
    if pins:
        # Pin every figure once the class is swapped: vLLM derives them from
        # each other (the model runner choice reads the speculative config),
        # and the stub speculative config answers only planning's question.
        pins["_kvref_concurrent_batches"] = config.concurrent_batches
        pins["_kvref_lookahead"] = config.num_prefill_lookahead_tokens
        vcfg.__class__ = _pinned_class(cast(Hashable, type(vcfg)))
        vcfg.__dict__.update(pins)
    if vcfg.max_in_flight_tokens != config.max_in_flight_tokens:  # pragma: no cover - a bug here
        raise UnsupportedError(
            f"vLLM's max_in_flight_tokens={vcfg.max_in_flight_tokens} differs from kvref's "
            f"{config.max_in_flight_tokens}"
        )
    return vcfg


def to_vllm_config(config: PlanningConfig) -> Any:
    """A fresh ``VllmConfig`` that plans as ``config`` does.

    Constructing a ``VllmConfig`` takes a noticeable fraction of a second, so
    one is built per PP size and scheduling mode, configured once per
    distinct ``config`` (both cached), and handed out as a deep copy
    (about a millisecond): vLLM's Core mutates ``max_model_len`` and
    ``num_gpu_blocks_override`` while it plans, which must not leak into the cache.

    The copy has the layout resolved to ``config.kv_cache_layout``,
    ``original_max_model_len = -1`` for auto-fit, and
    ``max_in_flight_tokens``, the prefill lookahead and the EAGLE block drop
    equal to kvref's (pinned where vLLM would derive another value).

    Raises:
        VLLMUnavailableError: vLLM cannot be imported.
        UnsupportedError: ``config`` asks for something vLLM cannot express
            (host-resident layers).
    """
    vllm_modules()
    return copy.deepcopy(_template(config))


# ---------------------------------------------------------------------------
# vLLM's Core flow

_CORE_LOCK = threading.RLock()


@contextlib.contextmanager
def installed_builder(native_cls: type[Any]) -> Iterator[None]:
    """Make vLLM's ``get_kv_cache_config_builder`` return fresh ``native_cls`` instances.

    Both Core functions look the builder up at call time in
    ``vllm.v1.core.kv_cache_config_builder``; the original is restored on exit.
    Calls are serialised: the patch is process-wide.
    """
    module = vllm_modules().builder_module
    with _CORE_LOCK:
        original = module.get_kv_cache_config_builder
        module.get_kv_cache_config_builder = lambda vllm_config: native_cls()
        try:
            yield
        finally:
            module.get_kv_cache_config_builder = original


_NEEDED = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, .*? memory \(([\d.]+) GiB\)"
)
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_GIB = 2**30


@attrs.frozen
class _Figures:
    available: int
    effective: int
    bpb: int
    check: int
    needed: int
    before_min: int | None


def _worker_figures(
    native_cls: type[Any],
    vcfg: Any,
    global_groups: list[Any],
    worker_specs: list[dict[str, Any]],
    memory: Sequence[int],
) -> list[_Figures]:
    """Core's per-worker numbers, recomputed with vLLM's own helpers (0 where they fail).

    vLLM keeps them in locals; recomputing them after the flow (with the
    final ``max_model_len``) gives the kit and the differential tests the
    same figures kvref's :class:`~kvref.planning.WorkerPlan` carries.
    """
    kvp = vllm_modules().kvp
    override = vcfg.cache_config.num_gpu_blocks_override
    out: list[_Figures] = []
    for specs, available in zip(worker_specs, memory, strict=True):
        try:
            groups = kvp._project_kv_cache_groups_to_worker(global_groups, specs)
            builder = native_cls()
            bpb = kvp._pool_bytes_per_block_from_builder(builder, vcfg, groups) if groups else 0
            effective = override * bpb if override is not None and groups else available
            check = effective - bpb if groups else effective
            needed = kvp._max_memory_usage_bytes_from_groups(builder, vcfg, groups) if groups else 0
            before = (effective // bpb if bpb else None) if groups else 1
        except Exception:  # figures are informative; the flow's result stands
            out.append(_Figures(available, available, 0, available, 0, None))
            continue
        out.append(_Figures(available, effective, bpb, check, needed, before))
    return out


def _insufficient(
    message: str, vcfg: Any, figures: list[_Figures] | None
) -> InsufficientMemoryError:
    """The kvref typed error for one of vLLM's insufficient-memory ``ValueError`` s."""
    max_model_len = int(vcfg.model_config.max_model_len)
    needed = available = estimated = 0
    match = _NEEDED.search(message)
    if match:
        max_model_len = int(match.group(1))
        needed = round(float(match.group(2)) * _GIB)
        available = round(float(match.group(3)) * _GIB)
    estimate = _ESTIMATE.search(message)
    if estimate:
        estimated = int(estimate.group(1))
    if message.startswith("Cannot auto-fit"):
        max_model_len = 1
    # vLLM prints GiB to two decimals; take the exact bytes of the first
    # worker that does not fit when the figures are known.
    for fig in figures or ():
        if fig.bpb and (fig.check <= 0 or fig.needed > fig.check):
            available = max(fig.check, 0)
            needed = fig.needed
            break
    return InsufficientMemoryError(
        f"vLLM: {message}",
        max_model_len=max_model_len,
        needed_bytes=needed,
        available_bytes=available,
        estimated_max_model_len=estimated,
    )


def _is_insufficient(message: str) -> bool:
    return (
        message.startswith("No available memory for the cache blocks")
        or message.startswith("To serve at least one request")
        or message.startswith("Cannot auto-fit max_model_len")
    )


def plan_with_vllm(
    native_cls: type[Any],
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: int | Sequence[int],
) -> KVCachePlan:
    """Run vLLM's own Core flow with ``native_cls`` as the platform's builder.

    The counterpart of :func:`kvref.planning.plan_kv_cache`:
    ``get_global_kv_cache_groups`` then ``get_kv_cache_configs``, on a
    :func:`to_vllm_config` copy, with the results converted to kvref records.
    Each config records ``config.kv_cache_layout`` (vLLM's engine core does
    that after planning); ``max_model_len`` is the auto-fitted length; the
    per-worker figures are recomputed with vLLM's helpers (0 where unknown).

    Raises:
        InsufficientMemoryError: vLLM's "no available memory", "to serve at
            least one request..." and "cannot auto-fit" ``ValueError`` s, with
            the numbers parsed from the message (exact bytes where recomputable).
        PlanningError: any other ``ValueError`` from vLLM.
        VLLMOutputError: vLLM's result does not convert to kvref records.
        AssertionError, NotImplementedError, ...: vLLM's own untyped failures,
            unchanged.
    """
    workers = [specs_to_vllm(w) for w in kv_cache_specs]
    if isinstance(available_memory, int):
        memory = [available_memory] * len(workers)
    else:
        memory = list(available_memory)
    vcfg = to_vllm_config(config)
    kvp = vllm_modules().kvp
    global_groups: list[Any] = []
    with installed_builder(native_cls), _quiet_vllm():
        try:
            global_groups = kvp.get_global_kv_cache_groups(vcfg, workers)
            configs = kvp.get_kv_cache_configs(vcfg, workers, memory, global_groups)
        except ValueError as exc:
            message = str(exc)
            if _is_insufficient(message):
                figures = None
                if global_groups:
                    figures = _worker_figures(native_cls, vcfg, global_groups, workers, memory)
                raise _insufficient(message, vcfg, figures) from exc
            raise PlanningError(f"vLLM: {message}") from exc
        figures = _worker_figures(native_cls, vcfg, global_groups, workers, memory)
    layout = config.kv_cache_layout
    converted = [attrs.evolve(config_from_vllm(c), kv_cache_layout=layout) for c in configs]
    return KVCachePlan(
        global_groups=tuple(groups_from_vllm(global_groups)),
        configs=tuple(converted),
        workers=tuple(
            WorkerPlan(
                available_memory=f.available,
                effective_available_memory=f.effective,
                pool_bytes_per_block=f.bpb,
                check_memory=f.check,
                needed_memory=f.needed,
                num_blocks_before_min=f.before_min,
            )
            for f in figures
        ),
        max_model_len=int(vcfg.model_config.max_model_len),
        num_blocks=min((c.num_blocks for c in converted), default=1),
    )
