"""PlanningConfig: the slice of vLLM's ``VllmConfig`` the planner reads.

Defaults are vLLM 0.33.0's for a CUDA-like platform with async scheduling.
The config is frozen: Core's auto-fit, which mutates ``max_model_len`` in
place in vLLM, works on evolved copies here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from kvref.axes import KVCacheLayout
from kvref.errors import ConfigError

if TYPE_CHECKING:
    from kvref.records import KVCacheGroupSpec
    from kvref.specs import KVCacheSpec

__all__ = [
    "DRAFTLESS_METHODS",
    "EAGLE_METHODS",
    "SPECULATIVE_METHODS",
    "GroupingHook",
    "HiSparseConfig",
    "PlanningConfig",
    "SupportsKVCacheGrouping",
]

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


def _int_check(minimum: int, *, optional: bool = False, owner: str = "PlanningConfig") -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "an int" if not optional else "an int or None"
            raise ConfigError(f"{owner}.{attribute.name}={value!r} must be {kind} >= {minimum}")

    return check


def _bool(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a bool")


def _mamba_mode(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _MAMBA_CACHE_MODES:
        raise ConfigError(
            f"PlanningConfig.mamba_cache_mode={value!r} must be one of {_MAMBA_CACHE_MODES}"
        )


def _layers(value: object) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigError(f"PlanningConfig.host_resident_layers={value!r} must be a set of names")
    for name in value:
        if not isinstance(name, str):
            raise ConfigError(
                f"PlanningConfig.host_resident_layers contains {name!r}, which is not a str"
            )
    return frozenset(value)


def _speculative_method(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and value not in SPECULATIVE_METHODS:
        raise ConfigError(
            f"PlanningConfig.speculative_method={value!r} must be None or one of "
            f"{SPECULATIVE_METHODS}"
        )


def _layout(value: object) -> KVCacheLayout:
    if isinstance(value, (KVCacheLayout, str)):
        return KVCacheLayout.parse(value)
    raise ConfigError(f"PlanningConfig.kv_cache_layout={value!r} must be a KVCacheLayout or name")


@runtime_checkable
class SupportsKVCacheGrouping(Protocol):
    """A model that owns its KV cache grouping (vLLM ``SupportsKVCacheGrouping``).

    vLLM asks the model class for ``get_kv_cache_groups(vllm_config, specs)``;
    kvref passes the :class:`PlanningConfig` in place of the ``VllmConfig``.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Split the model's layers into KV cache groups."""
        ...


#: A model-declared grouping: a :class:`SupportsKVCacheGrouping` object, or a
#: plain callable with the same arguments.
GroupingHook = (
    SupportsKVCacheGrouping
    | Callable[["PlanningConfig", dict[str, "KVCacheSpec"]], list["KVCacheGroupSpec"]]
)


def _grouping_hook(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None or isinstance(value, SupportsKVCacheGrouping) or callable(value):
        return
    raise ConfigError(
        f"PlanningConfig.{attribute.name}={value!r} must be None, a callable "
        "(config, specs) -> groups, or an object with get_kv_cache_groups(config, specs)"
    )


def _builder_qualname(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    # Imported here: resolution imports the builder, which imports this module.
    from kvref.resolution import resolve_builder_class

    resolve_builder_class(value, f"PlanningConfig.{attribute.name}")


@attrs.frozen(kw_only=True)
class HiSparseConfig:
    """HiSparse sparse-MLA offloading, as planning sees it (vLLM ``hisparse_config``).

    Its presence turns HiSparse on; the host pool it keeps the sparse-MLA
    source layers in is :attr:`PlanningConfig.host_pool_bytes` (vLLM's
    ``host_pool_gib`` of the ``HiSparseConnector``, in bytes).

    Attributes:
        device_buffer_size: hot-buffer rows per request (``None``: one top-k per
            decode query plus one top-k of slack).
        index_topk: the model's ``index_topk``, used for source layers whose
            ``topk_buffer_width`` is ``None``.
        max_decode_query_len: vLLM's ``max_decode_query_len`` (1, or
            ``1 + num_speculative_tokens`` with speculative decoding).
        shared_host_pool: local TP ranks share one host mmap (vLLM
            ``use_shared_hisparse_host_pool``); host blocks are then rounded
            up to :attr:`host_block_alignment` bytes.
        host_block_alignment: the shared pool's block alignment (vLLM's
            ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``, the host page size).
    """

    device_buffer_size: int | None = attrs.field(
        default=None, validator=_int_check(1, optional=True, owner="HiSparseConfig")
    )
    index_topk: int | None = attrs.field(
        default=None, validator=_int_check(1, optional=True, owner="HiSparseConfig")
    )
    max_decode_query_len: int = attrs.field(
        default=1, validator=_int_check(1, owner="HiSparseConfig")
    )
    shared_host_pool: bool = attrs.field(default=False, validator=_bool)
    host_block_alignment: int = attrs.field(
        default=4096, validator=_int_check(1, owner="HiSparseConfig")
    )


def _hisparse(value: object) -> HiSparseConfig | None:
    if value is None or isinstance(value, HiSparseConfig):
        return value
    if isinstance(value, Mapping):
        try:
            return HiSparseConfig(**value)
        except TypeError as exc:
            raise ConfigError(f"PlanningConfig.hisparse={dict(value)!r}: {exc}") from None
    raise ConfigError(
        f"PlanningConfig.hisparse={value!r} must be None, a HiSparseConfig or a dict of its fields"
    )


@attrs.frozen(kw_only=True)
class PlanningConfig:
    """What KV cache planning reads from vLLM's config.

    Attributes:
        max_model_len: longest request, in tokens; with ``auto_fit_max_model_len``
            it is the upper bound of the search (vLLM's derived length).
        auto_fit_max_model_len: vLLM's ``original_max_model_len == -1``: shrink
            ``max_model_len`` to what memory allows.
        max_num_batched_tokens: tokens per scheduler step.
        async_scheduling: adds one batch in flight (contract.md#spec-kinds, ``I``).
        max_concurrent_batches: override of the batches in flight; by default
            ``pipeline_parallel_size + 1`` with async scheduling, else the PP size.
        max_num_encoder_input_tokens: cross-attention budget (default: batched tokens).
        num_gpu_blocks_override: a fixed block count (vLLM ``num_gpu_blocks_override``).
        disable_hybrid_kv_cache_manager: promote local attention to full
        (contract.md#hybrid-manager-disabled). kv_cache_layout: the resolved layout the planner
        places tensors in. mamba_cache_mode: ``"none"``, ``"align"`` or ``"all"``.
        decode_context_parallel_size, pipeline_parallel_size, tensor_parallel_size:
            parallel sizes.
        prefix_cache_retention_interval: copied into every config.
        num_prefill_lookahead_tokens: speculative lookahead; sliding windows
            retain ``max(0, n - 1)`` extra tokens (contract.md#core-flow).
        eagle_block_drop: mark groups holding draft layers as EAGLE groups.
        host_resident_layers: layers to keep in a host-resident group.
        host_pool_bytes: bytes of the host pool that backs host-resident groups
            (HiSparse's ``host_pool_gib`` in bytes).
        hisparse: HiSparse sparse-MLA offloading, or ``None`` (off).
        platform_builder_cls: qualname (``module.Class`` or ``module:Class``) of the
            builder the platform selects (vLLM ``get_kv_cache_config_builder_cls``);
            checked at construction.
        model_builder_cls: qualname of a builder the model declares; used when the
            platform names none (see :func:`kvref.get_kv_cache_config_builder`).
        model_kv_cache_grouping: a model-declared grouping (vLLM
            ``SupportsKVCacheGrouping``) the reference builder uses instead of
            its own grouping; it owns every layer's group, so it cannot be
            combined with ``host_resident_layers`` (as vLLM refuses it beside
            HiSparse, its only source of host residency).
        num_hidden_layers: the target's decoder-layer count, layers without a
            KV cache included (vLLM ``hf_config.num_hidden_layers``); ``None``:
            not described.  Planning never reads it; builders may.
        num_draft_layers: draft decoder layers (MTP modules, vLLM
            ``num_nextn_predict_layers``; or the EAGLE / draft model's layers).
        speculative_method: vLLM's ``SpeculativeConfig.method``, one of
            :data:`SPECULATIVE_METHODS`, or ``None`` (no speculative config).
        num_speculative_tokens: vLLM's ``num_speculative_tokens`` (0 without a method).

    With a speculative method the config must be one vLLM could derive:
    ``num_prefill_lookahead_tokens`` is :attr:`derived_prefill_lookahead`
    and the EAGLE block drop needs an EAGLE-style method (``None`` keeps the
    figures free, as before these fields existed).
    """

    max_model_len: int = attrs.field(default=8192, validator=_int_check(1))
    auto_fit_max_model_len: bool = attrs.field(default=False, validator=_bool)
    max_num_batched_tokens: int = attrs.field(default=2048, validator=_int_check(1))
    async_scheduling: bool = attrs.field(default=True, validator=_bool)
    max_concurrent_batches: int | None = attrs.field(
        default=None, validator=_int_check(1, optional=True)
    )
    max_num_encoder_input_tokens: int | None = attrs.field(
        default=None, validator=_int_check(0, optional=True)
    )
    num_gpu_blocks_override: int | None = attrs.field(
        default=None, validator=_int_check(1, optional=True)
    )
    disable_hybrid_kv_cache_manager: bool = attrs.field(default=False, validator=_bool)
    kv_cache_layout: KVCacheLayout = attrs.field(default=KVCacheLayout.LBNHC, converter=_layout)
    mamba_cache_mode: str = attrs.field(default="none", validator=_mamba_mode)
    decode_context_parallel_size: int = attrs.field(default=1, validator=_int_check(1))
    pipeline_parallel_size: int = attrs.field(default=1, validator=_int_check(1))
    tensor_parallel_size: int = attrs.field(default=1, validator=_int_check(1))
    prefix_cache_retention_interval: int = attrs.field(default=0, validator=_int_check(0))
    num_prefill_lookahead_tokens: int = attrs.field(default=0, validator=_int_check(0))
    eagle_block_drop: bool = attrs.field(default=False, validator=_bool)
    host_resident_layers: frozenset[str] = attrs.field(default=frozenset(), converter=_layers)
    host_pool_bytes: int | None = attrs.field(default=None, validator=_int_check(0, optional=True))
    hisparse: HiSparseConfig | None = attrs.field(default=None, converter=_hisparse)
    platform_builder_cls: str | None = attrs.field(default=None, validator=_builder_qualname)
    model_builder_cls: str | None = attrs.field(default=None, validator=_builder_qualname)
    model_kv_cache_grouping: GroupingHook | None = attrs.field(
        default=None, validator=_grouping_hook
    )
    num_hidden_layers: int | None = attrs.field(
        default=None, validator=_int_check(1, optional=True)
    )
    num_draft_layers: int = attrs.field(default=0, validator=_int_check(0))
    speculative_method: str | None = attrs.field(default=None, validator=_speculative_method)
    num_speculative_tokens: int = attrs.field(default=0, validator=_int_check(0))

    def __attrs_post_init__(self) -> None:
        if self.hisparse is not None and self.host_resident_layers:
            raise ConfigError(
                f"PlanningConfig.host_resident_layers={sorted(self.host_resident_layers)} "
                "cannot be combined with PlanningConfig.hisparse: HiSparse decides which "
                "layers live on the host"
            )
        if self.model_kv_cache_grouping is not None and self.host_resident_layers:
            # The declared grouping decides every group, host residency included:
            # the reference would otherwise silently drop the host layers.
            raise ConfigError(
                f"PlanningConfig.host_resident_layers={sorted(self.host_resident_layers)} "
                "cannot be combined with PlanningConfig.model_kv_cache_grouping="
                f"{self.model_kv_cache_grouping!r}: a model-declared grouping owns every "
                "layer's group (vLLM refuses it beside HiSparse); mark host groups in the "
                "declared grouping instead"
            )
        self._check_speculation()

    def _check_speculation(self) -> None:
        method, tokens = self.speculative_method, self.num_speculative_tokens
        if method is None:
            if tokens:
                raise ConfigError(
                    f"PlanningConfig.num_speculative_tokens={tokens} needs a "
                    "PlanningConfig.speculative_method (it is None)"
                )
            return
        if tokens < 1:
            raise ConfigError(
                f"PlanningConfig.num_speculative_tokens={tokens} must be >= 1 with "
                f"PlanningConfig.speculative_method={method!r}"
            )
        if method in DRAFTLESS_METHODS and self.num_draft_layers:
            raise ConfigError(
                f"PlanningConfig.num_draft_layers={self.num_draft_layers} must be 0 with "
                f"PlanningConfig.speculative_method={method!r}, which has no draft model"
            )
        if self.eagle_block_drop and method not in EAGLE_METHODS:
            raise ConfigError(
                f"PlanningConfig.eagle_block_drop=True needs an EAGLE-style "
                f"speculative_method {EAGLE_METHODS}, not {method!r}"
            )
        query = 1 + tokens
        if self.hisparse is not None and self.hisparse.max_decode_query_len != query:
            # vLLM's max_decode_query_len: a verification request of 1 + k tokens.
            raise ConfigError(
                f"HiSparseConfig.max_decode_query_len={self.hisparse.max_decode_query_len} "
                f"must be {query} (1 + PlanningConfig.num_speculative_tokens) with "
                f"PlanningConfig.speculative_method={method!r}"
            )
        derived = self.derived_prefill_lookahead
        if derived is not None and self.num_prefill_lookahead_tokens != derived:
            raise ConfigError(
                f"PlanningConfig.num_prefill_lookahead_tokens={self.num_prefill_lookahead_tokens} "
                f"must be {derived}, what vLLM derives for speculative_method={method!r} with "
                f"num_speculative_tokens={tokens} and num_draft_layers={self.num_draft_layers}"
            )

    @property
    def derived_prefill_lookahead(self) -> int | None:
        """The prefill lookahead vLLM derives from the speculative config (``None``: no method).

        EAGLE-style drafters read the next token (1); a chain of several MTP
        modules reads ``num_speculative_tokens`` ahead (vLLM
        ``use_multi_module_mtp``: ``min(num_nextn_predict_layers,
        num_speculative_tokens) > 1``, the layer count defaulting to 1);
        other methods read nothing ahead (0).
        """
        method = self.speculative_method
        if method is None:
            return None
        if method not in EAGLE_METHODS:
            return 0
        modules = self.num_draft_layers or 1
        if method == "mtp" and min(modules, self.num_speculative_tokens) > 1:
            return self.num_speculative_tokens
        return 1

    @property
    def concurrent_batches(self) -> int:
        """Batches in flight: the override, else PP + 1 with async scheduling, else PP."""
        if self.max_concurrent_batches is not None:
            return self.max_concurrent_batches
        pp = self.pipeline_parallel_size
        return pp + 1 if self.async_scheduling else pp

    @property
    def max_in_flight_tokens(self) -> int:
        """``I``: tokens a request may have in flight beyond its window."""
        return self.concurrent_batches * self.max_num_batched_tokens

    @property
    def encoder_input_tokens(self) -> int:
        """The cross-attention budget (defaults to ``max_num_batched_tokens``)."""
        if self.max_num_encoder_input_tokens is None:
            return self.max_num_batched_tokens
        return self.max_num_encoder_input_tokens

    @property
    def extra_retained_tokens(self) -> int:
        """Tokens every sliding window keeps beyond its window (contract.md#core-flow)."""
        return max(0, self.num_prefill_lookahead_tokens - 1)

    def with_max_model_len(self, max_model_len: int) -> PlanningConfig:
        """A copy with another ``max_model_len`` (auto-fit's search works on copies)."""
        return attrs.evolve(self, max_model_len=max_model_len)
