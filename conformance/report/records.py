"""Counterexamples as data: what a report stores to rebuild a failing input without running code.

A report's ``counterexample_python`` is for people to read; replaying a
report (:func:`conformance.reproduce`) rebuilds the input from
``counterexample_data`` instead, with :func:`decode_example`, which accepts
only plain JSON values and the kit's own record types.  A report from
another team's CI is data: replaying it constructs kvref specs and configs,
and imports or executes nothing the report names.

The layout (``kvref-example/1``)::

    {"format": "kvref-example/1",
     "config": <value>, "workers": <value>, "available_memory": [int, ...], "num_blocks": int}

where a ``<value>`` is ``null``, a bool, an int, a finite float, a string, or
an object with exactly one of these shapes:

- ``{"record": "FullAttentionSpec", "fields": {name: <value>, ...}}``: a kit
  record type (:func:`record_types`), fields left out take their defaults;
- ``{"enum": "KVCacheLayout", "name": "LBNHC"}``; ``{"dtype": "bfloat16"}``;
  ``{"fraction": [numerator, denominator]}``;
- ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"frozenset": [...]}``,
  ``{"dict": [[key, value], ...]}``.
"""

from __future__ import annotations

import enum
import fractions
import math
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import attrs

__all__ = [
    "EXAMPLE_FORMAT",
    "RECORD_MODULES",
    "RecordError",
    "decode_example",
    "decode_value",
    "encode_example",
    "encode_value",
    "example_data",
    "left_to_planning",
    "record_types",
]

#: The ``format`` of :func:`encode_example`'s data.
EXAMPLE_FORMAT = "kvref-example/1"

#: Modules whose attrs classes and enums are the record types data may name.
RECORD_MODULES = (
    "kvref.specs",
    "kvref.extra_specs",
    "kvref.config",
    "kvref.versions",
    "kvref.axes",
    "kvref._spec_fields",
    "conformance.generate.families.extras",
)
_CONTAINERS = ("list", "tuple", "frozenset", "dict")
_MAX_DEPTH = 32


class RecordError(ValueError):
    """Data that is not a counterexample the kit can rebuild; names the field and value."""


@cache
def record_types() -> Mapping[str, type]:
    """The classes data may name, by class name: the kit's attrs records and enums.

    Raises:
        RuntimeError: two of them share a name (the data could not tell them apart).
    """
    import importlib

    found: dict[str, type] = {}
    for module_name in RECORD_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not isinstance(value, type) or not (
                attrs.has(value) or (issubclass(value, enum.Enum) and value is not enum.Enum)
            ):
                continue
            if not str(value.__module__).startswith(("kvref", "conformance")):
                continue  # an import of a third-party type, e.g. enum.Enum itself
            seen = found.setdefault(value.__name__, value)
            if seen is not value:
                raise RuntimeError(
                    f"two record types are called {value.__name__}: "
                    f"{seen.__module__} and {value.__module__}"
                )
    return found


# ---------------------------------------------------------------------------
# encoding


def encode_value(value: Any) -> Any:
    """``value`` as the JSON-able data :func:`decode_value` rebuilds it from.

    Raises:
        RecordError: ``value`` is of a type the data cannot carry (a vendor's
            own spec class, a callable, ...).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    for applies, encode in _ENCODERS:
        if applies(value):
            return encode(value)
    raise RecordError(f"{type(value).__qualname__} values cannot be stored as data: {value!r:.120}")


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise RecordError(f"{value!r} is not a finite float")
    return value


def _enum(value: enum.Enum) -> dict[str, Any]:
    _known(type(value))
    return {"enum": type(value).__name__, "name": value.name}


def _is_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def _known(cls: type) -> None:
    if record_types().get(cls.__name__) is not cls:
        raise RecordError(
            f"{cls.__module__}.{cls.__qualname__} is not one of the kit's record types: "
            "the data could not rebuild it"
        )


def _encode_record(value: Any) -> dict[str, Any]:
    _known(type(value))
    fields: dict[str, Any] = {}
    for field in attrs.fields(type(value)):
        if not field.init or left_to_planning(value, field.name):
            continue
        current = getattr(value, field.name)
        if _is_default(current, field.default):
            continue
        fields[field.name] = encode_value(current)
    return {"record": type(value).__name__, "fields": fields}


def left_to_planning(value: Any, name: str) -> bool:
    """A layout planning resolves is no argument: given back, it would be used as is."""
    return name == "kv_cache_layout" and getattr(value, "resolves_kv_cache_layout", False) is True


def _is_default(current: Any, default: Any) -> bool:
    if default is attrs.NOTHING or isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return False
    try:
        return bool(current == default) and type(current) is type(default)
    except Exception:
        return False


_ENCODERS: tuple[tuple[Callable[[Any], bool], Callable[[Any], Any]], ...] = (
    (lambda v: isinstance(v, float), _finite),
    (_is_dtype, lambda v: {"dtype": str(v).removeprefix("torch.")}),
    (lambda v: isinstance(v, enum.Enum), _enum),
    (
        lambda v: isinstance(v, fractions.Fraction),
        lambda v: {"fraction": [v.numerator, v.denominator]},
    ),
    (
        lambda v: isinstance(v, Mapping),
        lambda v: {"dict": [[encode_value(k), encode_value(x)] for k, x in v.items()]},
    ),
    (
        lambda v: isinstance(v, frozenset),
        lambda v: {"frozenset": [encode_value(x) for x in sorted(v, key=repr)]},
    ),
    (
        lambda v: isinstance(v, (list, tuple)),
        lambda v: {type(v).__name__: [encode_value(x) for x in v]},
    ),
    (lambda v: attrs.has(type(v)), _encode_record),
)


def encode_example(example: Any) -> dict[str, Any]:
    """An example's planning problem as ``kvref-example/1`` data.

    ``example`` has ``config``, ``workers``, ``available_memory`` and
    ``num_blocks`` (a serve example gives its problem; its request stream
    is not part of the data).

    Raises:
        RecordError: the problem holds a value the data cannot carry.
    """
    problem = getattr(example, "example", example)
    return {
        "format": EXAMPLE_FORMAT,
        "config": encode_value(problem.config),
        "workers": encode_value([dict(w) for w in problem.workers]),
        "available_memory": [int(m) for m in problem.available_memory],
        "num_blocks": int(problem.num_blocks),
    }


# ---------------------------------------------------------------------------
# decoding


def decode_value(data: Any, where: str = "value", depth: int = 0) -> Any:
    """Rebuild a value from :func:`encode_value`'s data, strictly.

    Args:
        data: the data (parsed JSON).
        where: the field's path, for error messages.
        depth: how deep ``data`` sits in the whole (nesting is bounded).

    Raises:
        RecordError: anything but plain values and the kit's record types, a
            record field the type lacks, or a value its type refuses; the
            message names the field and the value.
    """
    if depth > _MAX_DEPTH:
        raise RecordError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if data is None or isinstance(data, (bool, int, str)):
        return data
    if isinstance(data, float):
        if not math.isfinite(data):
            raise RecordError(f"{where}={data!r} is not a finite number")
        return data
    if not isinstance(data, dict):
        raise RecordError(
            f"{where}={data!r:.120} is a {type(data).__name__}; a non-scalar value must be an "
            "object tagged record, enum, dtype, fraction, list, tuple, frozenset or dict"
        )
    if "record" in data:
        return _decode_record(data, where, depth)
    if "enum" in data:
        return _decode_enum(data, where)
    if len(data) != 1:
        raise RecordError(f"{where}={data!r:.120} has keys {sorted(data)}; expected one tag")
    ((tag, inner),) = data.items()
    scalar = _SCALAR_TAGS.get(tag)
    if scalar is not None:
        return scalar(inner, where)
    return _decode_container(tag, inner, where, depth)


def _decode_container(tag: str, items: Any, where: str, depth: int) -> Any:
    if tag not in _CONTAINERS:
        raise RecordError(f"{where}: unknown tag {tag!r} (value {items!r:.120})")
    if not isinstance(items, list):
        raise RecordError(f"{where}.{tag}={items!r:.120} must be a JSON array")
    if tag == "dict":
        return _decode_dict(items, where, depth)
    values = [decode_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(items)]
    if tag == "list":
        return values
    if tag == "tuple":
        return tuple(values)
    try:
        return frozenset(values)
    except TypeError as exc:
        raise RecordError(f"{where}.frozenset={items!r:.120}: {exc}") from None


def _decode_dict(items: list[Any], where: str, depth: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for i, pair in enumerate(items):
        if not isinstance(pair, list) or len(pair) != 2:
            raise RecordError(f"{where}.dict[{i}]={pair!r:.120} must be a [key, value] pair")
        key = decode_value(pair[0], f"{where}.dict[{i}][0]", depth + 1)
        try:
            hash(key)
        except TypeError:
            raise RecordError(f"{where}.dict[{i}][0]={pair[0]!r:.120} is no key") from None
        out[key] = decode_value(pair[1], f"{where}[{key!r}]", depth + 1)
    return out


def _decode_enum(data: Mapping[str, Any], where: str) -> enum.Enum:
    name, member = data.get("enum"), data.get("name")
    cls = record_types().get(name) if isinstance(name, str) else None
    if cls is None or not issubclass(cls, enum.Enum):
        raise RecordError(f"{where}.enum={name!r} is not an enum of the kit")
    if not isinstance(member, str) or member not in cls.__members__:
        raise RecordError(
            f"{where}.name={member!r} is not a member of {cls.__name__} "
            f"(members: {', '.join(cls.__members__)})"
        )
    return cls[member]


def _decode_dtype(name: Any, where: str) -> Any:
    import torch

    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise RecordError(f"{where}.dtype={name!r} is not the name of a torch dtype")
    return value


def _decode_fraction(parts: Any, where: str) -> fractions.Fraction:
    if (
        not isinstance(parts, list)
        or len(parts) != 2
        or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts)
        or parts[1] <= 0
    ):
        raise RecordError(f"{where}.fraction={parts!r:.120} must be [numerator, denominator > 0]")
    return fractions.Fraction(parts[0], parts[1])


_SCALAR_TAGS: dict[str, Callable[[Any, str], Any]] = {
    "dtype": _decode_dtype,
    "fraction": _decode_fraction,
}


def _decode_record(data: Mapping[str, Any], where: str, depth: int) -> Any:
    name, fields = data.get("record"), data.get("fields", {})
    if set(data) - {"record", "fields"}:
        raise RecordError(f"{where} has keys {sorted(data)}; a record has 'record' and 'fields'")
    cls = record_types().get(name) if isinstance(name, str) else None
    if cls is None or not attrs.has(cls):
        raise RecordError(
            f"{where}.record={name!r} is not one of the kit's record types "
            "(the data names kvref specs and configs only)"
        )
    if not isinstance(fields, dict):
        raise RecordError(f"{where}.fields={fields!r:.120} must be an object")
    init = {f.name for f in attrs.fields(cls) if f.init}
    for field in fields:
        if field not in init:
            raise RecordError(f"{where}: {name} has no field {field!r}")
    values = {k: decode_value(v, f"{where}.{k}", depth + 1) for k, v in fields.items()}
    try:
        return cls(**values)
    except Exception as exc:
        # The record's own validators name the field and value.
        raise RecordError(f"{where}: {exc}") from None


def decode_example(data: Any, where: str = "counterexample_data") -> tuple[Any, ...]:
    """``(config, workers, available_memory, num_blocks)`` from :func:`encode_example`'s data.

    Raises:
        RecordError: the data is not a ``kvref-example/1`` problem of the kit's
            record types; the message names the field and the value.
    """
    from kvref.config import PlanningConfig
    from kvref.specs import KVCacheSpec

    if not isinstance(data, dict):
        raise RecordError(f"{where}={data!r:.120} must be an object")
    expected = {"format", "config", "workers", "available_memory", "num_blocks"}
    if set(data) != expected:
        raise RecordError(f"{where} has keys {sorted(data)}; expected {sorted(expected)}")
    if data["format"] != EXAMPLE_FORMAT:
        raise RecordError(f"{where}.format={data['format']!r} is not {EXAMPLE_FORMAT!r}")
    config = decode_value(data["config"], f"{where}.config")
    if not isinstance(config, PlanningConfig):
        raise RecordError(f"{where}.config is a {type(config).__name__}, not a PlanningConfig")
    workers = decode_value(data["workers"], f"{where}.workers")
    if not isinstance(workers, list) or not workers:
        raise RecordError(f"{where}.workers must be a non-empty list of layer -> spec dicts")
    for w, layers in enumerate(workers):
        if not isinstance(layers, dict):
            raise RecordError(f"{where}.workers[{w}] is a {type(layers).__name__}, not a dict")
        for name, spec in layers.items():
            if not isinstance(name, str) or not isinstance(spec, KVCacheSpec):
                raise RecordError(
                    f"{where}.workers[{w}][{name!r}]={spec!r:.120} is not a KV cache spec "
                    "under a layer name"
                )
    memory = _ints(data["available_memory"], f"{where}.available_memory", 0)
    if len(memory) != len(workers):
        raise RecordError(
            f"{where}.available_memory has {len(memory)} entries for {len(workers)} workers"
        )
    (num_blocks,) = _ints([data["num_blocks"]], f"{where}.num_blocks", 1)
    return config, tuple(workers), tuple(memory), num_blocks


def _ints(values: Any, where: str, least: int) -> list[int]:
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise RecordError(f"{where}={values!r:.120} must be a list of ints")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RecordError(f"{where}={value!r:.120} must be an int >= {least}")
    return list(values)


def example_data(example: Any) -> dict[str, Any] | None:
    """:func:`encode_example`, or ``None`` where the problem holds a value data cannot carry.

    What the runner stores in a report: a counterexample of a vendor's own
    vLLM spec subclass (a stand-in class the kit made) has no data form and
    is not replayable by :func:`conformance.reproduce`; its run goes on.
    """
    try:
        return encode_example(example)
    except RecordError:
        return None
