"""What crosses from a builder's process to the kit's: plain data, never pickles.

A pickle runs code when it is loaded (``__reduce__``), so an answer pickled
by the builder's worker could patch the kit that unpickles it and forge a
pass.  Everything the worker (or the twin process) sends back is therefore
encoded here as JSON-able data and decoded by the kit with a strict decoder
that builds only the kit's own record types and plain values:

- ``None``, bools, ints, strings and finite floats as themselves;
  ``{"float": "nan" | "inf" | "-inf"}`` (a size the builder made non-finite
  must reach the size invariants, not vanish);
- ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": [[k, v], ...]}``,
  ``{"frozenset": [...]}``; a subclass of a container travels as the plain
  container of what it holds (the kit judges the contents, not the class's
  ``__len__``);
- ``{"record": name, "fields": {...}}``: an attrs record of kvref's (specs,
  configs, groups, tensors, plans), ``{"enum": name, "name": member}``,
  ``{"dtype": name}``, ``{"fraction": [n, d]}``;
- ``{"vendor": {...}}``: a vendor's subclass of a vLLM spec class, as the
  kvref kind, the vendor class's name and the field values; the kit keeps a
  stand-in class of that name and never imports the vendor's module (the
  builder's own worker and twin get the vendor's class: :func:`builder_class`);
- ``{"opaque": {"type": name, "repr": text}}``: anything else; the kit gets
  an :class:`Opaque` that type checks reject as what it is;
- exceptions as their class names (most derived first), message and
  traceback text: the kit raises a class of its own, named like the
  builder's and derived from the nearest class it knows.
"""

from __future__ import annotations

import builtins
import copyreg
import enum
import fractions
import importlib
import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import attrs

from conformance.report.records import RECORD_MODULES

__all__ = [
    "Opaque",
    "WireError",
    "as_builders",
    "decode",
    "decode_exception",
    "encode",
    "encode_exception",
]

#: Modules whose attrs classes and enums may travel as records: those a
#: counterexample's data may name, and the hooks' answers (groups, configs, plans).
_RECORD_MODULES = (*RECORD_MODULES, "kvref.records", "kvref.planning")
#: Modules whose exception classes the kit rebuilds as themselves.
_ERROR_MODULES = ("kvref.errors", "kvref.interop.vllm_import", "conformance.errors")
_MAX_DEPTH = 64
_MAX_TEXT = 4000


class WireError(ValueError):
    """Data that is not what the kit's wire format allows (names the place and value)."""


@attrs.frozen
class Opaque:
    """An object of the builder's that is not data: only its type name and repr travel.

    Attributes:
        type_name: the object's ``module.qualname``.
        text: its repr, cut to a few hundred characters.
    """

    type_name: str
    text: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object: {self.text}>"


@cache
def _records() -> Mapping[str, type]:
    found: dict[str, type] = {}
    for module_name in _RECORD_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != module_name:
                continue
            if not (attrs.has(value) or issubclass(value, enum.Enum)):
                continue
            # A record travels by its bare name: two classes of one name would
            # make the decoder build whichever module came first.
            if found.setdefault(value.__name__, value) is not value:
                raise TypeError(
                    f"the wire's record types {_name(found[value.__name__])} and "
                    f"{_name(value)} share a name"
                )
    return found


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# -- encoding (the builder's side) -------------------------------------------------


def encode(value: Any, depth: int = 0) -> Any:  # noqa: PLR0911 - one return per plain type
    """``value`` as wire data (run where the builder runs; never raises for odd objects)."""
    if depth > _MAX_DEPTH:
        return _opaque(value, "nested too deep")
    if value is None or type(value) in (bool, str, int):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        number = float(value)
        return number if math.isfinite(number) else {"float": repr(number)}
    if isinstance(value, str):
        return str(value)
    try:
        return _encode_object(value, depth + 1)
    except Exception as exc:  # a hostile __iter__, __eq__ or property: say what it is
        return _opaque(value, f"cannot be read as data: {type(exc).__name__}")


def _encode_object(value: Any, depth: int) -> Any:  # noqa: PLR0911 - one return per kind
    # Exact lists and tuples first: most of a plan, and no branch below could claim them.
    if type(value) is list:
        return {"list": [encode(v, depth) for v in list(value)]}
    if type(value) is tuple:
        return {"tuple": [encode(v, depth) for v in value]}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        known = _records().get(type(value).__name__) is type(value)
        return {"enum": type(value).__name__, "name": value.name} if known else _opaque(value)
    if isinstance(value, fractions.Fraction):
        return {"fraction": [int(value.numerator), int(value.denominator)]}
    if isinstance(value, Mapping):
        return {"dict": [[encode(k, depth), encode(v, depth)] for k, v in list(value.items())]}
    if isinstance(value, (frozenset, set)):
        return {"frozenset": [encode(v, depth) for v in list(value)]}
    if isinstance(value, tuple):
        return {"tuple": [encode(v, depth) for v in list(value)]}
    if isinstance(value, list):
        return {"list": [encode(v, depth) for v in list(value)]}
    if attrs.has(type(value)):
        return _encode_record(value, depth)
    return _opaque(value)


def _fields(value: Any, kind: type, depth: int) -> dict[str, Any]:
    return {f.name: encode(getattr(value, f.name), depth) for f in attrs.fields(kind) if f.init}


def _encode_record(value: Any, depth: int) -> Any:
    from kvref.interop.vllm_vendor import vendor_origin

    origin = vendor_origin(value)
    if origin is not None:
        return {
            "vendor": {
                "kind": origin.kind.__name__,
                "class": _name(origin.vendor_cls),
                "extra": encode(origin.extra, depth),
                "fields": _fields(value, origin.kind, depth),
            }
        }
    # A subclass of a kit record travels as that record: the kit judges the
    # fields, and no method of the builder's class comes along.
    known = _records()
    cls = next((c for c in type(value).__mro__ if known.get(c.__name__) is c), None)
    if cls is None or not attrs.has(cls):
        return _opaque(value)
    return {"record": cls.__name__, "fields": _fields(value, cls, depth)}


def _opaque(value: Any, why: str = "") -> dict[str, Any]:
    try:
        text = repr(value)[:300]
    except Exception:
        text = "<repr failed>"
    if why:
        text = f"{text} ({why})"
    return {
        "opaque": {"type": f"{type(value).__module__}.{type(value).__qualname__}", "repr": text}
    }


def encode_exception(exc: BaseException, traceback_text: str) -> dict[str, Any]:
    """An exception the builder (or the kit's adapter in its process) raised, as data."""
    data: dict[str, Any] = {
        "mro": [_name(c) for c in type(exc).__mro__ if issubclass(c, BaseException)],
        "message": _text(exc),
        "traceback": traceback_text[-_MAX_TEXT:],
        "fields": {},
    }
    for field in ("max_model_len", "needed_bytes", "available_bytes", "estimated_max_model_len"):
        value = getattr(exc, field, None)
        if type(value) is int:
            data["fields"][field] = value
    for field in ("where", "detail"):
        value = getattr(exc, field, None)
        if type(value) is str:
            data["fields"][field] = value[-_MAX_TEXT:]
    return data


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:_MAX_TEXT]
    except Exception:
        return f"<{type(exc).__name__} whose str() failed>"


# -- decoding (the kit's side) -----------------------------------------------------


#: Values that are their own wire form (special floats are tagged, never plain).
_PLAIN = frozenset({type(None), bool, int, str, float})


def _decode_single(data: Any, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH + 2:
        raise WireError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is float:
        return data
    if type(data) is not dict or len(data) != 1:
        raise WireError(f"{where}={data!r:.120} is not wire data")
    ((tag, body),) = data.items()
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise WireError(f"{where}: unknown tag {tag!r}")
    return decoder(body, f"{where}.{tag}", depth + 1)


def _items(body: Any, where: str, depth: int) -> list[Any]:
    if type(body) is not list:
        raise WireError(f"{where}={body!r:.120} must be a list")
    # Plain values are most of a plan: no place name is built for them.
    return [
        v if type(v) in _PLAIN else decode(v, f"{where}[{i}]", depth) for i, v in enumerate(body)
    ]


def _decode_dict(body: Any, where: str, depth: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for i, pair in enumerate(_raw_list(body, where)):
        if type(pair) is not list or len(pair) != 2:
            raise WireError(f"{where}[{i}]={pair!r:.120} must be a [key, value] pair")
        key = decode(pair[0], f"{where}[{i}][0]", depth)
        try:
            out[key] = decode(pair[1], f"{where}[{i}][1]", depth)
        except TypeError:
            raise WireError(f"{where}[{i}][0]={key!r:.120} is not hashable") from None
    return out


def _raw_list(body: Any, where: str) -> list[Any]:
    if type(body) is not list:
        raise WireError(f"{where}={body!r:.120} must be a list")
    return body


def _decode_frozenset(body: Any, where: str, depth: int) -> frozenset[Any]:
    try:
        return frozenset(_items(body, where, depth))
    except TypeError:
        raise WireError(f"{where}: an item is not hashable") from None


def _decode_float(body: Any, where: str, depth: int) -> float:
    if body not in ("nan", "inf", "-inf"):
        raise WireError(f"{where}={body!r:.60} is not nan, inf or -inf")
    return float(body)


def _decode_record_fields(cls: type, fields: Any, where: str, depth: int) -> dict[str, Any]:
    if type(fields) is not dict:
        raise WireError(f"{where}.fields={fields!r:.120} must be an object")
    unknown = sorted(set(fields) - _init_names(cls))
    if unknown:
        raise WireError(f"{where}: {cls.__name__} has no field {unknown[0]!r}")
    return {
        k: v if type(v) in _PLAIN else decode(v, f"{where}.{k}", depth) for k, v in fields.items()
    }


@cache
def _init_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in attrs.fields(cls) if f.init)


def _decode_record(body: Any, where: str, depth: int) -> Any:
    if type(body) is not dict or set(body) != {"record", "fields"}:
        raise WireError(f"{where}={body!r:.120} is no record")
    cls = _records().get(body["record"]) if type(body["record"]) is str else None
    if cls is None or not attrs.has(cls):
        raise WireError(f"{where}: {body['record']!r:.80} is not a record type of the kit")
    values = _decode_record_fields(cls, body["fields"], where, depth)
    return _build(cls, values, where)


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """``cls(**values)`` without the record's own validation.

    What the builder returned must reach the invariants as it was: a tensor
    of -4096 bytes is ``KV-PLACE-SIZE-BOUND``'s finding, not a record the
    wire may refuse.  Only the field names and the values' own shapes are
    checked here.
    """
    try:
        with attrs.validators.disabled():
            return cls(**values)
    except Exception:
        pass
    made: Any = object.__new__(cls)
    try:
        for field in attrs.fields(cls):
            if field.name in values:
                value = values[field.name]
            elif field.default is attrs.NOTHING:
                raise WireError(f"{where}: {cls.__name__} needs a value for {field.name!r}")
            elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
                value = field.default.factory()
            else:
                value = field.default
            object.__setattr__(made, field.name, value)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"{where}: {cls.__name__}: {type(exc).__name__}: {exc}") from None
    return made


def _decode_dtype(body: Any, where: str, depth: int) -> Any:
    import torch

    value = getattr(torch, body, None) if type(body) is str else None
    if not isinstance(value, torch.dtype):
        raise WireError(f"{where}={body!r:.60} is not a torch dtype")
    return value


def _decode_fraction(body: Any, where: str, depth: int) -> fractions.Fraction:
    if type(body) is not list or len(body) != 2 or not all(type(x) is int for x in body):
        raise WireError(f"{where}={body!r:.60} must be [numerator, denominator]")
    if body[1] <= 0:
        raise WireError(f"{where}={body!r:.60}: the denominator must be > 0")
    return fractions.Fraction(body[0], body[1])


def _decode_opaque(body: Any, where: str, depth: int) -> Opaque:
    if type(body) is not dict or set(body) != {"type", "repr"}:
        raise WireError(f"{where}={body!r:.120} is no opaque object")
    return Opaque(str(body["type"])[:200], str(body["repr"])[:400])


class _Placeholder(type):
    """The type of the kit's placeholder classes (pickled by name, see :func:`builder_class`)."""


def _reduce_placeholder(cls: Any) -> tuple[Any, ...]:
    return builder_class, (cls.kvref_placeholder_for,)


# A placeholder travels to the builder's worker inside a vendor spec the kit
# hands back (a grouping Core re-plans); there it is the vendor's own class.
copyreg.pickle(_Placeholder, _reduce_placeholder)

#: Whether this process is the builder's own (its worker or its twin).
_BUILDER_PROCESS = [False]


def in_builder_process() -> None:
    """Mark this process as the builder's: class names resolve to the builder's classes."""
    _BUILDER_PROCESS[0] = True


def builder_class(name: str) -> type:
    """The builder's class ``module:qualname`` in the builder's process, its placeholder elsewhere.

    The kit's own process never imports the builder's modules; the builder's
    worker has imported them already, and a vendor hook there must get its
    own class back (``isinstance`` gates).
    """
    if _BUILDER_PROCESS[0]:
        module, _, qualname = name.partition(":")
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except Exception:
            found = None
        if isinstance(found, type):
            return found
    return placeholder_class(name)


@cache
def placeholder_class(name: str) -> type:
    """A class of the kit's that stands for the builder's class ``module:qualname``.

    It has the name only: the kit never imports the builder's module.
    """
    module, _, qualname = name.partition(":")
    return _Placeholder(
        qualname.rpartition(".")[2] or "Unknown",
        (),
        {
            "__module__": module or "<builder>",
            "__qualname__": qualname or "Unknown",
            "__doc__": f"The kit's stand-in for the builder's class {name}.",
            "kvref_placeholder_for": name,
        },
    )


def _decode_vendor(body: Any, where: str, depth: int) -> Any:
    from kvref.interop.vllm_vendor import vendor_spec_class
    from kvref.specs import KVCacheSpec

    if type(body) is not dict or set(body) != {"kind", "class", "extra", "fields"}:
        raise WireError(f"{where}={body!r:.120} is no vendor spec")
    kind = _records().get(body["kind"]) if type(body["kind"]) is str else None
    if kind is None or not issubclass(kind, KVCacheSpec):
        raise WireError(f"{where}.kind={body['kind']!r:.80} is not a kvref spec kind")
    if type(body["class"]) is not str:
        raise WireError(f"{where}.class={body['class']!r:.80} must be a class name")
    extra = decode(body["extra"], f"{where}.extra", depth)
    if type(extra) is not tuple:
        raise WireError(f"{where}.extra must be a tuple of (field, value) pairs")
    values = _decode_record_fields(kind, body["fields"], where, depth)
    cls = vendor_spec_class(kind, builder_class(body["class"]), extra)
    return _build(cls, values, where)


_DECODERS: dict[str, Callable[[Any, str, int], Any]] = {
    "list": _items,
    "tuple": lambda b, w, d: tuple(_items(b, w, d)),
    "dict": _decode_dict,
    "frozenset": _decode_frozenset,
    "float": _decode_float,
    "dtype": _decode_dtype,
    "fraction": _decode_fraction,
    "opaque": _decode_opaque,
    "vendor": _decode_vendor,
}


def _decode_two_keyed(data: dict[str, Any], where: str, depth: int) -> Any:
    if set(data) == {"record", "fields"}:
        return _decode_record(data, where, depth)
    if set(data) == {"enum", "name"}:
        cls = _records().get(data["enum"]) if type(data["enum"]) is str else None
        if cls is None or not issubclass(cls, enum.Enum):
            raise WireError(f"{where}.enum={data['enum']!r:.80} is not an enum of the kit")
        try:
            return cls[data["name"]]
        except (KeyError, TypeError):
            raise WireError(f"{where}.name={data['name']!r:.80} is not a {cls.__name__}") from None
    raise WireError(f"{where}: keys {sorted(data)} are not wire data")


def decode(data: Any, where: str = "answer", depth: int = 0) -> Any:
    """Rebuild a value from wire data; only the kit's record types and plain values.

    Raises:
        WireError: the data is not of the wire format (names the place and value).
    """
    if type(data) is dict and len(data) == 2:
        if depth > _MAX_DEPTH + 2:
            raise WireError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
        return _decode_two_keyed(data, where, depth + 1)
    return _decode_single(data, where, depth)


# -- exceptions ----------------------------------------------------------------------


@cache
def _known_errors() -> Mapping[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module_name in _ERROR_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException):
                found.setdefault(_name(value), value)
    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            found.setdefault(_name(value), value)
    return found


_ERROR_CLASSES: dict[tuple[str, type[BaseException]], type[BaseException]] = {}


def _builder_error_class(name: str, base: type[BaseException]) -> type[BaseException]:
    cached = _ERROR_CLASSES.get((name, base))
    if cached is not None:
        return cached
    module, _, qualname = name.partition(":")
    made: type[BaseException] = type(
        qualname.rpartition(".")[2] or "BuilderError",
        (base,),
        {
            "__module__": module,
            "__qualname__": qualname,
            "__doc__": f"The kit's stand-in for the builder's exception class {name}.",
        },
    )
    _ERROR_CLASSES[(name, base)] = made
    return made


def as_builders(exc: BaseException) -> BaseException:
    """``exc`` as an exception of the builder's own: a stand-in named like its class.

    For an error of the kit's class that the builder's process reported where
    no code of the kit ran (a kvref-native builder's hook): the builder raised
    it, so it is a finding about the builder, not the kit's failure.
    """
    cls = _builder_error_class(f"{type(exc).__module__}:{type(exc).__qualname__}", RuntimeError)
    made = cls.__new__(cls)
    BaseException.__init__(made, str(exc))
    return made


def decode_exception(data: Any, where: str = "exception") -> BaseException:
    """The exception the kit raises for one the builder's process reported.

    The class is the kit's own: the reported class itself when the kit knows
    it (builtins, kvref's errors, the kit's), else a class named like the
    builder's and derived from the nearest known class of its MRO.

    Raises:
        WireError: the data is not an exception of the wire format.
    """
    from conformance.errors import KitError

    if type(data) is not dict or set(data) != {"mro", "message", "traceback", "fields"}:
        raise WireError(f"{where}={data!r:.120} is no exception")
    mro, message, fields = data["mro"], data["message"], data["fields"]
    if type(mro) is not list or not mro or not all(type(m) is str for m in mro):
        raise WireError(f"{where}.mro={mro!r:.120} must be a list of class names")
    if type(message) is not str or type(fields) is not dict:
        raise WireError(f"{where}: message and fields must be a string and an object")
    known = _known_errors()
    base = next((known[m] for m in mro if m in known), Exception)
    if base is KitError:
        return KitError(
            str(fields.get("where", "builder's process")),
            message.partition(": ")[2] or message,
            str(fields.get("detail", "")),
        )
    cls = base if known.get(mro[0]) is base else _builder_error_class(mro[0], base)
    made = cls.__new__(cls)
    BaseException.__init__(made, message)
    for name, value in fields.items():
        if type(value) is int:
            setattr(made, name, value)
    return made
