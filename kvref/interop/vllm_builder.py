"""The reference as a builder vLLM runs: ``KvrefKVCacheConfigBuilder``.

vLLM's Core asks the current platform for the qualname of its KV cache config
builder (``Platform.get_kv_cache_config_builder_cls``) and calls the hooks of
a fresh instance with the real ``VllmConfig`` and vLLM's own spec and record
classes.  :class:`KvrefKVCacheConfigBuilder` is a subclass of vLLM's
``KVCacheConfigBuilder`` whose hooks read the ``VllmConfig`` as a
:class:`~kvref.config.PlanningConfig` (:mod:`kvref.interop.vllm_reading`),
convert vLLM's specs and groups to kvref's, run kvref's reference for the
installed vLLM release, and hand back vLLM's records::

    class MyPlatform(Platform):
        @classmethod
        def get_kv_cache_config_builder_cls(cls, vllm_config):
            return "kvref.interop.vllm_builder.KvrefKVCacheConfigBuilder"

vLLM is optional: this module imports it only when the class is first asked
for (``from kvref.interop.vllm_builder import KvrefKVCacheConfigBuilder``,
or vLLM resolving the qualname).  A platform specialises it by subclassing
and calling ``super()`` for what it leaves to kvref (docs/platforms.md).

What it does as vLLM's default builder does, and what it does not:

- ``_get_pool_bytes_per_block`` is vLLM's default (``None``: Core probes a
  one-block placement, whose single device backing is the reference's), unless
  :attr:`~KvrefHooks.kvref_builder` names a kvref builder that declares its
  pool bytes, which is then asked.
- Failures are kvref's typed errors (``ValueError`` subclasses, which vLLM's
  Core takes for "does not fit" where it probes); the three that vLLM raises
  as another built-in type are also of that type (:data:`VLLM_ERROR_TYPES`).
- The warnings vLLM's grouping logs (the full-allocation fallback, the
  disabled hybrid manager) are logged through vLLM's planning logger, in vLLM's words.
- The specs dict is never rewritten (kvref's inputs are never mutated;
  vLLM's default rewrites promoted specs in place, which its Core never reads back).
- Where kvref deliberately differs from vLLM (docs/contract.md#deliberate-differences),
  so does this builder.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import attrs

from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import (
    IncompatibleSpecsError,
    KVRefError,
    PageSizeUnificationError,
    PartitionError,
    UnsupportedError,
)
from kvref.interop.vllm_convert import (
    VLLMOutputError,
    config_to_vllm,
    groups_from_vllm,
    groups_to_vllm,
    layer_spec_from_vllm,
    vllm_modules,
)
from kvref.interop.vllm_reading import VllmReading, read_vllm_config
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    KVCacheSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvref.versions import SUPPORTED, installed_vllm_version

__all__ = [
    "QUALNAME",
    "VLLM_ERROR_TYPES",
    "KvrefHooks",
    "KvrefKVCacheConfigBuilder",
    "VllmIncompatibleSpecsError",
    "VllmPageSizeUnificationError",
    "VllmPartitionError",
    "builder_class",
]

#: The qualname a platform returns from ``get_kv_cache_config_builder_cls``.
QUALNAME = "kvref.interop.vllm_builder.KvrefKVCacheConfigBuilder"

#: vLLM's planning fallback warning (its tests assert its wording).
FALLBACK_WARNING = (
    "KV cache page sizes cannot be unified; treating sliding-window "
    "layers as full attention for cache allocation. Sliding-window "
    "attention compute is unchanged."
)
#: vLLM's warning when the hybrid manager is off and local layers are promoted.
HYBRID_DISABLED_WARNING = (
    "Hybrid KV cache manager is disabled for this hybrid model, "
    "This means we do not enable any optimizations for saving KV cache "
    "memory (e.g., dropping the KV cache outside the sliding window). "
    "The compute of layers like sliding window is still saved."
)


class VllmPageSizeUnificationError(PageSizeUnificationError, NotImplementedError):
    """Pages cannot be unified: kvref's error, and vLLM's ``NotImplementedError``."""


class VllmIncompatibleSpecsError(IncompatibleSpecsError, AssertionError):
    """Specs cannot be merged: kvref's error, and the ``AssertionError`` of vLLM's ``merge``."""


class VllmPartitionError(PartitionError, AssertionError):
    """Groups do not partition the layers: kvref's error, and vLLM's Core ``AssertionError``."""


#: kvref's errors that vLLM raises as another built-in type, and the error
#: this builder raises instead: a subclass of both, so that a caller written
#: against vLLM's default (``except NotImplementedError``) and one written
#: against kvref (``except PageSizeUnificationError``) both catch it.
VLLM_ERROR_TYPES: Mapping[type[KVRefError], type[KVRefError]] = {
    PageSizeUnificationError: VllmPageSizeUnificationError,
    IncompatibleSpecsError: VllmIncompatibleSpecsError,
    PartitionError: VllmPartitionError,
}


@contextmanager
def _as_vllm_raises() -> Iterator[None]:
    """Re-raise kvref's errors that vLLM raises as another type as both types.

    See :data:`VLLM_ERROR_TYPES`.
    """
    try:
        yield
    except KVRefError as exc:
        for kvref_type, both in VLLM_ERROR_TYPES.items():
            if isinstance(exc, kvref_type) and not isinstance(exc, both):
                raise both(*exc.args) from exc
        raise


def _logger() -> logging.Logger:
    """The logger of vLLM's planning module: the warnings read as vLLM's own, where they go."""
    kvp = vllm_modules().kvp
    found = getattr(kvp, "logger", None)
    return found if isinstance(found, logging.Logger) else logging.getLogger(kvp.__name__)


_LOCAL = (SlidingWindowSpec, SlidingWindowMLASpec, ChunkedLocalAttentionSpec)


def _log_promotions(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec], groups: list[KVCacheGroupSpec]
) -> None:
    """Log vLLM's warning where grouping gave local-attention layers a full-attention page."""
    promoted = False
    for group in groups:
        for name, spec in group.layer_specs():
            given = specs.get(name)
            if isinstance(given, _LOCAL) and not isinstance(spec, _LOCAL):
                promoted = True
                break
    if not promoted:
        return
    if config.disable_hybrid_kv_cache_manager:
        _logger().warning(HYBRID_DISABLED_WARNING)
    else:
        _logger().warning(FALLBACK_WARNING)


@functools.lru_cache(maxsize=1)
def _version_note() -> None:
    """Warn once when the installed vLLM is not a release kvref follows."""
    if installed_vllm_version() is None:
        names = ", ".join(str(v) for v in SUPPORTED)
        _logger().warning(
            "kvref's KV cache builder follows vLLM %s; the installed vLLM is none of "
            "them, so it plans as vLLM %s",
            names,
            SUPPORTED[-1],
        )


def _pool_bytes_forwarder(
    self: KvrefHooks, vllm_config: Any, kv_cache_groups: list[Any]
) -> int | None:
    """Ask :attr:`KvrefHooks.kvref_builder` for its pool bytes (it declares them)."""
    reading = self.read_config(vllm_config)
    groups = groups_from_vllm(list(kv_cache_groups))
    with _as_vllm_raises():
        return self.kvref_builder()._get_pool_bytes_per_block(reading.config, groups)


class KvrefHooks:
    """The hooks of :class:`KvrefKVCacheConfigBuilder` (a mixin over vLLM's builder interface).

    Attributes:
        kvref_builder: the kvref builder class whose answers the hooks hand to
            vLLM (default: :class:`~kvref.builder.ReferenceKVCacheConfigBuilder`).
            A subclass may name its own kvref-native builder here.
    """

    kvref_builder: ClassVar[type[KVCacheConfigBuilder]] = ReferenceKVCacheConfigBuilder

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # vLLM's default means "Core probes"; a kvref builder that declares its
        # pool bytes is asked, unless the vLLM-side class answers itself.
        base = vllm_modules().builder_module.KVCacheConfigBuilder._get_pool_bytes_per_block
        declares = (
            cls.kvref_builder._get_pool_bytes_per_block
            is not KVCacheConfigBuilder._get_pool_bytes_per_block
        )
        current = getattr(cls, "_get_pool_bytes_per_block", base)
        if declares and current is base:
            setattr(cls, "_get_pool_bytes_per_block", _pool_bytes_forwarder)  # noqa: B010
        elif not declares and current is _pool_bytes_forwarder:
            setattr(cls, "_get_pool_bytes_per_block", base)  # noqa: B010

    def read_config(self, vllm_config: Any) -> VllmReading:
        """``vllm_config`` as kvref plans it, and the fields a partial config lacks."""
        _version_note()
        return read_vllm_config(vllm_config)

    def planning_config(self, vllm_config: Any) -> PlanningConfig:
        """The :class:`~kvref.config.PlanningConfig` the hooks plan with (for subclasses)."""
        return self.read_config(vllm_config).config

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        """The kvref builder's grouping of vLLM's specs, as vLLM groups.

        ``kv_cache_spec`` is not rewritten.

        Raises:
            KVRefError: kvref refuses the specs or the config (a subclass of
                vLLM's own type where :data:`VLLM_ERROR_TYPES` says so).
            UnsupportedError: a spec is of a class kvref does not model.
            Exception: a partial config lacks what grouping needs: what vLLM raised reading it.
        """
        reading = self.read_config(vllm_config)
        specs = _specs_from_vllm(kv_cache_spec)
        builder = self.kvref_builder()
        with _as_vllm_raises():
            groups = builder.get_kv_cache_groups(reading.config, specs)
            if "kv_cache_layout" in reading.unread:
                _check_layout_free(reading, builder, specs, groups)
        _log_promotions(reading.config, specs, groups)
        return groups_to_vllm(groups)

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        """The kvref builder's placement of vLLM's groups for exactly ``num_blocks`` blocks.

        The config holds the caller's own group list (as vLLM's default's does)
        where kvref echoes it unchanged, which is always.

        Raises:
            KVRefError: kvref refuses the groups, the block count or the config.
            Exception: a partial config lacks what placement needs (the layout,
                HiSparse's host pool): what vLLM raised reading it.
        """
        reading = self.read_config(vllm_config)
        config = reading.config
        if kv_cache_groups:
            reading.require("kv_cache_layout")
        if config.hisparse is not None and kv_cache_groups:
            reading.require("max_model_len", "host_pool_bytes", "hisparse.shared_host_pool")
        try:
            groups = groups_from_vllm(list(kv_cache_groups))
        except VLLMOutputError as exc:
            raise UnsupportedError(f"kvref cannot represent vLLM's groups: {exc}") from exc
        with _as_vllm_raises():
            placed = self.kvref_builder().get_kv_cache_config_from_groups(
                config, groups, num_blocks
            )
        return _config_to_vllm(placed, groups, kv_cache_groups)


def _specs_from_vllm(kv_cache_spec: Mapping[str, Any]) -> dict[str, KVCacheSpec]:
    try:
        return {name: layer_spec_from_vllm(spec) for name, spec in kv_cache_spec.items()}
    except VLLMOutputError as exc:
        raise UnsupportedError(f"kvref cannot represent vLLM's specs: {exc}") from exc


def _check_layout_free(
    reading: VllmReading,
    builder: KVCacheConfigBuilder,
    specs: Mapping[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
) -> None:
    """Raise vLLM's unresolved-layout error where the grouping depends on the layout.

    vLLM's grouping reads the layout only on its packed path; a config
    without one fails there and nowhere else.  The grouping depends on the
    layout exactly where a block-outermost one gives another answer than the
    layer-outer default it was computed with.
    """
    other = attrs.evolve(reading.config, kv_cache_layout=KVCacheLayout.BLHNC)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if builder.get_kv_cache_groups(other, specs) != groups:
            reading.require("kv_cache_layout")


def _config_to_vllm(placed: KVCacheConfig, groups: list[KVCacheGroupSpec], given: list[Any]) -> Any:
    """The vLLM config of ``placed``, holding the caller's ``given`` groups where echoed."""
    converted = config_to_vllm(placed)
    if list(placed.kv_cache_groups) == groups:
        converted.kv_cache_groups = given
    return converted


def _make_class() -> type[Any]:
    """Subclass vLLM's ``KVCacheConfigBuilder`` with :class:`KvrefHooks` (imports vLLM)."""
    base = vllm_modules().builder_module.KVCacheConfigBuilder
    namespace = {
        "__module__": __name__,
        "__qualname__": "KvrefKVCacheConfigBuilder",
        "__doc__": (
            "kvref's reference KV cache planning as a vLLM ``KVCacheConfigBuilder``.\n\n"
            "Name it from a platform's ``get_kv_cache_config_builder_cls`` as\n"
            f"``{QUALNAME}``, or subclass it and call ``super()`` for what the\n"
            "subclass leaves to kvref (see :mod:`kvref.interop.vllm_builder`)."
        ),
    }
    cls: type[Any] = type("KvrefKVCacheConfigBuilder", (KvrefHooks, base), namespace)
    return cls


@functools.lru_cache(maxsize=1)
def builder_class() -> type[Any]:
    """:class:`KvrefKVCacheConfigBuilder`, made on first use (vLLM is imported then).

    Raises:
        VLLMUnavailableError: vLLM cannot be imported (the message says how to install it).
    """
    return _make_class()


def __getattr__(name: str) -> Any:
    # PEP 562: the class exists only once vLLM is imported, so it is made when
    # first named (an import, vLLM's resolve_obj_by_qualname, pickle).
    if name == "KvrefKVCacheConfigBuilder":
        return builder_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


KvrefKVCacheConfigBuilder: type[Any]
