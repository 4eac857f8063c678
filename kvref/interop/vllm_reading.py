"""Read a :class:`~kvref.config.PlanningConfig` from a vLLM ``VllmConfig``.

The opposite of :func:`kvref.interop.vllm_config.to_vllm_config`: what vLLM's
planning reads of its config, as kvref's planning reads it.  vLLM's builder
hooks get the whole ``VllmConfig`` and read a few fields where they need them
(the layout only when they place, HiSparse's host pool only with HiSparse
on); vLLM's own tests hand them partial configs (``SimpleNamespace`` objects,
mocks) that hold only those fields.  :func:`read_vllm_config` is tolerant in
the same way: a field it cannot read, or whose value is not one vLLM's real
config holds, keeps kvref's default and is remembered with the error that
reading it raised, so that a caller that needs the field raises what vLLM
itself would have raised (:meth:`VllmReading.require`).

HiSparse's settings that vLLM derives from the engine (the decode query
length, whether the TP ranks share one host pool, the host pool's bytes) are
read through the very vLLM functions vLLM's placement calls, looked up in
the modules vLLM's planning looks them up in when it runs, so a patch of
those functions (as vLLM's tests make) is seen here too:
``vllm.v1.hisparse.runtime.max_decode_query_len``,
``vllm.v1.hisparse.layout.use_shared_hisparse_host_pool`` and
``vllm.v1.core.kv_cache_planning.get_hisparse_host_pool_bytes``.

Nothing here imports vLLM before a function is called.
"""

from __future__ import annotations

import functools
import importlib
import math
import mmap
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kvref.config import SPECULATIVE_METHODS, HiSparseConfig, PlanningConfig
from kvref.errors import ConfigError, KVRefError
from kvref.hf import HF_OWNED, hf_config_fields
from kvref.interop.vllm_convert import groups_from_vllm, specs_to_vllm, vllm_modules
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec
from kvref.versions import NEWEST, VllmVersion, installed_vllm_version

__all__ = [
    "VllmModelGrouping",
    "VllmReading",
    "hisparse_from_vllm",
    "planning_config_from_vllm",
    "read_vllm_config",
]


@attrs.frozen
class VllmReading:
    """A :class:`~kvref.config.PlanningConfig` read from a ``VllmConfig``, and what was not read.

    Attributes:
        config: the planning config; a field that could not be read has kvref's default.
        unread: per :class:`~kvref.config.PlanningConfig` field (``hisparse``'s
            own fields as ``hisparse.<name>``), the exception that reading it
            from the ``VllmConfig`` raised, or a :class:`~kvref.errors.ConfigError`
            saying why the value read is not one vLLM's config holds.
    """

    config: PlanningConfig
    unread: Mapping[str, BaseException] = attrs.field(factory=dict)

    def require(self, *fields: str) -> None:
        """Raise what reading the first of ``fields`` that could not be read raised.

        A hook calls this for the fields it needs, so that a partial config
        fails where vLLM's own hook would fail on it, with vLLM's own error.
        """
        for name in fields:
            error = self.unread.get(name)
            if error is not None:
                raise error


class VllmModelGrouping:
    """A vLLM model's own grouping (``SupportsKVCacheGrouping``) as a kvref grouping hook.

    vLLM's default builder asks the model class the config's registry
    resolves (``model_config.registry.resolve_model_cls``) for
    ``get_kv_cache_groups(vllm_config, specs)``; kvref's reference asks
    :attr:`~kvref.config.PlanningConfig.model_kv_cache_grouping` for the same
    with kvref objects.  This hook resolves the model class when it is first
    called (as vLLM does), hands it vLLM specs and the ``VllmConfig``, and
    returns its groups as kvref records.

    Equal to another hook over the same ``VllmConfig`` object.
    """

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config

    def model_class(self) -> Any:
        """The model class vLLM's registry resolves for the config's architectures."""
        model_config = self.vllm_config.model_config
        model_cls, _ = model_config.registry.resolve_model_cls(
            model_config.architectures, model_config
        )
        return model_cls

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """The model's groups for ``kv_cache_spec``, asked with vLLM objects.

        Raises:
            VLLMOutputError: the model's answer is not a list of vLLM groups
                kvref can represent.
        """
        groups = self.model_class().get_kv_cache_groups(
            self.vllm_config, specs_to_vllm(kv_cache_spec)
        )
        return groups_from_vllm(groups)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VllmModelGrouping) and other.vllm_config is self.vllm_config

    def __hash__(self) -> int:
        return hash((VllmModelGrouping, id(self.vllm_config)))

    def __repr__(self) -> str:
        return f"VllmModelGrouping(<VllmConfig at {id(self.vllm_config):#x}>)"


class _Reader:
    """Reads fields of one ``VllmConfig``, remembering each that cannot be read."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.unread: dict[str, BaseException] = {}

    def read(
        self, field: str, read: Callable[[Any], Any], valid: Callable[[Any], bool]
    ) -> tuple[bool, Any]:
        """``(True, value)``, or ``(False, None)`` with the reason remembered under ``field``."""
        try:
            value = read(self.vllm_config)
        except Exception as exc:  # a partial config: vLLM fails there too, if it reads it
            self.unread[field] = exc
            return False, None
        if not valid(value):
            self.unread[field] = ConfigError(
                f"vllm_config: {field}={value!r:.120} is not a value vLLM's config holds"
            )
            return False, None
        return True, value


def _int(minimum: int, optional: bool = False) -> Callable[[Any], bool]:
    def valid(value: Any) -> bool:
        if value is None:
            return optional
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

    return valid


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _any(value: Any) -> bool:
    return True


def _layout(vllm_config: Any) -> KVCacheLayout:
    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    return KVCacheLayout.parse(getattr(layout, "name", layout))


def _json_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def _hf_fields(vllm_config: Any) -> tuple[tuple[str, Any], ...]:
    """The model's JSON-valued ``hf_config`` fields (those a config file holds)."""
    raw = vllm_config.model_config.hf_config.to_dict()
    fields = {
        name: value
        for name, value in raw.items()
        if isinstance(name, str)
        and name.isidentifier()
        and name not in HF_OWNED
        # Nested configs, dtypes...: not a JSON scalar a builder reads here.
        and (
            _json_scalar(value)
            or (isinstance(value, (list, tuple)) and all(_json_scalar(v) for v in value))
        )
    }
    return hf_config_fields(fields)


def _draft_layers(vllm_config: Any) -> int:
    draft = vllm_config.speculative_config.draft_model_config
    if draft is None:
        return 0
    return int(draft.get_total_num_hidden_layers())


def hisparse_from_vllm(vllm_config: Any) -> tuple[HiSparseConfig | None, int | None]:
    """HiSparse's settings and host pool bytes as vLLM's planning derives them.

    ``(None, None)`` with HiSparse off (``attention_config.hisparse_config``
    is ``None``).  Strict: a setting that cannot be read raises what vLLM
    raised (:func:`read_vllm_config` is the tolerant form).

    Raises:
        Exception: what vLLM's functions raise for this config (vLLM's
            ``ValueError`` for a HiSparse config without ``HiSparseConnector``...).
    """
    reading = read_vllm_config(vllm_config)
    reading.require(*(name for name in reading.unread if name.startswith("hisparse")))
    reading.require("host_pool_bytes")
    return reading.config.hisparse, reading.config.host_pool_bytes


def _read_hisparse(reader: _Reader) -> tuple[HiSparseConfig | None, int | None]:
    present, settings = reader.read("hisparse", lambda c: c.attention_config.hisparse_config, _any)
    if not present or settings is None:
        return None, None
    runtime: Any = importlib.import_module("vllm.v1.hisparse.runtime")
    layout: Any = importlib.import_module("vllm.v1.hisparse.layout")
    kvp = vllm_modules().kvp
    fields: dict[str, Any] = {}
    wanted: dict[str, tuple[Callable[[Any], Any], Callable[[Any], bool]]] = {
        "device_buffer_size": (lambda c: settings.device_buffer_size, _int(1, optional=True)),
        "index_topk": (
            lambda c: getattr(c.model_config.hf_config, "index_topk", None),
            _int(1, optional=True),
        ),
        # vLLM's own functions, looked up now: a patch of them is seen (module docstring).
        "max_decode_query_len": (runtime.max_decode_query_len, _int(1)),
        "shared_host_pool": (layout.use_shared_hisparse_host_pool, _is_bool),
        "host_block_alignment": (
            lambda c: getattr(runtime.SharedOffloadRegion, "BLOCK_SIZE_ALIGNMENT", mmap.PAGESIZE),
            _int(1),
        ),
    }
    for name, (read, valid) in wanted.items():
        ok, value = reader.read(f"hisparse.{name}", read, valid)
        if ok:
            fields[name] = value
    ok, pool = reader.read("host_pool_bytes", kvp.get_hisparse_host_pool_bytes, _int(0))
    return HiSparseConfig(**fields), pool if ok else None


# Fields read as they are: (PlanningConfig field, how vLLM holds it, what vLLM's config holds).
_PLAIN: tuple[tuple[str, Callable[[Any], Any], Callable[[Any], bool]], ...] = (
    ("max_model_len", lambda c: c.model_config.max_model_len, _int(1)),
    ("max_num_batched_tokens", lambda c: c.scheduler_config.max_num_batched_tokens, _int(1)),
    ("async_scheduling", lambda c: c.scheduler_config.async_scheduling, _is_bool),
    ("num_gpu_blocks_override", lambda c: c.cache_config.num_gpu_blocks_override, _int(1, True)),
    ("kv_cache_layout", _layout, _any),
    (
        "mamba_cache_mode",
        lambda c: c.cache_config.mamba_cache_mode,
        lambda v: v in ("none", "align", "all"),
    ),
    (
        "decode_context_parallel_size",
        lambda c: c.parallel_config.decode_context_parallel_size,
        _int(1),
    ),
    ("pipeline_parallel_size", lambda c: c.parallel_config.pipeline_parallel_size, _int(1)),
    ("tensor_parallel_size", lambda c: c.parallel_config.tensor_parallel_size, _int(1)),
    (
        "prefix_cache_retention_interval",
        lambda c: c.cache_config.prefix_cache_retention_interval,
        _int(0, optional=True),
    ),
    ("num_prefill_lookahead_tokens", lambda c: c.num_prefill_lookahead_tokens, _int(0)),
    ("num_hidden_layers", lambda c: c.model_config.get_total_num_hidden_layers(), _int(1)),
    ("hf_config", _hf_fields, _any),
    ("cache_dtype", lambda c: c.cache_config.cache_dtype, lambda v: isinstance(v, str) and v != ""),
)

#: Fields that only describe the engine to a builder (planning never reads
#: them): dropped, and remembered as unread, when vLLM's values of them do not
#: make a config kvref accepts (a speculative method kvref does not model...).
_DESCRIPTIVE = ("speculative_method", "num_speculative_tokens", "num_draft_layers")


def _read_engine(reader: _Reader, fields: dict[str, Any]) -> None:
    """The figures vLLM derives from the engine setup, and the speculative config."""
    # vLLM's conditions are truthiness tests: a mock's attribute counts as set.
    ok, disable = reader.read(
        "disable_hybrid_kv_cache_manager",
        lambda c: bool(c.scheduler_config.disable_hybrid_kv_cache_manager),
        _any,
    )
    if ok:
        fields["disable_hybrid_kv_cache_manager"] = disable
    ok, original = reader.read(
        "auto_fit_max_model_len", lambda c: c.model_config.original_max_model_len, _any
    )
    if ok:
        fields["auto_fit_max_model_len"] = original == -1
    ok, spec = reader.read("speculative_config", lambda c: c.speculative_config, _any)
    if ok and spec is not None:
        ok, drop = reader.read(
            "eagle_block_drop", lambda c: bool(spec.use_eagle_block_drop()), _any
        )
        if ok:
            fields["eagle_block_drop"] = drop
        ok, method = reader.read(
            "speculative_method", lambda c: spec.method, lambda v: v in SPECULATIVE_METHODS
        )
        if ok:
            fields["speculative_method"] = method
            for name, read, valid in (
                ("num_speculative_tokens", lambda c: spec.num_speculative_tokens, _int(1)),
                ("num_draft_layers", _draft_layers, _int(0)),
            ):
                ok, value = reader.read(name, read, valid)
                if ok:
                    fields[name] = value


def _read_derived(reader: _Reader, fields: dict[str, Any]) -> None:
    """Figures kvref derives by its own rule: given only where vLLM's differ."""
    defaults = PlanningConfig(**{k: v for k, v in fields.items() if k not in _DESCRIPTIVE})
    ok, batches = reader.read("max_concurrent_batches", lambda c: c.max_concurrent_batches, _int(1))
    if ok and batches != defaults.concurrent_batches:
        fields["max_concurrent_batches"] = batches
    ok, encoder = reader.read(
        "max_num_encoder_input_tokens",
        lambda c: c.scheduler_config.max_num_encoder_input_tokens,
        _int(0),
    )
    if ok and encoder != defaults.encoder_input_tokens:
        fields["max_num_encoder_input_tokens"] = encoder


@functools.lru_cache(maxsize=1)
def _installed_version() -> VllmVersion | None:
    # Read from the package metadata once: parsing it costs milliseconds.
    return installed_vllm_version()


def read_vllm_config(
    vllm_config: Any, vllm_version: VllmVersion | str | None = None
) -> VllmReading:
    """The planning config ``vllm_config`` describes, and the fields that could not be read.

    Args:
        vllm_config: a ``VllmConfig``, or any object with the parts of one that
            planning reads (vLLM's tests hand ``SimpleNamespace`` configs).
        vllm_version: the release whose planning rules apply (default: the
            installed vLLM's, else the newest kvref supports).

    Raises:
        ConfigError: the values read contradict each other in a way kvref
            refuses (only descriptive fields are dropped to make them agree).
        VLLMUnavailableError: HiSparse is on and vLLM cannot be imported.
    """
    reader = _Reader(vllm_config)
    fields: dict[str, Any] = {}
    for name, read, valid in _PLAIN:
        ok, value = reader.read(name, read, valid)
        if ok:
            fields[name] = value
    _read_engine(reader, fields)
    hisparse, pool = _read_hisparse(reader)
    if hisparse is not None:
        fields["hisparse"] = hisparse
        if pool is not None:
            fields["host_pool_bytes"] = pool
    ok, declared = reader.read(
        "model_kv_cache_grouping",
        lambda c: bool(c.model_config.supports_kv_cache_grouping),
        _any,
    )
    if ok and declared:
        fields["model_kv_cache_grouping"] = VllmModelGrouping(vllm_config)
    version = vllm_version if vllm_version is not None else _installed_version()
    fields["vllm_version"] = version if version is not None else NEWEST
    _read_derived(reader, fields)
    return VllmReading(config=_build(fields, reader.unread), unread=dict(reader.unread))


def _build(fields: dict[str, Any], unread: dict[str, BaseException]) -> PlanningConfig:
    """The config of ``fields``; descriptive fields kvref refuses are dropped and recorded."""
    try:
        return PlanningConfig(**fields)
    except KVRefError as exc:
        dropped = [name for name in _DESCRIPTIVE if name in fields]
        if not dropped:
            raise
        for name in dropped:
            unread[name] = exc
            del fields[name]
    return PlanningConfig(**fields)


def planning_config_from_vllm(
    vllm_config: Any, vllm_version: VllmVersion | str | None = None
) -> PlanningConfig:
    """The :class:`~kvref.config.PlanningConfig` a ``VllmConfig`` plans as.

    Tolerant as vLLM's hooks are: a field a partial config lacks keeps
    kvref's default (:func:`read_vllm_config` says which, and why).  The
    layout is vLLM's resolved one (``cache_config.get_resolved_kv_cache_layout()``);
    HiSparse's engine-derived settings come through vLLM's own functions
    (see the module docstring); a model that declares its grouping
    (``model_config.supports_kv_cache_grouping``) gets a
    :class:`VllmModelGrouping`; the vLLM release is the installed one.

    Raises:
        What :func:`read_vllm_config` raises.
    """
    return read_vllm_config(vllm_config, vllm_version).config
