"""Vendor models as ``kvref-models/1`` data: what crosses from the models child to the judge.

A ``module:attr`` models spec names the vendor's code: importing it, calling
it or drawing from its strategy runs that code.  The kit does all of that in
a contained child process (:mod:`conformance.extensions.vendor.child`), which
writes the models it got as a ``kvref-models/1`` document
(:func:`models_data`); the judge reads that document as it reads a JSON file
(:func:`conformance.extensions.vendor.models.read_data`), so nothing of the vendor's
module is ever imported in the judging process.

The document is the format of docs/vendors.md ("The kvref-models/1 format")
with one addition a JSON dump may use as well: a spec of a vendor's own
subclass of a vLLM spec class carries ``"vendor": {"class": "module:qualname",
"fields": [[name, value], ...]}`` (the class, and its own constructor fields);
the judge keeps a stand-in of that name, and the builder's processes get the
class itself.
"""

from __future__ import annotations

import enum
import fractions
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conformance.extensions.vendor.deployment import deployment_of
from conformance.generate.families.extras import DeclaredGroups, RunsOfKindGrouping
from conformance.generate.problems import model_config_fields
from conformance.generate.records import Model
from kvref import extra_specs
from kvref import specs as kvref_specs
from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.interop.vllm_vendor import vendor_origin, vendor_spec_class
from kvref.specs import KVCacheSpec, MultipleOf

__all__ = [
    "JSON_FORMAT",
    "DataError",
    "VendorClass",
    "import_class",
    "models_data",
    "spec_classes",
    "spec_data",
    "vendor_spec",
]

#: The ``format`` tag of a models document.
JSON_FORMAT = "kvref-models/1"


class DataError(ValueError):
    """A model, spec or value cannot be written, or read, as ``kvref-models/1`` data."""


#: Gives the class a ``module:qualname`` names (in the judge: a stand-in of that name).
VendorClass = Callable[[str], type]


def spec_classes() -> dict[str, type[KVCacheSpec]]:
    """The spec classes a document may name as ``kind``, by name."""
    found: dict[str, type[KVCacheSpec]] = {}
    for module in (kvref_specs, extra_specs):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, KVCacheSpec):
                found[name] = value
    return found


def _value(where: str, value: Any) -> Any:  # noqa: PLR0911 - one return per kind of value
    """A spec field's value in the document's spelling (docs/vendors.md, "Values")."""
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, float):
        return float(value)
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, fractions.Fraction):
        return f"{value.numerator}/{value.denominator}"
    if isinstance(value, MultipleOf):
        return {"multiple_of": value.n}
    if isinstance(value, (tuple, list)):
        return [_value(where, v) for v in value]
    raise DataError(f"{where}={value!r:.120} cannot be written as kvref-models/1 data")


def _kind(spec: KVCacheSpec, classes: Mapping[str, type[KVCacheSpec]]) -> type[KVCacheSpec]:
    origin = vendor_origin(spec)
    if origin is not None:
        return origin.kind
    for cls in type(spec).__mro__:
        if classes.get(cls.__name__) is cls:
            return cls
    raise DataError(f"{type(spec).__qualname__} is no spec class of the kit's")


def _class_name(cls: Any) -> str:
    named = getattr(cls, "kvref_placeholder_for", None)
    return str(named) if named else f"{cls.__module__}:{cls.__qualname__}"


def spec_data(where: str, spec: KVCacheSpec) -> dict[str, Any]:
    """One spec as ``{"kind": ..., field: value, ...}`` (every constructor field)."""
    classes = spec_classes()
    kind = _kind(spec, classes)
    out: dict[str, Any] = {"kind": kind.__name__}
    for field in attrs.fields(kind):
        if field.init:
            out[field.name] = _value(f"{where}.{field.name}", getattr(spec, field.name))
    origin = vendor_origin(spec)
    if origin is not None:
        out["vendor"] = {
            "class": _class_name(origin.vendor_cls),
            "fields": [[name, _value(f"{where}.{name}", v)] for name, v in origin.extra],
        }
    return out


def _grouping(model: Model, hook: Any) -> dict[str, Any] | None:
    """A declared grouping as data; a hook of the vendor's own is asked once, here."""
    if hook is None:
        return None
    if isinstance(hook, RunsOfKindGrouping):
        return {"kind": "runs_of_kind", "max_layers": hook.max_layers}
    if isinstance(hook, DeclaredGroups):
        return {"kind": "groups", "groups": [list(g) for g in hook.groups]}
    # The vendor's own grouping code runs here, in the models child; the judge
    # gets the groups it made for the whole model (a stage keeps its layers of each).
    config = PlanningConfig(**model_config_fields(model))
    groups = hook.get_kv_cache_groups(config, dict(model.specs))
    return {"kind": "groups", "groups": [list(g.layer_names) for g in groups]}


def _deployment(model: Model) -> dict[str, Any]:
    declared = deployment_of(model)
    out: dict[str, Any] = {}
    if declared.get("speculative_method") is not None:
        out["speculative_method"] = declared["speculative_method"]
        out["num_speculative_tokens"] = declared["num_speculative_tokens"]
    hisparse = declared.get("hisparse")
    if hisparse is not None:
        out["hisparse"] = {
            f.name: _value(f"hisparse.{f.name}", getattr(hisparse, f.name))
            for f in attrs.fields(type(hisparse))
        }
        out["host_pool_slack"] = declared.get("host_pool_slack", 0)
    grouping = _grouping(model, declared.get("kv_cache_grouping"))
    if grouping is not None:
        out["kv_cache_grouping"] = grouping
    layout = declared.get("kv_cache_layout")
    if layout is not None:
        out["kv_cache_layout"] = layout.name
    return out


def model_data(model: Model) -> dict[str, Any]:
    """One model as an entry of a document's ``models`` list."""
    name = model.description.removeprefix("vendor: ")
    out: dict[str, Any] = {
        "name": name,
        "layers": {
            layer: spec_data(f"{name}.layers[{layer!r}]", spec)
            for layer, spec in model.specs.items()
        },
    }
    if model.num_hidden_layers is not None:
        out["num_hidden_layers"] = model.num_hidden_layers
    if model.hf_config:
        out["hf_config"] = {k: _value(f"{name}.hf_config.{k}", v) for k, v in model.hf_config}
    out.update(_deployment(model))
    return out


def models_data(models: Sequence[Model]) -> dict[str, Any]:
    """A ``kvref-models/1`` document of ``models``.

    Raises:
        DataError: a value has no spelling in the format.
    """
    return {"format": JSON_FORMAT, "models": [model_data(m) for m in models]}


# -- reading a spec's ``vendor`` entry -------------------------------------------


def import_class(name: str) -> type:
    """The class ``module:qualname``, imported in this process."""
    module, _, qualname = name.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"vendor class {name!r} cannot be imported: {exc}") from None
    if not isinstance(found, type):
        raise DataError(f"vendor class {name!r} is a {type(found).__name__}, not a class")
    return found


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def vendor_spec(
    where: str, cls: type[KVCacheSpec], spec: KVCacheSpec, raw: Any, vendor_class: VendorClass
) -> KVCacheSpec:
    """``spec`` as an instance of the vendor's class ``raw["class"]`` (a stand-in in the judge).

    The judging process never imports the vendor's module: ``vendor_class``
    gives it a class of that name (the kit's runs pass
    :func:`conformance.harness.wire.builder_class`); the builder's processes
    get the vendor's class itself.
    """
    if not isinstance(raw, Mapping) or set(raw) != {"class", "fields"}:
        raise DataError(f"{where}={raw!r:.200} must be {{'class': ..., 'fields': [...]}}")
    name, extra = raw["class"], raw["fields"]
    if not isinstance(name, str) or ":" not in name:
        raise DataError(f"{where}.class={name!r:.100} must be 'module:qualname'")
    if not isinstance(extra, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) for e in extra
    ):
        raise DataError(f"{where}.fields={extra!r:.200} must be [[name, value], ...]")
    try:
        stand_in = vendor_spec_class(
            cls, vendor_class(name), tuple((n, _frozen(v)) for n, v in extra)
        )
    except KVRefError as exc:
        raise DataError(f"{where}: {exc}") from None
    values = {f.name: getattr(spec, f.name) for f in attrs.fields(cls) if f.init}
    made: KVCacheSpec = stand_in(**values)
    return made
