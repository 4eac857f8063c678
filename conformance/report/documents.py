"""Reading the JSON documents a run is handed back: its reports, shards, baselines, corpus.

A file the kit reads is data whoever could write it chose, and the kit
trusts some of them with a verdict (a baseline excuses failures, a shard's
counts become the whole run's).  So each is read here, whole, before use:
a bounded size, strict JSON (no ``NaN``, no nesting deep enough to exhaust
the parser's stack), and a shape checked against a JSON schema
(:func:`schema_error`: the kit's own ``report.schema.json`` for reports).
A document that fails is refused with a message naming the file and the
field, which every front end reports as a usage error (exit 2), never as a
verdict or a traceback.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["MAX_DOCUMENT_BYTES", "DocumentError", "read_json", "report_schema", "schema_error"]

#: The largest JSON document the kit reads (a whole run's report is a few MiB).
MAX_DOCUMENT_BYTES = 256 << 20
#: The deepest nesting accepted (a report nests about 10 levels; CPython's parser recurses).
MAX_DEPTH = 64


class DocumentError(ValueError):
    """A document cannot be used; the message names the file and the field."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Path, where: str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON value of the file at ``path`` (``where``: how messages name it).

    Raises:
        DocumentError: not a regular file, larger than ``max_bytes``, unreadable,
            not UTF-8, not strict JSON, or nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        if not path.is_file():
            what = (
                "it is a directory, not a file"
                if path.is_dir()
                else "it does not exist"
                if not path.exists()
                else "it is not a regular file"
            )
            raise DocumentError(f"{where} cannot be read: {what}")
        size = path.stat().st_size
        if size > max_bytes:
            raise DocumentError(f"{where} has {size} bytes, over the {max_bytes} the kit reads")
        with path.open("rb") as stream:
            raw = stream.read(max_bytes + 1)
    except OSError as exc:
        raise DocumentError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise DocumentError(f"{where} is over the {max_bytes} bytes the kit reads")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{where} is not UTF-8 text: {exc}") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise DocumentError(f"{where} nests deeper than JSON the kit reads") from None
    except ValueError as exc:
        raise DocumentError(f"{where} is not JSON: {exc}") from None
    if _depth(data) > MAX_DEPTH:
        raise DocumentError(f"{where} nests deeper than {MAX_DEPTH} levels")
    return data


def _depth(value: Any) -> int:
    """How deeply ``value`` nests, counted level by level over its containers only."""
    depth, level = 0, [value]
    while level and depth <= MAX_DEPTH:
        depth += 1
        inner: list[Any] = []
        for item in level:
            items = item.values() if isinstance(item, dict) else item
            if isinstance(item, (dict, list)):
                inner.extend(v for v in items if isinstance(v, (dict, list)))
        level = inner
    return depth


@cache
def report_schema() -> Mapping[str, Any]:
    """The JSON schema of a ``--json`` report (``report.schema.json``, shipped with the kit)."""
    loaded: Mapping[str, Any] = json.loads(
        (Path(__file__).parent / "report.schema.json").read_text(encoding="utf-8")
    )
    return loaded


def _is_number(value: Any) -> bool:
    # A JSON integer of any size is a number; a float must be finite (no NaN crossed the parser).
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_error(
    value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None, at: str = ""
) -> str | None:
    """The first place where ``value`` breaks ``schema`` (``None``: it conforms).

    The subset of JSON Schema the kit's schemas use: ``type``, ``enum``,
    ``const``, ``properties``, ``required``, ``additionalProperties``,
    ``items``, ``minItems``/``maxItems``, ``minimum``/``maximum``/
    ``exclusiveMinimum``, ``pattern``, ``allOf``, ``if``/``then`` and local
    ``$ref``.  The answer names the field as ``a.b[3].c`` and its value.
    """
    root = schema if root is None else root
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return schema_error(value, target, root, at)
    name, shown = at or "the document", f"{value!r:.80}"
    found = _value_error(value, schema, name, shown) or _bounds_error(value, schema, name, shown)
    if found:
        return found
    if isinstance(value, dict):
        found = _object_error(value, schema, root, at)
    elif isinstance(value, list):
        found = _array_error(value, schema, root, at)
    for part in () if found else schema.get("allOf", ()):
        if "if" not in part:
            found = schema_error(value, part, root, at)
        elif schema_error(value, part["if"], root, at) is None and "then" in part:
            found = schema_error(value, part["then"], root, at)
        if found:
            break
    return found


def _value_error(value: Any, schema: Mapping[str, Any], name: str, shown: str) -> str | None:
    types = schema.get("type")
    allowed = [] if types is None else [types] if isinstance(types, str) else list(types)
    if allowed and not any(_TYPES[t](value) for t in allowed):
        return f"{name} {shown} is not {' or '.join(allowed)}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{name} {shown} is not {schema['const']!r}"
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        return f"{name} {shown} is not one of {schema['enum']}"
    return None


def _same(value: Any, wanted: Any) -> bool:
    # JSON's true is not 1: compare the types too.
    return type(value) is type(wanted) and value == wanted


def _bounds_error(value: Any, schema: Mapping[str, Any], name: str, shown: str) -> str | None:
    problems: list[str] = []
    if _is_number(value):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"is below its minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"is above its maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            problems.append(f"must be above {schema['exclusiveMinimum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        problems.append(f"does not match {schema['pattern']!r}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append(f"has {len(value)} items, fewer than {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"has {len(value)} items, more than {schema['maxItems']}")
    return f"{name} {shown} {problems[0]}" if problems else None


def _object_error(
    value: dict[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any], at: str
) -> str | None:
    for key in schema.get("required", ()):
        if key not in value:
            return f"{at + '.' if at else ''}{key} is missing"
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        where = f"{at}.{key}" if at else str(key)
        if key in properties:
            found = schema_error(item, properties[key], root, where)
        elif extra is False:
            found = f"{where} is not a field of this document"
        elif isinstance(extra, dict):
            found = schema_error(item, extra, root, where)
        else:
            found = None
        if found:
            return found
    return None


def _array_error(
    value: list[Any], schema: Mapping[str, Any], root: Mapping[str, Any], at: str
) -> str | None:
    items = schema.get("items")
    if not isinstance(items, dict):
        return None
    for index, item in enumerate(value):
        found = schema_error(item, items, root, f"{at or 'the document'}[{index}]")
        if found:
            return found
    return None
