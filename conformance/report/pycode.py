"""Counterexamples as Python: source that rebuilds a failing input as objects.

A vendor pastes it into a debugger session, or :func:`conformance.reproduce`
executes it, to get the very specs, config and workers the kit generated.
"""

from __future__ import annotations

import dataclasses
import enum
import fractions
from collections.abc import Mapping
from typing import Any

import attrs

from conformance.report.records import left_to_planning
from kvref.interop.vllm_vendor import vendor_origin

__all__ = ["PythonWriter", "to_python"]


class PythonWriter:
    """Renders values as Python expressions and collects the imports they need."""

    def __init__(self) -> None:
        self.imports: dict[str, set[str]] = {}

    def _need(self, cls: Any) -> str:
        module, name = str(cls.__module__), str(cls.__qualname__)
        root = name.split(".", maxsplit=1)[0]
        self.imports.setdefault(module, set()).add(root)
        return name

    def expr(self, value: Any) -> str:
        """A Python expression that evaluates to ``value``."""
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return repr(value)
        if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
            self.imports.setdefault("torch", set())
            return str(value)
        if isinstance(value, enum.Enum):
            return f"{self._need(type(value))}.{value.name}"
        if isinstance(value, fractions.Fraction):
            # A fractional tokens_per_state: repr() alone would need an import.
            return f"{self._need(fractions.Fraction)}({value.numerator}, {value.denominator})"
        return self._compound(value)

    def _compound(self, value: Any) -> str:
        if vendor_origin(value) is not None:
            # A stand-in for a vendor's vLLM spec subclass is not importable:
            # rebuild it from the vendor's own class (importable where it runs).
            from kvref.interop.vllm_convert import spec_from_vllm, spec_to_vllm

            return f"{self._need(spec_from_vllm)}({self._compound(spec_to_vllm(value))})"
        if attrs.has(type(value)):
            return self._record(
                value, [(f.name, f.default, f.init) for f in attrs.fields(type(value))]
            )
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = [(f.name, f.default, f.init) for f in dataclasses.fields(value)]
            return self._record(value, fields)
        return self._container(value)

    def _container(self, value: Any) -> str:
        if isinstance(value, Mapping):
            items = ", ".join(f"{self.expr(k)}: {self.expr(v)}" for k, v in value.items())
            return "{" + items + "}"
        if isinstance(value, frozenset):
            return "frozenset({" + ", ".join(self.expr(v) for v in sorted(value, key=repr)) + "})"
        if isinstance(value, tuple):
            inner = ", ".join(self.expr(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self.expr(v) for v in value) + "]"
        return repr(value)

    def _record(self, value: Any, fields: list[tuple[str, Any, bool]]) -> str:
        parts = []
        for name, default, init in fields:
            if not init or left_to_planning(value, name):
                continue
            current = getattr(value, name)
            if _is_default(current, default):
                continue
            parts.append(f"{name}={self.expr(current)}")
        return f"{self._need(type(value))}({', '.join(parts)})"

    def header(self) -> str:
        """The import lines the rendered expressions need."""
        lines = []
        for module in sorted(self.imports):
            names = self.imports[module]
            if not names:
                lines.append(f"import {module}")
            else:
                lines.append(f"from {module} import {', '.join(sorted(names))}")
        return "\n".join(lines)


def _is_default(current: Any, default: Any) -> bool:
    if default is attrs.NOTHING or default is dataclasses.MISSING:
        return False
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return False
    try:
        return bool(current == default) and type(current) is type(default)
    except Exception:
        return False


def to_python(assignments: Mapping[str, Any]) -> str:
    """Source that assigns each name of ``assignments`` its value, with the imports first."""
    writer = PythonWriter()
    body = [f"{name} = {writer.expr(value)}" for name, value in assignments.items()]
    return writer.header() + "\n\n" + "\n".join(body) + "\n"
