"""Vendor models: the shapes a vendor's builder exists for, handed to the kit.

:func:`load_models` turns a models spec into a strategy of :class:`Model`:

- ``"module:attr"``: the attribute is a Hypothesis strategy of models, a
  callable returning any form listed here, a list of fixed models or a
  dict of them (``name -> model``); a model is a :class:`Model` or a
  ``layer name -> spec`` mapping whose specs are kvref specs or vLLM
  0.33.0 specs (converted through :mod:`kvref.interop.vllm`; a vendor
  subclass keeps its own class, planned as its nearest vLLM kind);
- a path to a JSON file in the ``kvref-models/1`` format (a dump of one
  real worker's specs and the deployment they are served with; docs/vendors.md,
  "Your own models", gives the snippet that writes it from a running engine);
- any of those objects directly (``check_builder(models=...)``).

A run of the kit never evaluates a ``module:attr`` spec (nor an object) in
its own process: :mod:`conformance.extensions.vendor.child` does it in a
contained child process with :func:`models_here`, and its models cross as
``kvref-models/1`` data (:mod:`.data`), read by :func:`read_data` as a
JSON file is.  A strategy is drawn too: up to :data:`STRATEGY_DRAWS`
distinct models, then used as fixed models.  :func:`load_models` here
evaluates in the calling process (for a caller that imported the vendor's
code already).

A model keeps its whole deployment (:mod:`.deployment`): its declared
speculation, HiSparse settings, declared grouping and layout.  A bad spec
or deployment raises :class:`VendorModelError` naming the field and value,
before any example runs.  Around each fixed model the kit explores structure-preserving
variants (:func:`around`): the model itself (what shrinking returns to),
fewer decoder layers, and repeated decoder layers; pipeline splits, layouts,
budgets, overrides, block counts and host-resident subsets come from
:func:`~conformance.generate.problems.planning_problems` as for built-ins.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from conformance.extensions.vendor.data import (
    JSON_FORMAT,
    DataError,
    VendorClass,
    import_class,
    spec_classes,
    vendor_spec,
)
from conformance.extensions.vendor.deployment import (
    DEPLOYMENT_FIELDS,
    DeploymentError,
    deployed,
    deployment_of,
    json_deployment,
    renamed_deployment,
)
from conformance.generate.families import models as builtin_models
from conformance.generate.pipeline import decoder_layers
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from kvref.errors import ConfigError, KVRefError
from kvref.specs import KVCacheSpec, MultipleOf

__all__ = [
    "JSON_FORMAT",
    "STRATEGY_DRAWS",
    "VendorModelError",
    "around",
    "fixed_models",
    "load_models",
    "models_for_run",
    "models_here",
    "read_data",
    "read_json",
    "spelled",
]
#: Most decoder layers a growth adds to a vendor model.
_MAX_GROWTH = 8
_INDEX = re.compile(r"^(.*?)(\d+)(?=\.|$)")
#: The fields of one model of a ``kvref-models/1`` file.
_MODEL_KEYS = frozenset({"name", "layers", "num_hidden_layers", "hf_config", *DEPLOYMENT_FIELDS})


class VendorModelError(ValueError):
    """A vendor models spec, or a model or spec in it, cannot be used."""


def _spec_classes() -> dict[str, type[KVCacheSpec]]:
    return spec_classes()


# ---------------------------------------------------------------------------
# specs


def _is_vllm_spec(value: object) -> bool:
    return any(
        cls.__module__.startswith("vllm.") and cls.__name__.endswith("Spec")
        for cls in type(value).__mro__
    )


def _from_vllm(where: str, spec: Any) -> KVCacheSpec:
    """Convert a vLLM spec; a vendor subclass keeps its class (a kvref stand-in of it).

    The stand-in plans as its nearest vLLM kind and reaches a vLLM-native
    builder as a fresh instance of the vendor's own class
    (:mod:`kvref.interop.vllm_vendor`).
    """
    from kvref.interop import vllm as iv

    kvi = iv.vllm_modules().kvi
    if not any(getattr(kvi, c.__name__, None) is c for c in type(spec).__mro__):
        raise VendorModelError(f"{where}: {type(spec).__qualname__} is no vLLM KV cache spec")
    try:
        return iv.layer_spec_from_vllm(spec)
    except (KVRefError, ValueError, iv.VLLMOutputError) as exc:
        raise VendorModelError(f"{where}: {spec!r:.200} does not convert: {exc}") from exc


def _layer_spec(where: str, value: object) -> KVCacheSpec:
    if isinstance(value, KVCacheSpec):
        return value
    if _is_vllm_spec(value):
        return _from_vllm(where, value)
    raise VendorModelError(
        f"{where}={value!r:.200} is neither a kvref KVCacheSpec nor a vLLM KV cache spec"
    )


def _as_model(where: str, value: object, name: str = "") -> Model:
    """A :class:`Model` from a Model or a ``layer -> spec`` mapping."""
    hf: tuple[Any, ...] = ()
    if isinstance(value, Model):
        specs: Mapping[str, object] = value.specs
        hidden, description = value.num_hidden_layers, value.description or name
        hf = value.hf_config
    elif isinstance(value, Mapping):
        specs, hidden, description = value, None, name
    else:
        raise VendorModelError(
            f"{where}={value!r:.200} is not a model (a Model or a dict of layer name to spec)"
        )
    if not specs:
        raise VendorModelError(f"{where} has no layers")
    layers: dict[str, KVCacheSpec] = {}
    for layer, spec in specs.items():
        if not isinstance(layer, str) or not layer:
            raise VendorModelError(f"{where}: layer name {layer!r} must be a non-empty str")
        layers[layer] = _layer_spec(f"{where}[{layer!r}]", spec)
    text = f"vendor: {description or where}"
    model = Model(layers, text, family="vendor", num_hidden_layers=hidden, hf_config=hf)
    # What the model declares about its deployment is served as declared,
    # never inferred again or dropped.
    return _deployed(where, model, deployment_of(value))


def _deployed(where: str, model: Model, deployment: Mapping[str, Any]) -> Model:
    try:
        return deployed(model, **deployment)
    except DeploymentError as exc:
        raise VendorModelError(f"{where}: {exc}") from None


def fixed_models(value: object, where: str = "models") -> list[Model]:
    """The fixed models of a list, a ``name -> model`` dict, one model, or one mapping.

    Raises:
        VendorModelError: ``value`` or a model or spec in it is unusable.
    """
    if isinstance(value, Model):
        return [_as_model(where, value)]
    if isinstance(value, Mapping):
        if value and all(isinstance(v, (Mapping, Model)) for v in value.values()):
            return [_as_model(f"{where}[{k!r}]", v, str(k)) for k, v in value.items()]
        return [_as_model(where, value)]
    if isinstance(value, (list, tuple)):
        if not value:
            raise VendorModelError(f"{where} is an empty list: give at least one model")
        return [_as_model(f"{where}[{i}]", v) for i, v in enumerate(value)]
    raise VendorModelError(
        f"{where}={value!r:.200} must be a strategy of models, a callable returning one, a "
        "list or dict of models, or a path to a JSON file"
    )


# ---------------------------------------------------------------------------
# JSON


def _json_value(where: str, field: str, value: Any) -> Any:
    if field == "block_stride_alignment" and isinstance(value, Mapping):
        if set(value) != {"multiple_of"}:
            raise VendorModelError(
                f"{where}.{field}={value!r} must be an int or {{'multiple_of': n}}"
            )
        return MultipleOf(value["multiple_of"])
    if field in ("dtype",) and isinstance(value, str):
        return value.removeprefix("torch.")
    if field == "dtypes" and isinstance(value, list):
        return [v.removeprefix("torch.") if isinstance(v, str) else v for v in value]
    return value


def _json_spec(
    where: str,
    raw: object,
    classes: Mapping[str, type[KVCacheSpec]],
    vendor_class: VendorClass,
) -> KVCacheSpec:
    if not isinstance(raw, Mapping):
        raise VendorModelError(f"{where}={raw!r:.200} must be an object with a 'kind'")
    fields = dict(raw)
    kind = fields.pop("kind", None)
    cls = classes.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise VendorModelError(
            f"{where}.kind={kind!r} is not a spec class the kit knows "
            f"(known: {', '.join(sorted(classes))})"
        )
    fields.pop("class", None)  # the vendor's own class name, for humans
    vendor = fields.pop("vendor", None)
    page = fields.pop("page_size_bytes", None)
    names = {f.name for f in attrs.fields(cls) if f.init}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise VendorModelError(f"{where}: {cls.__name__} has no field(s) {', '.join(unknown)}")
    try:
        spec = cls(**{k: _json_value(where, k, v) for k, v in fields.items()})
    except (KVRefError, TypeError, ValueError) as exc:
        raise VendorModelError(f"{where}: {exc}") from exc
    if page is not None and page != spec.page_size_bytes:
        raise VendorModelError(
            f"{where}.page_size_bytes={page!r}, but the fields give a "
            f"{spec.page_size_bytes}-byte {cls.__name__} page"
        )
    if vendor is None:
        return spec
    try:
        return vendor_spec(f"{where}.vendor", cls, spec, vendor, vendor_class)
    except DataError as exc:
        raise VendorModelError(str(exc)) from None


def read_json(path: str | Path, vendor_class: VendorClass | None = None) -> list[Model]:
    """The models of a ``kvref-models/1`` JSON file (format: docs/vendors.md, "Your own models").

    ``vendor_class``: see :func:`read_data`.

    Raises:
        VendorModelError: the file is missing, not JSON, or not in the format.
    """
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise VendorModelError(f"models file {where!r} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise VendorModelError(f"models file {where!r} is not JSON: {exc}") from exc
    return read_data(
        data,
        where,
        what=f"models file {where!r}",
        default_name=lambda i: f"{Path(path).name}[{i}]",
        vendor_class=vendor_class,
    )


def read_data(
    data: Any,
    where: str,
    *,
    what: str | None = None,
    default_name: Callable[[int], str] = str,
    vendor_class: VendorClass | None = None,
) -> list[Model]:
    """The models of a ``kvref-models/1`` document already parsed.

    ``where`` starts each model's errors, ``what`` (default ``where``) the
    document's; ``default_name(i)`` names a model that has no ``name``.
    ``vendor_class`` gives the class a spec's ``vendor.class`` names (default:
    imported in this process; the kit's runs pass a stand-in maker, so the
    judge imports no vendor module).

    Raises:
        VendorModelError: the document is not in the format.
    """
    what = where if what is None else what
    vendor_class = import_class if vendor_class is None else vendor_class
    if not isinstance(data, Mapping) or data.get("format") != JSON_FORMAT:
        got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise VendorModelError(f"{what}: format is {got!r}, not {JSON_FORMAT!r}")
    raw_models = data.get("models")
    if not isinstance(raw_models, list) or not raw_models:
        raise VendorModelError(f"{what}: 'models' must be a non-empty list")
    classes = _spec_classes()
    out = []
    for i, raw in enumerate(raw_models):
        at = f"{where}: models[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("layers"), Mapping):
            raise VendorModelError(f"{at} must be an object with 'layers'")
        hidden = raw.get("num_hidden_layers")
        if hidden is not None and (not isinstance(hidden, int) or hidden < 1):
            raise VendorModelError(f"{at}.num_hidden_layers={hidden!r} must be an int >= 1")
        layers = {
            name: _json_spec(f"{at}.layers[{name!r}]", spec, classes, vendor_class)
            for name, spec in raw["layers"].items()
        }
        unknown = sorted(set(raw) - _MODEL_KEYS)
        if unknown:
            raise VendorModelError(
                f"{at}: unknown field(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_MODEL_KEYS))})"
            )
        name = str(raw.get("name") or default_name(i))
        try:
            model = attrs.evolve(
                _as_model(at, layers, name),
                num_hidden_layers=hidden,
                hf_config=raw.get("hf_config", ()),
            )
        except ConfigError as exc:
            raise VendorModelError(f"{at}: {exc}") from None
        try:
            deployment = json_deployment(raw)
        except DeploymentError as exc:
            raise VendorModelError(f"{at}.{exc}") from None
        out.append(_deployed(at, model, deployment))
    return out


# ---------------------------------------------------------------------------
# variants


def _rename(name: str, prefix: str, old: int, new: int) -> str:
    match = _INDEX.match(name)
    if match is None or match[1] != prefix or int(match[2]) != old:
        return name
    return f"{prefix}{new}{name[match.end() :]}"


def _rebuild(model: Model, order: Sequence[int], label: str) -> Model:
    """The model with decoder layers ``order`` (original indices), renumbered 0..len-1."""
    layers = decoder_layers(model)
    first = next(iter(n for names in layers.by_index.values() for n in names), None)
    match = _INDEX.match(first) if first is not None else None
    if match is None:
        return model
    prefix = match[1]
    specs: dict[str, KVCacheSpec] = {}
    # Old name -> its new names (none: dropped, several: repeated), for the declared grouping.
    names: dict[str, list[str]] = {name: [] for name in model.specs}
    for new, old in enumerate(order):
        for name in layers.by_index.get(old, ()):
            specs[_rename(name, prefix, old, new)] = model.specs[name]
            names[name].append(_rename(name, prefix, old, new))
    hidden = layers.num_hidden_layers
    for name in layers.tail:
        # Draft/MTP layers numbered after the target keep that place.
        tail = _INDEX.match(name)
        if tail is not None and tail[1] == prefix and int(tail[2]) >= hidden:
            name_new = _rename(name, prefix, int(tail[2]), int(tail[2]) - hidden + len(order))
        else:
            name_new = name
        specs[name_new] = model.specs[name]
        names[name].append(name_new)
    return renamed_deployment(
        attrs.evolve(
            model,
            specs=specs,
            description=f"{model.description} ({label})",
            num_hidden_layers=len(order),
        ),
        names,
    )


@st.composite
def _around(draw: st.DrawFn, model: Model) -> Model:
    layers = decoder_layers(model)
    hidden = layers.num_hidden_layers
    with_cache = sorted(layers.by_index)
    mode = pick(draw, ["as is", "drop", "repeat"])
    if mode == "as is" or not with_cache:
        return model
    if mode == "drop":
        if hidden < 2:
            return model
        keep = draw(
            st.lists(st.sampled_from(range(hidden)), min_size=1, max_size=hidden - 1, unique=True)
        )
        if not set(keep) & set(with_cache):
            keep.append(with_cache[0])
        order = sorted(keep)
        return _rebuild(model, order, f"{len(order)} of {hidden} decoder layers")
    extra = draw(
        st.lists(st.sampled_from(range(hidden)), min_size=1, max_size=min(_MAX_GROWTH, hidden))
    )
    order = [*range(hidden), *extra]
    return _rebuild(model, order, f"{hidden} decoder layers + {len(extra)} repeated")


def around(model: Model) -> st.SearchStrategy[Model]:
    """``model`` itself (shrinks to it) and structure-preserving variants of it.

    A variant drops decoder layers (keeping at least one with a KV cache) or
    appends copies of some, always whole decoder layers with all their
    caches, renumbered so the indices stay contiguous; draft/MTP layers
    after the target keep their place after it.
    """
    return _around(model)


# ---------------------------------------------------------------------------
# loading


#: Most distinct models a vendor's strategy gives (drawn once, then fixed).
STRATEGY_DRAWS = 32
#: Draws of a vendor's strategy, of which at most :data:`STRATEGY_DRAWS` distinct models are kept.
_DRAW_ATTEMPTS = 200


def spelled(spec: str) -> None:
    """Refuse, without importing anything, a spec that is neither ``module:attr`` nor a file."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise VendorModelError(
            f"models={spec!r} is neither 'module:attr' nor the path of an existing JSON file"
        )


#: Documented import paths of this extension's modules from before they moved
#: here, still served to the vendor's models: a models file written against
#: the old path keeps working (docs/vendors.md).
MOVED_MODULES = {"conformance.generate.deployment": "conformance.extensions.vendor.deployment"}


def _keep_moved_paths() -> None:
    """Alias each old path to its module, for the vendor's imports only."""
    import sys

    for old, new in MOVED_MODULES.items():
        sys.modules.setdefault(old, importlib.import_module(new))


def _resolve(spec: str) -> object:
    """Import ``module:attr`` (in the models child: the vendor's code runs there)."""
    spelled(spec)
    module_name, _, attr = spec.partition(":")
    _keep_moved_paths()
    try:
        value: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise VendorModelError(f"models={spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(value, part):
            raise VendorModelError(f"models={spec!r}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


def _drawn(where: str, strategy: st.SearchStrategy[Any]) -> list[Model]:
    """Distinct models drawn from a vendor's strategy, always the same ones (derandomised)."""
    from hypothesis import given

    from conformance.extensions.vendor.data import model_data

    values: list[Any] = []

    @settings(
        database=None,
        max_examples=_DRAW_ATTEMPTS,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        values.append(value)

    collect()
    if not values:
        raise VendorModelError(f"{where}: the strategy draws nothing")
    models: dict[str, Model] = {}
    for value in values:
        model = _as_model(f"{where} (a drawn model)", value)
        models.setdefault(json.dumps(model_data(model), sort_keys=True), model)
        if len(models) == STRATEGY_DRAWS:
            break
    return list(models.values())


def _models_of(where: str, value: object, depth: int = 0) -> list[Model]:
    if isinstance(value, st.SearchStrategy):
        return _drawn(where, value)
    if callable(value) and not isinstance(value, (Model, Mapping, type)) and depth == 0:
        try:
            produced = value()
        except Exception as exc:
            raise VendorModelError(f"{where}: calling it raised {exc!r}") from exc
        return _models_of(f"{where}()", produced, depth + 1)
    if isinstance(value, (str, Path)) and depth == 0:
        return models_here(value)
    return fixed_models(value, where)


def _is_file_spec(spec: object) -> bool:
    return isinstance(spec, Path) or (
        isinstance(spec, str) and (spec.endswith(".json") or Path(spec).is_file())
    )


def models_here(spec: object) -> list[Model]:
    """The models a spec names, evaluated in this process: the models child's work.

    Imports, calls and draws from the vendor's code: the kit's runs call it
    only in a contained child (:mod:`conformance.extensions.vendor.child`).

    Raises:
        VendorModelError: the spec, or a model or spec it names, is unusable.
    """
    if _is_file_spec(spec):
        return read_json(spec)  # type: ignore[arg-type]  # a str or Path
    if isinstance(spec, str):
        return _models_of(f"models={spec!r}", _resolve(spec))
    return _models_of("models", spec)


def load_models(spec: object) -> st.SearchStrategy[Model]:
    """A strategy of the vendor's models (and variants around them) from a models spec.

    Evaluated in this process, which then runs the vendor's code: for a
    caller that imported it already.  The kit's runs load models with
    :func:`conformance.extensions.vendor.child.load_models`, in a contained child.

    Args:
        spec: ``"module:attr"``, a path to a ``kvref-models/1`` JSON file, or
            the object such an attribute names (see the module docstring).

    Raises:
        VendorModelError: the spec, or a model or spec it names, is unusable.
    """
    return st.one_of([around(m) for m in models_here(spec)])


def models_for_run(
    spec: object | None,
    *,
    models_only: bool = False,
    max_layers: int = 64,
    load: Callable[[object], st.SearchStrategy[Model]] = load_models,
) -> st.SearchStrategy[Model] | None:
    """The models of a run: ``None`` (the built-in families), the vendor's, or both.

    Mixed, half the examples come from the vendor's models and half from
    the built-in families (listed first, so shrinking prefers them).
    ``load`` loads the vendor's (the kit's runs: in a contained child).

    Raises:
        VendorModelError: ``spec`` is unusable, or ``models_only`` without a spec.
    """
    if spec is None:
        if models_only:
            raise VendorModelError("models_only needs models (the vendor models to generate from)")
        return None
    vendor = load(spec)
    if models_only:
        return vendor
    # Mapped, so that one_of does not flatten the built-ins into many branches.
    builtins = builtin_models(max_layers=max_layers).map(lambda m: m)
    return st.one_of(builtins, vendor)
