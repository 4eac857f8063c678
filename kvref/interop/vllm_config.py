"""A real ``VllmConfig`` of the installed vLLM that plans as a kvref ``PlanningConfig``.

The ``VllmConfig`` is constructed offline, over a throw-away local model
directory, once per PP size and scheduling mode; the planning figures are
then set on copies (see :func:`to_vllm_config`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import copyreg
import dataclasses
import functools
import importlib
import json
import mmap
import os
import pickle
import shutil
import tempfile
from collections.abc import Hashable, Iterator
from typing import Any, cast

from kvref.config import PlanningConfig, SupportsKVCacheGrouping
from kvref.errors import UnsupportedError
from kvref.interop.vllm_convert import groups_to_vllm, layer_spec_from_vllm, vllm_modules
from kvref.interop.vllm_convert import quiet_vllm as _quiet_vllm

__all__ = ["hisparse_patches", "to_vllm_config"]


# A tiny Llama config: planning never looks at the model, but ModelConfig
# needs a loadable one.  max_position_embeddings is large so that any
# max_model_len kvref plans for is below the derived length.  The layer
# counts a builder may read are set per PlanningConfig (see _describe_model);
# these two layers stand only for a config that describes none.
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


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


@functools.lru_cache(maxsize=32)
def _skeleton_pickle(pipeline_parallel_size: int, async_scheduling: bool) -> bytes | None:
    """:func:`_skeleton` pickled (``None``: it does not pickle and is deep-copied).

    Each template starts as a copy of it; unpickling is the faster copy.
    """
    skeleton = _skeleton(pipeline_parallel_size, async_scheduling)
    try:
        return _pickled(skeleton)
    except Exception:
        return None


class _EagleBlockDrop:
    """The one question planning asks a speculative config: is the EAGLE block drop on?"""

    method = "eagle"

    def use_eagle_block_drop(self) -> bool:
        return True

    def use_eagle(self) -> bool:
        return True

    def use_multi_module_mtp(self) -> bool:
        return False

    # HiSparse sizes its hot buffer from the decode query length; the stub
    # stands for no speculative tokens (kvref pins that length separately).
    num_speculative_tokens = None


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
    cls = type("KVRefPinnedVllmConfig", (base,), namespace)
    copyreg.pickle(cls, _reduce_swapped)
    return cls


def _reduce_swapped(obj: Any) -> tuple[Any, ...]:
    """Pickle an instance of a class made at run time as its base plus the swap.

    The classes this module makes cannot be found by name, so pickle (the
    copy :func:`to_vllm_config` hands out) could not rebuild their instances.
    """
    cls = type(obj)
    return _rebuild_swapped, (cls.__bases__[0], cls.__name__), dict(obj.__dict__)


def _rebuild_swapped(base: Any, name: str) -> Any:
    made = {"KVRefPinnedVllmConfig": _pinned_class, "KVRefDeclaringModelConfig": _declaring_class}
    cls: Any = made[name](base)
    return object.__new__(cls)


@functools.lru_cache(maxsize=256)
def _template(config: PlanningConfig) -> Any:
    if config.host_resident_layers:
        raise UnsupportedError(
            "host_resident_layers has no vLLM counterpart outside HiSparse; "
            "the vLLM adapter cannot express host-resident groups"
        )
    pickled = _skeleton_pickle(config.pipeline_parallel_size, config.async_scheduling)
    vcfg = (
        copy.deepcopy(_skeleton(config.pipeline_parallel_size, config.async_scheduling))
        if pickled is None
        else pickle.loads(pickled)
    )
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

    _describe_model(vcfg, config)
    pins: dict[str, Any] = {}
    if vcfg.max_concurrent_batches != config.concurrent_batches:
        pins["_kvref_concurrent_batches"] = config.concurrent_batches
    if vcfg.num_prefill_lookahead_tokens != config.num_prefill_lookahead_tokens:
        pins["_kvref_lookahead"] = config.num_prefill_lookahead_tokens
    if config.speculative_method is not None:
        # vLLM derives the batches in flight and the lookahead from it: pinned.
        pins["speculative_config"] = _speculative_config(vcfg, config)
    elif config.eagle_block_drop:
        pins["_kvref_eagle_block_drop"] = True
    if pins:
        # Pin every figure once the class is swapped: vLLM derives them from
        # each other (the model runner choice reads the speculative config),
        # and the stub speculative config answers only planning's question.
        pins["_kvref_concurrent_batches"] = config.concurrent_batches
        pins["_kvref_lookahead"] = config.num_prefill_lookahead_tokens
        vcfg.__class__ = _pinned_class(cast(Hashable, type(vcfg)))
        vcfg.__dict__.update(pins)
    _apply_hisparse(vcfg, config)
    if config.model_kv_cache_grouping is not None:
        _declare_grouping(vcfg, config)
    if vcfg.max_in_flight_tokens != config.max_in_flight_tokens:  # pragma: no cover - a bug here
        raise UnsupportedError(
            f"vLLM's max_in_flight_tokens={vcfg.max_in_flight_tokens} differs from kvref's "
            f"{config.max_in_flight_tokens}"
        )
    return vcfg


def _set_layers(model_config: Any, num_hidden_layers: int) -> None:
    """Give a ``ModelConfig`` ``num_hidden_layers`` decoder layers, as vLLM reads them."""
    for hf in {id(c): c for c in (model_config.hf_config, model_config.hf_text_config)}.values():
        hf.num_hidden_layers = num_hidden_layers
    # get_total_num_hidden_layers (and so get_num_layers and the PP indices)
    # reads the architecture config, derived once at construction.
    model_config.model_arch_config.total_num_hidden_layers = num_hidden_layers


def _describe_hf(vcfg: Any, config: PlanningConfig) -> None:
    """The model's Hugging Face fields and the cache dtype, as vLLM shows them to a builder.

    vLLM derives a few figures from ``hf_config`` once, at construction
    (architectures, model type, whether the model is a DeepSeek-style MLA
    model, which ``model_config.use_mla`` reads); they are derived again from
    the described fields with vLLM's own rule.
    """
    vcfg.cache_config.cache_dtype = config.cache_dtype
    if not config.hf_config:
        return
    model = vcfg.model_config
    for hf in {id(c): c for c in (model.hf_config, model.hf_text_config)}.values():
        for name, value in config.hf_config:
            setattr(hf, name, list(value) if isinstance(value, tuple) else value)
    arch = model.model_arch_config
    convertor = importlib.import_module(
        "vllm.transformers_utils.model_arch_config_convertor"
    ).ModelArchConfigConvertorBase(model.hf_config, model.hf_text_config)
    if config.hf("architectures") is not None:
        arch.architectures = list(model.hf_config.architectures)
    arch.model_type = model.hf_config.model_type
    arch.text_model_type = getattr(model.hf_text_config, "model_type", None)
    arch.is_deepseek_mla = convertor.is_deepseek_mla()


def _describe_model(vcfg: Any, config: PlanningConfig) -> None:
    """The target's decoder layers and, for MTP, its ``num_nextn_predict_layers``."""
    _describe_hf(vcfg, config)
    model = vcfg.model_config
    if config.num_hidden_layers is not None:
        _set_layers(model, config.num_hidden_layers)
    if config.speculative_method == "mtp" and config.num_draft_layers:
        # The MTP modules ship in the target's checkpoint (DeepSeek's field).
        for hf in {id(c): c for c in (model.hf_config, model.hf_text_config)}.values():
            hf.num_nextn_predict_layers = config.num_draft_layers


def _draft_model_config(vcfg: Any, config: PlanningConfig) -> Any:
    """The draft's ``ModelConfig``: the target's, with the draft's layer counts.

    vLLM loads it from the draft checkpoint (EAGLE heads, a draft model) or
    from the target's with an MTP override, whose hf config keeps the
    target's ``num_hidden_layers`` (where the MTP layers start) and whose
    architecture counts ``num_nextn_predict_layers`` layers.
    """
    draft = copy.deepcopy(vcfg.model_config)
    layers = config.num_draft_layers or 1
    if config.speculative_method == "mtp":
        for hf in {id(c): c for c in (draft.hf_config, draft.hf_text_config)}.values():
            hf.num_nextn_predict_layers = layers
            hf.n_predict = layers
        draft.model_arch_config.total_num_hidden_layers = layers
    else:
        _set_layers(draft, layers)
    return draft


@functools.lru_cache(maxsize=1)
def _speculative_fields() -> tuple[type[Any], dict[str, Any]]:
    """VLLM's ``SpeculativeConfig`` and its fields' defaults."""
    cls: type[Any] = importlib.import_module("vllm.config.speculative").SpeculativeConfig
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        default = field.default
        if default is not dataclasses.MISSING:
            # Pydantic fields keep their default on a FieldInfo.
            defaults[field.name] = getattr(default, "default", default)
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory
    return cls, defaults


def _speculative_config(vcfg: Any, config: PlanningConfig) -> Any:
    """A vLLM ``SpeculativeConfig`` for ``config``'s method, tokens and draft layers.

    vLLM builds one by loading the draft checkpoint; kvref has none, so the
    instance is made without ``__init__`` and given the fields it would
    have: its own methods (``use_eagle``, ``use_eagle_block_drop``,
    ``use_multi_module_mtp``, ...) then answer as vLLM's do.
    """
    cls, defaults = _speculative_fields()
    spec: Any = object.__new__(cls)
    for name, default in defaults.items():
        value = default() if callable(default) and not isinstance(default, type) else default
        object.__setattr__(spec, name, value)
    method = config.speculative_method
    values: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": config.num_speculative_tokens,
        # kvref's switch is the block drop itself; vLLM's switches it off.
        "disable_eagle_block_drop": not config.eagle_block_drop,
        "target_model_config": vcfg.model_config,
        "target_parallel_config": vcfg.parallel_config,
    }
    if method in ("ngram", "suffix", "extract_hidden_states"):
        values["model"] = method
    else:
        values["model"] = vcfg.model_config.model
        values["draft_model_config"] = _draft_model_config(vcfg, config)
        values["draft_parallel_config"] = vcfg.parallel_config
    for name, value in values.items():
        object.__setattr__(spec, name, value)
    return spec


def to_vllm_config(config: PlanningConfig) -> Any:
    """A fresh ``VllmConfig`` that plans as ``config`` does.

    Constructing a ``VllmConfig`` takes a noticeable fraction of a second, so
    one is built per PP size and scheduling mode, configured once per
    distinct ``config`` (both cached), and handed out as a copy (unpickled,
    a fraction of a millisecond): vLLM's Core mutates ``max_model_len`` and
    ``num_gpu_blocks_override`` while it plans, which must not leak into the cache.

    The copy has the layout resolved to ``config.kv_cache_layout``,
    ``original_max_model_len = -1`` for auto-fit, and
    ``max_in_flight_tokens``, the prefill lookahead and the EAGLE block drop
    equal to kvref's (pinned where vLLM would derive another value).

    The model is described as ``config`` describes it: ``hf_config``
    (and ``get_total_num_hidden_layers``) with ``num_hidden_layers``
    decoder layers, ``num_nextn_predict_layers`` with MTP, and with a
    speculative method a ``SpeculativeConfig`` of that method, token count
    and EAGLE block drop whose ``draft_model_config`` has the draft's layer
    count.  A config that describes no layers keeps a two-layer model.

    With :attr:`~kvref.config.PlanningConfig.hisparse` set, the copy has
    vLLM's ``hisparse_config``, a ``HiSparseConnector`` with ``host_pool_gib``
    equal to ``host_pool_bytes`` and the model's ``index_topk``; vLLM derives
    the decode query length and the shared-pool choice from the engine, so
    a non-default value of either needs :func:`hisparse_patches` around the
    vLLM calls.  With a model-declared grouping, the model config reports
    ``supports_kv_cache_grouping`` and resolves to a model class whose
    ``get_kv_cache_groups`` runs the kvref hook on converted specs.

    Raises:
        VLLMUnavailableError: vLLM cannot be imported.
        UnsupportedError: ``config`` asks for something vLLM cannot express
            (host-resident layers, or a shared HiSparse host pool aligned to
            other than the host page size).
    """
    vllm_modules()
    template = _template(config)
    if config not in _FROZEN:
        fresh = _freeze(config, template)
        if fresh is not None:
            return fresh
    frozen = _FROZEN.get(config)
    return copy.deepcopy(template) if frozen is None else pickle.loads(frozen)


def is_pristine(config: PlanningConfig, vllm_config: Any) -> bool:
    """Whether ``vllm_config`` still pickles byte for byte as :func:`to_vllm_config`'s copy did.

    ``True`` proves that nothing reachable by pickling changed; ``False``
    proves nothing (some configs are copied without pickling, and a value
    rebuilt by a reader may pickle differently): a caller that must know
    what changed then compares the object's state itself.
    """
    frozen = _FROZEN.get(config)
    if frozen is None:
        return False
    try:
        return _pickled(vllm_config) == frozen
    except Exception:
        # A hook stored something that cannot be pickled: certainly a change.
        return False


def pristine_pickle(config: PlanningConfig) -> bytes | None:
    """The pickle :func:`to_vllm_config` copies ``config``'s ``VllmConfig`` from, if any.

    ``None`` where :func:`is_pristine` can never say ``True`` (the config is
    deep-copied, or was never converted).  Unpickled, it is another copy of
    what was handed out: a caller that wants to name a hook's changes can
    read the state before the call from it, only once a change is found.
    """
    return _FROZEN.get(config)


#: Per config, the pickle of a copy of its template (``None``: it is deep-copied).
#: Unpickling is about three times faster than ``copy.deepcopy``, and pickling
#: a copy again says cheaply whether a hook changed it.
_FROZEN: dict[PlanningConfig, bytes | None] = {}


def _freeze(config: PlanningConfig, template: Any) -> Any:
    """Record how ``config``'s template is copied; the fresh copy made on the way, or ``None``.

    The template itself may pickle differently from its copies (a first
    round trip can rebuild values it shares), so the bytes kept are a
    copy's, taken before the copy is handed out.  A hook the user's config
    holds (a lambda, say) may not pickle: that config is deep-copied.
    """
    if len(_FROZEN) >= 256:
        # Most configs of a run are planned once or twice (Core's auto-fit
        # probes one per length), so a plain bound keeps the cache small.
        _FROZEN.clear()
    try:
        copied = pickle.loads(_pickled(template))
        _FROZEN[config] = _pickled(copied)
    except Exception:
        _FROZEN[config] = None
        return None
    return copied


def _apply_hisparse(vcfg: Any, config: PlanningConfig) -> None:
    settings = config.hisparse
    if settings is None:
        return
    if settings.shared_host_pool and settings.host_block_alignment != mmap.PAGESIZE:
        raise UnsupportedError(
            f"HiSparseConfig.host_block_alignment={settings.host_block_alignment}: vLLM aligns "
            f"a shared host pool to the host page size, {mmap.PAGESIZE} bytes"
        )
    attention = importlib.import_module("vllm.config.attention")
    vcfg.attention_config.hisparse_config = attention.HiSparseConfig(
        device_buffer_size=settings.device_buffer_size
    )
    if config.host_pool_bytes is not None:
        transfer = importlib.import_module("vllm.config.kv_transfer")
        # vLLM reads int(host_pool_gib * 2**30): exact for any byte count below 2**53.
        vcfg.kv_transfer_config = transfer.KVTransferConfig(
            kv_connector="HiSparseConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"host_pool_gib": config.host_pool_bytes / 2**30},
        )
    if settings.index_topk is not None:
        vcfg.model_config.hf_config.index_topk = settings.index_topk


@contextlib.contextmanager
def hisparse_patches(config: PlanningConfig) -> Iterator[None]:
    """Make vLLM's HiSparse read ``config``'s decode query length and shared-pool choice.

    vLLM derives both from the engine (speculative config, platform, executor);
    this patches ``vllm.v1.hisparse``'s two lookups for the duration of the
    block.  A no-op without HiSparse.  With a speculative method the decode
    query length is left to vLLM, which derives it from the speculative config
    :func:`to_vllm_config` gives it.  (vLLM 0.34.0 asks the platform's HiSparse
    backend whether the pool may be shared, which a CPU has not.)
    """
    settings = config.hisparse
    if settings is None:
        yield
        return
    runtime: Any = importlib.import_module("vllm.v1.hisparse.runtime")
    layout: Any = importlib.import_module("vllm.v1.hisparse.layout")
    saved = (runtime.max_decode_query_len, layout.use_shared_hisparse_host_pool)
    if config.speculative_method is None:
        runtime.max_decode_query_len = lambda vllm_config: settings.max_decode_query_len
    layout.use_shared_hisparse_host_pool = lambda vllm_config: settings.shared_host_pool
    try:
        yield
    finally:
        runtime.max_decode_query_len, layout.use_shared_hisparse_host_pool = saved


class _DeclaredModel:
    """A model class that owns its grouping through a kvref hook (``SupportsKVCacheGrouping``)."""

    def __init__(self, config: PlanningConfig) -> None:
        self.config = config

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        """Run the kvref hook on kvref copies of the specs; return vLLM groups."""
        hook = self.config.model_kv_cache_grouping
        specs = {name: layer_spec_from_vllm(spec) for name, spec in kv_cache_spec.items()}
        if isinstance(hook, SupportsKVCacheGrouping):
            groups = hook.get_kv_cache_groups(self.config, specs)
        elif hook is not None:
            groups = hook(self.config, specs)
        else:  # pragma: no cover - only installed with a hook
            raise UnsupportedError("no model_kv_cache_grouping to declare")
        return groups_to_vllm(groups)


class _DeclaredRegistry:
    def __init__(self, model: _DeclaredModel) -> None:
        self.model = model

    def resolve_model_cls(self, architectures: Any, model_config: Any) -> tuple[Any, str]:
        return self.model, "KVRefDeclaredGroupingModel"


@functools.lru_cache(maxsize=8)
def _declaring_class(base: Any) -> type[Any]:
    """A subclass of ``base`` (``ModelConfig``) that declares model-owned grouping."""

    def registry(self: Any) -> _DeclaredRegistry:
        return _DeclaredRegistry(self.__dict__["_kvref_declared_model"])

    namespace = {
        "__doc__": "ModelConfig whose model owns its KV cache grouping (kvref hook).",
        "supports_kv_cache_grouping": property(lambda self: True),
        "registry": property(registry),
    }
    cls = type("KVRefDeclaringModelConfig", (base,), namespace)
    copyreg.pickle(cls, _reduce_swapped)
    return cls


def _declare_grouping(vcfg: Any, config: PlanningConfig) -> None:
    model = vcfg.model_config
    model.__class__ = _declaring_class(cast(Hashable, type(model)))
    model.__dict__["_kvref_declared_model"] = _DeclaredModel(config)
