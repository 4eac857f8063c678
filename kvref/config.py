"""PlanningConfig: the slice of vLLM's ``VllmConfig`` the planner reads.

Defaults are vLLM's for a CUDA-like platform with async scheduling; which vLLM
release the problem plans as is its ``vllm_version`` (:mod:`kvref.versions`).
The config is frozen: Core's auto-fit, which mutates ``max_model_len`` in
place in vLLM, works on evolved copies here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from kvref._config_fields import (
    DRAFTLESS_METHODS,
    EAGLE_METHODS,
    HISPARSE_CONNECTOR_LAYOUT,
    SPECULATIVE_METHODS,
    bool_check,
    builder_qualname,
    cache_dtype_check,
    int_check,
    mamba_mode,
    qualname_parts,
    speculative_method_check,
    to_backends,
    to_connector_layout,
    to_env_layout,
    to_layer_names,
    to_layout,
    to_vllm_version,
)
from kvref.axes import KVCacheLayout
from kvref.backends import (
    AttentionBackend,
    get_supported_kv_cache_layouts,
    preferred_block_size,
)
from kvref.errors import ConfigError, KVRefError
from kvref.hf import HFValue, hf_config_fields
from kvref.layout_resolution import resolve_kv_cache_layout
from kvref.versions import NEWEST, Rules, VllmVersion, rules

if TYPE_CHECKING:
    from kvref.records import KVCacheGroupSpec
    from kvref.specs import KVCacheSpec

__all__ = [
    "DRAFTLESS_METHODS",
    "EAGLE_METHODS",
    "HISPARSE_CONNECTOR_LAYOUT",
    "SPECULATIVE_METHODS",
    "GroupingHook",
    "HiSparseConfig",
    "PlanningConfig",
    "SupportsKVCacheGrouping",
    "qualname_parts",
]


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
        max_decode_query_len: vLLM's ``max_decode_query_len``: 1, or with
            speculative decoding :attr:`PlanningConfig.derived_max_decode_query_len`.
        shared_host_pool: local TP ranks share one host mmap (vLLM
            ``use_shared_hisparse_host_pool``); host blocks are then rounded
            up to :attr:`host_block_alignment` bytes.
        host_block_alignment: the shared pool's block alignment (vLLM's
            ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``, the host page size).
    """

    device_buffer_size: int | None = attrs.field(
        default=None, validator=int_check(1, optional=True, owner="HiSparseConfig")
    )
    index_topk: int | None = attrs.field(
        default=None, validator=int_check(1, optional=True, owner="HiSparseConfig")
    )
    max_decode_query_len: int = attrs.field(
        default=1, validator=int_check(1, owner="HiSparseConfig")
    )
    shared_host_pool: bool = attrs.field(default=False, validator=bool_check)
    host_block_alignment: int = attrs.field(
        default=4096, validator=int_check(1, owner="HiSparseConfig")
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


def _default_layout(config: PlanningConfig) -> KVCacheLayout:
    """The layout of a config that gives none: LBNHC, or a provisional resolution.

    Called by attrs only when ``kv_cache_layout`` is not passed, which is how
    a config knows that planning should resolve its layout from the specs.
    """
    if not config.describes_kv_cache_layout:
        return KVCacheLayout.LBNHC
    # attrs' frozen classes are written this way during __init__ too.
    object.__setattr__(config, "resolves_kv_cache_layout", True)
    try:
        supported = get_supported_kv_cache_layouts(config.attention_backends)
        with warnings.catch_warnings():
            # Provisional: planning warns when it resolves for real.
            warnings.simplefilter("ignore")
            return resolve_kv_cache_layout(
                [supported],
                env_layout=config.env_kv_cache_layout,
                connector_layout=config.required_connector_layout,
            )
    except KVRefError as exc:
        raise ConfigError(f"PlanningConfig: {exc}") from None


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
        (contract.md#hybrid-manager-disabled).
        attention_backends: the attention backends and the layers each runs
            (:class:`~kvref.backends.AttentionBackend`: supported layouts and kernel
            block sizes); ``()``: vLLM's base backend everywhere.
        block_size: the cache block size the deployment gives (vLLM ``--block-size``),
            or ``None``: not given, vLLM picks it from the attention backends
            (:attr:`resolved_block_size`).  Planning reads the specs' block sizes;
            this is what a caller builds the specs with.
        kv_connector_layout: the layout the KV connector requires (vLLM
            ``get_required_kvcache_layout``; ``NHD``/``HND`` accepted), or ``None``.
            HiSparse's connector requires :data:`HISPARSE_CONNECTOR_LAYOUT`, which a
            config with :attr:`hisparse` requires without it
            (:attr:`required_connector_layout`).
        env_kv_cache_layout: the ``VLLM_KV_CACHE_LAYOUT`` override, or ``None``
            (planning never reads the environment).
        kv_cache_layout: the layout the planner places tensors in.  Given, it is
            used as is (vLLM: a layout set on the cache config wins outright).
            Not given, it is LBNHC for a config that describes no backend,
            connector (HiSparse's included) or override; otherwise planning resolves it from the
            workers' specs as vLLM's Core does (:mod:`kvref.layout_resolution`),
            and until then it holds the resolution without specs.
        resolves_kv_cache_layout: (not an argument) whether planning resolves the
            layout: none was given and the config describes what resolution reads.
        mamba_cache_mode: ``"none"``, ``"align"`` or ``"all"``.
        decode_context_parallel_size, pipeline_parallel_size, tensor_parallel_size:
            parallel sizes.
        prefix_cache_retention_interval: copied into every config: the tokens
            between retained sliding-window and Mamba prefix-cache checkpoints
            (0: only the semantic ones; ``None``: densely, as in vLLM).
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
        hf_config: the model's Hugging Face config fields a builder may read
            (vLLM ``model_config.hf_config``: ``model_type``, ``architectures``,
            ``kv_lora_rank``...; :mod:`kvref.hf`), as sorted ``(name, value)``
            pairs; a mapping is accepted.  Planning never reads them; builders may.
            The layer counts are :attr:`num_hidden_layers` and :attr:`num_draft_layers`.
        cache_dtype: vLLM's ``cache_config.cache_dtype`` (``"auto"``,
            ``"fp8_ds_mla"``...): the specs carry each layer's own dtype, which
            planning reads; builders may read this one.
        vllm_version: the vLLM release whose planning rules apply
            (:mod:`kvref.versions`; ``"0.34"``, ``"0.34.0"`` or a
            :class:`~kvref.versions.VllmVersion`; default: the newest supported).

    With a speculative method the config must be one vLLM could derive:
    ``num_prefill_lookahead_tokens`` is :attr:`derived_prefill_lookahead`
    and the EAGLE block drop needs an EAGLE-style method (``None`` keeps the
    figures free, as before these fields existed).
    """

    max_model_len: int = attrs.field(default=8192, validator=int_check(1))
    auto_fit_max_model_len: bool = attrs.field(default=False, validator=bool_check)
    max_num_batched_tokens: int = attrs.field(default=2048, validator=int_check(1))
    async_scheduling: bool = attrs.field(default=True, validator=bool_check)
    max_concurrent_batches: int | None = attrs.field(
        default=None, validator=int_check(1, optional=True)
    )
    max_num_encoder_input_tokens: int | None = attrs.field(
        default=None, validator=int_check(0, optional=True)
    )
    num_gpu_blocks_override: int | None = attrs.field(
        default=None, validator=int_check(1, optional=True)
    )
    disable_hybrid_kv_cache_manager: bool = attrs.field(default=False, validator=bool_check)
    attention_backends: tuple[AttentionBackend, ...] = attrs.field(
        default=(), converter=to_backends
    )
    block_size: int | None = attrs.field(default=None, validator=int_check(1, optional=True))
    kv_connector_layout: KVCacheLayout | None = attrs.field(
        default=None, converter=to_connector_layout
    )
    env_kv_cache_layout: KVCacheLayout | None = attrs.field(default=None, converter=to_env_layout)
    # Before kv_cache_layout, whose default reads it (HiSparse's connector layout).
    hisparse: HiSparseConfig | None = attrs.field(default=None, converter=_hisparse)
    # Set by _default_layout; before kv_cache_layout so that its default runs first.
    resolves_kv_cache_layout: bool = attrs.field(default=False, init=False, repr=False)
    kv_cache_layout: KVCacheLayout = attrs.field(
        default=attrs.Factory(_default_layout, takes_self=True), converter=to_layout
    )
    mamba_cache_mode: str = attrs.field(default="none", validator=mamba_mode)
    decode_context_parallel_size: int = attrs.field(default=1, validator=int_check(1))
    pipeline_parallel_size: int = attrs.field(default=1, validator=int_check(1))
    tensor_parallel_size: int = attrs.field(default=1, validator=int_check(1))
    prefix_cache_retention_interval: int | None = attrs.field(
        default=0, validator=int_check(0, optional=True)
    )
    num_prefill_lookahead_tokens: int = attrs.field(default=0, validator=int_check(0))
    eagle_block_drop: bool = attrs.field(default=False, validator=bool_check)
    host_resident_layers: frozenset[str] = attrs.field(
        default=frozenset(), converter=to_layer_names
    )
    host_pool_bytes: int | None = attrs.field(default=None, validator=int_check(0, optional=True))
    platform_builder_cls: str | None = attrs.field(default=None, validator=builder_qualname)
    model_builder_cls: str | None = attrs.field(default=None, validator=builder_qualname)
    model_kv_cache_grouping: GroupingHook | None = attrs.field(
        default=None, validator=_grouping_hook
    )
    num_hidden_layers: int | None = attrs.field(default=None, validator=int_check(1, optional=True))
    num_draft_layers: int = attrs.field(default=0, validator=int_check(0))
    speculative_method: str | None = attrs.field(default=None, validator=speculative_method_check)
    num_speculative_tokens: int = attrs.field(default=0, validator=int_check(0))
    hf_config: tuple[tuple[str, HFValue], ...] = attrs.field(default=(), converter=hf_config_fields)
    cache_dtype: str = attrs.field(default="auto", validator=cache_dtype_check)
    vllm_version: VllmVersion = attrs.field(default=NEWEST, converter=to_vllm_version)

    @property
    def rules(self) -> Rules:
        """The planning rules of :attr:`vllm_version` (:mod:`kvref.versions`)."""
        return rules(self.vllm_version)

    def hf(self, name: str, default: HFValue = None) -> HFValue:
        """The model's Hugging Face config field ``name`` (``default`` when not described)."""
        return dict(self.hf_config).get(name, default)

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
        if self.hisparse is not None and self.kv_connector_layout not in (
            None,
            HISPARSE_CONNECTOR_LAYOUT,
        ):
            # HiSparse runs through its own connector: a second one that needs another
            # layout is vLLM's MultiConnector "KV cache layout mismatch".
            raise ConfigError(
                f"PlanningConfig.kv_connector_layout={self.kv_connector_layout.name} contradicts "
                f"PlanningConfig.hisparse: HiSparse's connector requires "
                f"{HISPARSE_CONNECTOR_LAYOUT.name}"
            )
        self._check_speculation()

    @property
    def describes_kv_cache_layout(self) -> bool:
        """Whether the config describes what vLLM's layout resolution reads."""
        return bool(
            self.attention_backends
            or self.required_connector_layout is not None
            or self.env_kv_cache_layout is not None
        )

    @property
    def required_connector_layout(self) -> KVCacheLayout | None:
        """The layout the KV connectors require: :attr:`kv_connector_layout`, else HiSparse's.

        HiSparse runs through vLLM's ``HiSparseConnector``, whose
        ``get_required_kvcache_layout`` is :data:`HISPARSE_CONNECTOR_LAYOUT`, so
        a config with :attr:`hisparse` requires it without saying so.
        """
        if self.kv_connector_layout is None and self.hisparse is not None:
            return HISPARSE_CONNECTOR_LAYOUT
        return self.kv_connector_layout

    @property
    def resolved_block_size(self) -> int:
        """The cache block size the deployment runs with: :attr:`block_size`, else vLLM's pick.

        Not given, vLLM asks the attention backends, starting from the
        release's default (:attr:`Rules.default_block_size
        <kvref.versions.Rules.default_block_size>`):
        :func:`kvref.backends.preferred_block_size`.  vLLM's later alignment of
        hybrid (Mamba) models and of mixed KV cache dtypes is not modelled:
        the specs carry those block sizes.
        """
        if self.block_size is not None:
            return self.block_size
        return preferred_block_size(self.attention_backends, self.rules.default_block_size)

    def backends_of(self, layer_names: Iterable[str]) -> list[AttentionBackend]:
        """The described backends that run some of ``layer_names``, in config order.

        A backend that names no layers runs every layer no other backend names.
        """
        names = set(layer_names)
        named: set[str] = set().union(*(b.layers for b in self.attention_backends))
        return [
            b
            for b in self.attention_backends
            if b.layers & names or (not b.layers and bool(names - named))
        ]

    def with_resolved_layout(
        self, kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]]
    ) -> PlanningConfig:
        """This config with the layout vLLM's Core resolves for these workers' specs.

        Unchanged unless :attr:`resolves_kv_cache_layout`.  Each worker reports
        the layouts all backends of its layers support.

        Raises:
            LayoutResolutionError: the requirements contradict each other
                (see :func:`kvref.layout_resolution.resolve_kv_cache_layout`).
        """
        if not self.resolves_kv_cache_layout:
            return self
        layout = resolve_kv_cache_layout(
            [get_supported_kv_cache_layouts(self.backends_of(w)) for w in kv_cache_specs],
            [spec for worker in kv_cache_specs for spec in worker.values()],
            env_layout=self.env_kv_cache_layout,
            connector_layout=self.required_connector_layout,
        )
        return attrs.evolve(self, kv_cache_layout=layout)

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
        query = self.derived_max_decode_query_len
        if self.hisparse is not None and self.hisparse.max_decode_query_len != query:
            slot = " + 1 drafter slot" if query > 1 + tokens else ""
            raise ConfigError(
                f"HiSparseConfig.max_decode_query_len={self.hisparse.max_decode_query_len} "
                f"must be {query} (1 + PlanningConfig.num_speculative_tokens{slot}) with "
                f"PlanningConfig.speculative_method={method!r} under vLLM {self.vllm_version}"
            )
        derived = self.derived_prefill_lookahead
        if derived is not None and self.num_prefill_lookahead_tokens != derived:
            raise ConfigError(
                f"PlanningConfig.num_prefill_lookahead_tokens={self.num_prefill_lookahead_tokens} "
                f"must be {derived}, what vLLM derives for speculative_method={method!r} with "
                f"num_speculative_tokens={tokens} and num_draft_layers={self.num_draft_layers}"
            )

    @property
    def derived_max_decode_query_len(self) -> int:
        """The decode query length vLLM derives: 1 + ``num_speculative_tokens`` + drafter slots.

        1 without a speculative method.  Under vLLM 0.34.0 a draft model adds
        one slot (``max_num_new_slots_for_drafting``: its autoregressive input
        keeps one unsliced token); vLLM 0.33.0 adds none.
        """
        if self.speculative_method is None:
            return 1
        slot = self.rules.drafter_decode_slot and self.speculative_method == "draft_model"
        return 1 + self.num_speculative_tokens + int(slot)

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

    def with_vllm_version(self, version: object) -> PlanningConfig:
        """A copy planned as another vLLM release (anything :func:`parse_version` accepts).

        Unlike a bare ``attrs.evolve``, the copy still resolves its layout from
        the specs when this config does.
        """
        copy = attrs.evolve(self, vllm_version=version)
        object.__setattr__(copy, "resolves_kv_cache_layout", self.resolves_kv_cache_layout)
        return copy

    def with_max_model_len(self, max_model_len: int) -> PlanningConfig:
        """A copy with another ``max_model_len`` (auto-fit's search works on copies)."""
        return attrs.evolve(self, max_model_len=max_model_len)
