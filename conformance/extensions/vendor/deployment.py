"""A vendor model's deployment: what it is served with besides its layers.

The planner reads more of a deployment than the layers' specs: the
speculative config (method and tokens), HiSparse's settings, a grouping the
model declares (vLLM's ``SupportsKVCacheGrouping``) and the KV cache layout.
A vendor model keeps every one of them (:func:`deployed`), whether it comes
as a Python object (:func:`deployment_of` reads a
:class:`~conformance.generate.families.drafts.SpeculativeModel` or an
:class:`~conformance.generate.families.extras.ExtendedModel`) or from a
``kvref-models/1`` file (:func:`json_deployment`), validated with errors that
name the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from conformance.generate.families.drafts import SpeculativeModel
from conformance.generate.families.extras import (
    DeclaredGroups,
    ExtendedModel,
    ModelExtras,
    RunsOfKindGrouping,
    hisparse_source_layers,
)
from conformance.generate.layouts import allowed_layouts
from conformance.generate.problems import model_config_fields
from conformance.generate.records import Model
from kvref.config import HiSparseConfig, PlanningConfig, SupportsKVCacheGrouping
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout

__all__ = [
    "DEPLOYMENT_FIELDS",
    "DeployedModel",
    "DeploymentError",
    "deployed",
    "deployment_of",
    "json_deployment",
    "renamed_deployment",
]

#: The deployment fields of a model (keyword arguments of :func:`deployed`, JSON keys).
DEPLOYMENT_FIELDS = (
    "speculative_method",
    "num_speculative_tokens",
    "hisparse",
    "host_pool_slack",
    "kv_cache_grouping",
    "kv_cache_layout",
)


class DeploymentError(ValueError):
    """A deployment field cannot be served with the model; the message starts with the field."""


@attrs.frozen(repr=False)
class DeployedModel(ExtendedModel):
    """An :class:`ExtendedModel` that declares its speculation as a ``SpeculativeModel`` does.

    :func:`~conformance.generate.families.drafts.speculation` reads the
    declaration of either (attrs' slotted classes cannot inherit from both).

    Attributes:
        speculative_method: vLLM's ``SpeculativeConfig.method``.
        num_speculative_tokens: vLLM's ``num_speculative_tokens``.
    """

    speculative_method: str = attrs.field(kw_only=True)
    num_speculative_tokens: int = attrs.field(kw_only=True)


def deployment_of(value: object) -> dict[str, Any]:
    """The deployment a Python model object declares (``{}`` for a plain model or mapping)."""
    out: dict[str, Any] = {}
    if isinstance(value, (SpeculativeModel, DeployedModel)):
        out["speculative_method"] = value.speculative_method
        out["num_speculative_tokens"] = value.num_speculative_tokens
    if isinstance(value, ExtendedModel):
        extras = value.extras
        out.update(
            hisparse=extras.hisparse,
            host_pool_slack=extras.host_pool_slack,
            kv_cache_grouping=extras.kv_cache_grouping,
            kv_cache_layout=extras.kv_cache_layout,
        )
    return out


# ---------------------------------------------------------------------------
# JSON


def _json_hisparse(value: object) -> HiSparseConfig | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DeploymentError(f"hisparse={value!r} must be an object of HiSparseConfig fields")
    names = {f.name for f in attrs.fields(HiSparseConfig)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise DeploymentError(
            f"hisparse: HiSparseConfig has no field(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(names))})"
        )
    try:
        return HiSparseConfig(**value)
    except (KVRefError, TypeError, ValueError) as exc:
        raise DeploymentError(f"hisparse={dict(value)!r}: {exc}") from None


def _json_grouping(value: object) -> RunsOfKindGrouping | DeclaredGroups | None:
    if value is None:
        return None
    kind = value.get("kind") if isinstance(value, Mapping) else None
    fields = {"runs_of_kind": {"kind", "max_layers"}, "groups": {"kind", "groups"}}.get(
        kind if isinstance(kind, str) else ""
    )
    if not isinstance(value, Mapping) or fields is None or set(value) != fields:
        raise DeploymentError(
            f"kv_cache_grouping={value!r} must be {{'kind': 'groups', 'groups': [[layer, ...], "
            "...]}} or {'kind': 'runs_of_kind', 'max_layers': n}"
        )
    try:
        if kind == "groups":
            return DeclaredGroups(groups=value["groups"])
        return RunsOfKindGrouping(max_layers=value["max_layers"])
    except ValueError as exc:
        raise DeploymentError(f"kv_cache_grouping={dict(value)!r}: {exc}") from None


def json_deployment(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The deployment fields of one model of a ``kvref-models/1`` file, decoded.

    Raises:
        DeploymentError: a field is not of its JSON form.
    """
    out: dict[str, Any] = {
        "speculative_method": raw.get("speculative_method"),
        "num_speculative_tokens": raw.get("num_speculative_tokens"),
        "hisparse": _json_hisparse(raw.get("hisparse")),
        "kv_cache_grouping": _json_grouping(raw.get("kv_cache_grouping")),
        "kv_cache_layout": raw.get("kv_cache_layout"),
    }
    if "host_pool_slack" in raw:
        out["host_pool_slack"] = raw["host_pool_slack"]
    return out


# ---------------------------------------------------------------------------
# validation


def _speculation(model: Model, method: object, tokens: object) -> Model:
    if method is None and tokens is None:
        return model
    if method is None or tokens is None:
        raise DeploymentError(
            f"speculative_method={method!r} and num_speculative_tokens={tokens!r} "
            "go together (give both or neither)"
        )
    try:
        declared = SpeculativeModel(
            model.specs,
            model.description,
            family=model.family,
            num_hidden_layers=model.num_hidden_layers,
            hf_config=model.hf_config,
            speculative_method=method,  # type: ignore[arg-type]  # validated by the class
            num_speculative_tokens=tokens,  # type: ignore[arg-type]
        )
        # Refused here, before any run, rather than by every problem drawn from it.
        PlanningConfig(**model_config_fields(declared))
    except (ValueError, KVRefError) as exc:
        raise DeploymentError(str(exc)) from None
    return declared


def _layout(model: Model, value: object, hisparse: HiSparseConfig | None) -> KVCacheLayout | None:
    if value is None:
        return None
    try:
        layout = KVCacheLayout.parse(value)  # type: ignore[arg-type]  # refused below if not
    except (KVRefError, TypeError, AttributeError):
        names = ", ".join(m.name for m in KVCacheLayout)
        raise DeploymentError(
            f"kv_cache_layout={value!r} is not a layout (one of {names})"
        ) from None
    allowed = allowed_layouts(model)
    if layout not in allowed:
        raise DeploymentError(
            f"kv_cache_layout={layout.name!r} is not one vLLM resolves for this model's layers "
            f"(allowed: {', '.join(a.name for a in allowed)})"
        )
    if hisparse is not None and not layout.is_block_outermost:
        raise DeploymentError(
            f"kv_cache_layout={layout.name!r}: HiSparse needs a block-outermost layout"
        )
    return layout


def _hisparse(model: Model, settings: object, slack: object) -> HiSparseConfig | None:
    if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
        raise DeploymentError(f"host_pool_slack={slack!r} must be an int >= 0")
    if settings is None:
        if slack:
            raise DeploymentError(f"host_pool_slack={slack!r} needs hisparse (the pool it sizes)")
        return None
    if not isinstance(settings, HiSparseConfig):
        raise DeploymentError(f"hisparse={settings!r} must be a HiSparseConfig")
    if not hisparse_source_layers(model.specs):
        raise DeploymentError(
            f"hisparse={settings!r}: the model has no sparse-MLA layer (an MLAAttentionSpec "
            "with cache_role SPARSE) for HiSparse to keep on the host"
        )
    from kvref.hisparse import resolve_hisparse_specs

    config = PlanningConfig(
        hisparse=settings,
        kv_cache_layout=KVCacheLayout.BLNHC,
        host_pool_bytes=2**40,
        **model_config_fields(model),
    )
    try:
        resolve_hisparse_specs(config, model.specs)
    except (KVRefError, ValueError) as exc:
        raise DeploymentError(f"hisparse={settings!r}: {exc}") from None
    return settings


def _grouping(model: Model, hook: object, hisparse: HiSparseConfig | None) -> Any:
    if hook is None:
        return None
    if not (isinstance(hook, SupportsKVCacheGrouping) or callable(hook)):
        raise DeploymentError(
            f"kv_cache_grouping={hook!r} must have get_kv_cache_groups(config, specs)"
        )
    if hisparse is not None:
        raise DeploymentError(
            f"kv_cache_grouping={hook!r} cannot be combined with hisparse, which owns the "
            "grouping (vLLM refuses a declared grouping beside HiSparse)"
        )
    if isinstance(hook, DeclaredGroups):
        named = {n for group in hook.groups for n in group}
        unknown, left = sorted(named - set(model.specs)), [n for n in model.specs if n not in named]
        if unknown or left:
            raise DeploymentError(
                f"kv_cache_grouping: the groups must name every layer of the model once "
                f"(not layers: {unknown}; in no group: {left})"
            )
    from kvref.builder import ReferenceKVCacheConfigBuilder

    config = PlanningConfig(model_kv_cache_grouping=hook, **model_config_fields(model))
    try:
        ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, dict(model.specs))
    except (KVRefError, ValueError) as exc:
        raise DeploymentError(f"kv_cache_grouping={hook!r}: {exc}") from None
    return hook


def deployed(
    model: Model,
    *,
    speculative_method: object = None,
    num_speculative_tokens: object = None,
    hisparse: object = None,
    host_pool_slack: object = 0,
    kv_cache_grouping: object = None,
    kv_cache_layout: object = None,
) -> Model:
    """``model`` served with this deployment: a plain, speculative, extended or deployed model.

    Raises:
        DeploymentError: a field the model cannot be served with; the message
            starts with the field and its value.
    """
    spec = _speculation(model, speculative_method, num_speculative_tokens)
    settings = _hisparse(spec, hisparse, host_pool_slack)
    extras = ModelExtras(
        hisparse=settings,
        host_pool_slack=int(host_pool_slack),  # type: ignore[call-overload]  # checked above
        kv_cache_grouping=_grouping(spec, kv_cache_grouping, settings),
        kv_cache_layout=_layout(spec, kv_cache_layout, settings),
    )
    if extras == ModelExtras():
        return spec
    fields: dict[str, Any] = {
        "family": model.family,
        "num_hidden_layers": model.num_hidden_layers,
        "hf_config": model.hf_config,
        "extras": extras,
    }
    if isinstance(spec, SpeculativeModel):
        return DeployedModel(
            model.specs,
            model.description,
            speculative_method=spec.speculative_method,
            num_speculative_tokens=spec.num_speculative_tokens,
            **fields,
        )
    return ExtendedModel(model.specs, model.description, **fields)


def renamed_deployment(model: Model, names: Mapping[str, Sequence[str]]) -> Model:
    """``model`` (a variant with layers renamed, dropped or repeated) with its grouping renamed.

    ``names`` maps each original layer to its names in the variant.
    """
    if not isinstance(model, ExtendedModel):
        return model
    grouping = model.extras.kv_cache_grouping
    if not isinstance(grouping, DeclaredGroups):
        return model
    extras = attrs.evolve(model.extras, kv_cache_grouping=grouping.renamed(names))
    return attrs.evolve(model, extras=extras)
