"""Models that bring planning settings of their own: HiSparse and model-declared grouping.

Most families describe only the layers a model reports.  Two properties of
a deployment live in the planning config instead, and only make sense for
models of a certain shape:

- **HiSparse** (contract.md#hisparse): a DeepSeek-V3.2-style sparse-MLA
  model served with its sparse-MLA source KV in a pinned host pool.  The
  config turns it on with :class:`~kvref.config.HiSparseConfig`, a host
  pool large enough for one request of ``max_model_len`` tokens on every
  worker, and a block-outermost layout (HiSparse's hot and resident caches
  have no per-layer views); every worker reports HiSparse's derived
  resident and hot layers next to its MLA layers, as vLLM's worker does.
- **A model-declared grouping** (vLLM's ``SupportsKVCacheGrouping``): the
  config carries the model's own grouping, which a builder that keeps
  vLLM's default behaviour honours before its own.
- **A layout the deployment fixes** (a vendor model served with one
  ``kv_cache_layout``): every problem of the model uses it.

:class:`ExtendedModel` carries them; :func:`apply_model_extras` turns a
drawn config and pipeline split into the problem's, once ``max_model_len``
is known.  A plain :class:`~conformance.generate.records.Model` passes
through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import strategies as st

from conformance.check.geometry import cdiv, round_up
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from kvref.config import GroupingHook, HiSparseConfig, PlanningConfig
from kvref.errors import GroupingError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs

__all__ = [
    "DeclaredGroups",
    "ExtendedModel",
    "ModelExtras",
    "RunsOfKindGrouping",
    "apply_model_extras",
    "hisparse_source_layers",
]

#: The block-outermost layouts HiSparse may use, in vLLM's preference order.
_BLOCK_OUTER = (KVCacheLayout.BLNHC, KVCacheLayout.BLHNC, KVCacheLayout.BHLNC)


@attrs.frozen(kw_only=True)
class RunsOfKindGrouping:
    """A model-declared grouping: runs of equal specs, at most ``max_layers`` layers per group.

    Stands for a model implementing vLLM's ``SupportsKVCacheGrouping`` (none
    does in vLLM 0.33.0; the protocol is for out-of-tree models) that keeps
    each kind of layer in block tables of a bounded size.  It works on
    whatever layers it is given (all workers' or one worker's), as the
    protocol requires, and every group it makes is a merge of equal specs.

    Attributes:
        max_layers: the most layers one group holds (>= 1).
    """

    max_layers: int = attrs.field()

    @max_layers.validator
    def _check(self, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"RunsOfKindGrouping.max_layers={value!r} must be an int >= 1")

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Equal specs, in first-seen order, cut into runs of at most ``max_layers`` layers."""
        by_spec: dict[KVCacheSpec, list[str]] = {}
        for name, spec in kv_cache_spec.items():
            by_spec.setdefault(spec, []).append(name)
        groups = []
        for spec, names in by_spec.items():
            for start in range(0, len(names), self.max_layers):
                run = names[start : start + self.max_layers]
                merged = type(spec).merge([kv_cache_spec[n] for n in run])
                groups.append(KVCacheGroupSpec(layer_names=tuple(run), kv_cache_spec=merged))
        return groups


def _group_names(value: object) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"DeclaredGroups.groups={value!r} must be a non-empty list of name lists")
    out = []
    for names in value:
        if (
            not isinstance(names, (list, tuple))
            or not names
            or not all(isinstance(n, str) and n for n in names)
        ):
            raise ValueError(
                f"DeclaredGroups.groups: {names!r} must be a non-empty list of layer names"
            )
        out.append(tuple(names))
    flat = [n for names in out for n in names]
    if len(set(flat)) < len(flat):
        twice = sorted({n for n in flat if flat.count(n) > 1})
        raise ValueError(f"DeclaredGroups.groups names {twice} in more than one group")
    return tuple(out)


@attrs.frozen(kw_only=True)
class DeclaredGroups:
    """A model-declared grouping given as its groups' layer names (a vendor's dumped grouping).

    On a pipeline stage (a subset of the layers) each group keeps the layers
    the stage has; groups with none are left out.  A group whose specs are
    equal merges them (``type(spec).merge``); one of several specs of one
    type and block size is a uniform-type group.

    Attributes:
        groups: each group's layer names, in the model's group order.
    """

    groups: tuple[tuple[str, ...], ...] = attrs.field(converter=_group_names)

    def renamed(self, names: Mapping[str, Sequence[str]]) -> DeclaredGroups:
        """The grouping after layers were renamed (``old -> new names``, several for a copy)."""
        return DeclaredGroups(
            groups=tuple(
                tuple(new for old in group for new in names.get(old, (old,)))
                for group in self.groups
                if any(names.get(old, (old,)) for old in group)
            )
        )

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """The declared groups restricted to ``kv_cache_spec``'s layers, in declared order.

        Raises:
            GroupingError: a group's specs neither merge nor form one uniform-type group.
        """
        groups = []
        for declared in self.groups:
            names = tuple(n for n in declared if n in kv_cache_spec)
            if not names:
                continue
            specs = [kv_cache_spec[n] for n in names]
            if all(s == specs[0] for s in specs):
                merged: KVCacheSpec | UniformTypeKVCacheSpecs = type(specs[0]).merge(specs)
            else:
                uniform = UniformTypeKVCacheSpecs.from_specs({n: kv_cache_spec[n] for n in names})
                if uniform is None:
                    raise GroupingError(
                        f"DeclaredGroups: the layers {list(names)} are not of one type and one "
                        "block size: they cannot share a group"
                    )
                merged = uniform
            groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=merged))
        return groups


@attrs.frozen(kw_only=True)
class ModelExtras:
    """Planning settings a model brings.

    Attributes:
        hisparse: HiSparse's settings (``None``: HiSparse off).
        host_pool_slack: with HiSparse, how many requests beyond the first the
            host pool holds (the pool is sized once ``max_model_len`` is drawn).
        kv_cache_grouping: the model's declared grouping (``None``: none):
            :class:`RunsOfKindGrouping`, :class:`DeclaredGroups` or a vendor's
            own ``SupportsKVCacheGrouping`` object.
        kv_cache_layout: the layout every problem of the model uses
            (``None``: drawn from the layouts vLLM could resolve).
    """

    hisparse: HiSparseConfig | None = None
    host_pool_slack: int = 0
    kv_cache_grouping: GroupingHook | None = None
    kv_cache_layout: KVCacheLayout | None = None


@attrs.frozen(repr=False)
class ExtendedModel(Model):
    """A :class:`~conformance.generate.records.Model` with planning settings of its own.

    Attributes:
        extras: what the problem's config must carry for this model.
    """

    extras: ModelExtras = attrs.field(factory=ModelExtras, kw_only=True)


def hisparse_source_layers(specs: Mapping[str, KVCacheSpec]) -> list[str]:
    """The layers HiSparse keeps on the host: sparse-MLA layers (``cache_role == "SPARSE"``)."""
    return [
        n for n, s in specs.items() if isinstance(s, MLAAttentionSpec) and s.cache_role == "SPARSE"
    ]


def _host_stride(specs: Mapping[str, KVCacheSpec], settings: HiSparseConfig) -> int:
    # One host block holds a block of every source layer of the worker.
    stride = sum(specs[n].page_size_bytes for n in hisparse_source_layers(specs))
    if settings.shared_host_pool:
        stride = round_up(stride, settings.host_block_alignment)
    return stride


def _block_size(specs: Mapping[str, KVCacheSpec]) -> int:
    sizes = {s.block_size for n, s in specs.items() if isinstance(s, MLAAttentionSpec)}
    return max(sizes, default=1)


def draw_model_extras(
    draw: st.DrawFn,
    model: Model,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
) -> tuple[PlanningConfig, list[dict[str, KVCacheSpec]]]:
    """One draw of :func:`apply_model_extras`, made with the caller's ``draw``."""
    from kvref.errors import HiSparseError
    from kvref.hisparse import resolve_hisparse_specs

    out = [dict(w) for w in workers]
    if not isinstance(model, ExtendedModel):
        return config, out
    extras = model.extras
    changes: dict[str, Any] = {}
    if extras.kv_cache_grouping is not None:
        changes["model_kv_cache_grouping"] = extras.kv_cache_grouping
    if extras.kv_cache_layout is not None:
        changes["kv_cache_layout"] = extras.kv_cache_layout
    if extras.hisparse is not None:
        settings = extras.hisparse
        # The pool must hold one request plus the null block and a
        # copy-on-write tail even for all workers' source layers at once (the
        # kit also plans the merged model, as single-worker scenarios do).
        stride = _host_stride(model.specs, settings)
        need = cdiv(config.max_model_len, _block_size(model.specs)) + 2
        blocks = need * (1 + extras.host_pool_slack) + draw(st.integers(0, need))
        layout = changes.get("kv_cache_layout", config.kv_cache_layout)
        if not layout.is_block_outermost:
            layout = pick(draw, _BLOCK_OUTER[:2])
        changes.update(
            hisparse=settings,
            host_pool_bytes=blocks * stride + draw(st.integers(0, max(0, stride - 1))),
            host_resident_layers=frozenset(),
            kv_cache_layout=layout,
            # HiSparse's derived caches are not of one type with the latents.
            disable_hybrid_kv_cache_manager=False,
        )
    config = attrs.evolve(config, **changes) if changes else config
    if config.hisparse is not None:
        try:
            # vLLM's worker reports HiSparse's derived layers with its own.
            out = [resolve_hisparse_specs(config, w) for w in out]
        except HiSparseError:
            # A pipeline stage of index-group followers without their leader's
            # indexer: vLLM refuses to serve such a split.
            hypothesis.reject()
    return config, out


_apply = st.composite(draw_model_extras)


def apply_model_extras(
    model: Model, config: PlanningConfig, workers: Sequence[Mapping[str, KVCacheSpec]]
) -> st.SearchStrategy[tuple[PlanningConfig, list[dict[str, KVCacheSpec]]]]:
    """The problem's config and workers once ``model``'s own settings are applied.

    For an :class:`ExtendedModel`: the declared grouping goes into
    ``model_kv_cache_grouping``; HiSparse turns on with a host pool of at
    least ``cdiv(max_model_len, block_size) + 2`` host blocks (times
    ``1 + host_pool_slack``, plus some) of all workers' source layers, no
    other host-resident layers, the hybrid manager on, a block-outermost
    layout, and every worker's derived HiSparse layers added; a declared
    ``kv_cache_layout`` replaces the drawn one.  Other models: unchanged.
    """
    return _apply(model, config, workers)
