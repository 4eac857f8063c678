"""Reach: which lines of the builder's own code the run executed.

A verdict about code the run never entered says nothing.  A vendor builder
typically calls ``super()`` for ordinary models and specialises on a few
families; reach tells whether the run got into those specialisations.

Reach is measured with coverage.py (the ``reach`` extra, or ``pip install coverage``) over the
module that defines the builder class and the other modules of its package,
or the modules named with ``--reach``.  It is an observation of the run, not
an invariant: it fails the run only below ``--min-reach``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ReachError", "ReachMeter", "builder_modules", "format_ranges"]


class ReachError(ValueError):
    """Reach cannot be measured as asked (no coverage.py, a module that does not exist)."""


def _module_file(name: str) -> Path:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ReachError(f"reach module {name!r} cannot be found: {exc}") from None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ReachError(f"reach module {name!r} is not a Python source module")
    return Path(spec.origin).resolve()


def builder_modules(builder: object) -> list[Path]:
    """The source files of the builder's own code: its class's module and its package's modules.

    A vLLM-native builder wrapped by the kit's adapter is measured in the
    native class's module.  Classes up the hierarchy that live elsewhere (the
    reference or vLLM's default builder) are not the vendor's code.
    """
    cls = builder if isinstance(builder, type) else type(builder)
    cls = getattr(cls, "native_cls", cls)
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None:
        return []
    source = Path(path).resolve()
    package = cls.__module__.rpartition(".")[0]
    if not package or source.name == "__init__.py":
        return [source]
    return sorted(p.resolve() for p in source.parent.glob("*.py"))


def format_ranges(lines: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"``."""
    out: list[str] = []
    ordered = sorted(set(lines))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def _functions(source: Path) -> list[tuple[str, set[int]]]:
    """``(qualified name, body lines)`` of every function in ``source``."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found: list[tuple[str, set[int]]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                body = {
                    n.lineno
                    for stmt in child.body
                    for n in ast.walk(stmt)
                    if isinstance(n, ast.stmt)
                }
                found.append((name, body))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


@attrs.define
class ReachMeter:
    """Measures the reach of a run over ``files`` (start, run, stop, then :meth:`summary`)."""

    files: Sequence[Path]
    min_reach: float | None = None
    _cov: Any = None
    #: Lines executed elsewhere (an isolated run's worker process), by file.
    remote: dict[str, set[int]] = attrs.field(factory=dict)

    def add_lines(self, lines: dict[str, set[int]]) -> None:
        """Count ``lines`` (file to executed line numbers) as reached too."""
        for path, found in lines.items():
            self.remote.setdefault(str(Path(path).resolve()), set()).update(found)

    @classmethod
    def for_builder(
        cls,
        builder: object,
        modules: Sequence[str] | None = None,
        min_reach: float | None = None,
    ) -> ReachMeter:
        """A meter over the builder's own modules, or ``modules`` when given.

        Raises:
            ReachError: coverage.py is not installed, or a module cannot be found.
        """
        if importlib.util.find_spec("coverage") is None:
            raise ReachError(
                "measuring reach needs coverage.py: pip install coverage (the kit's 'reach' extra)"
            )
        files = [_module_file(m) for m in modules] if modules else builder_modules(builder)
        return cls(files=files, min_reach=min_reach)

    def start(self, *, trace_here: bool = True) -> None:
        """Start tracing the threads that call the builder from now on.

        ``trace_here=False`` traces nothing in this process: the builder runs
        elsewhere (an isolated worker) and its lines arrive by :meth:`add_lines`.
        """
        import coverage

        self._cov = coverage.Coverage(
            data_file=None,
            include=[str(f) for f in self.files],
            branch=False,
            config_file=False,
        )
        if not trace_here:
            return
        self._cov.start()
        # Builders run only in the guard's threads (coverage traces every new
        # thread); the kit's own work in this thread (generation, the memory
        # sweeps, the reference it consults) is neither the builder's reach nor
        # worth the tracing cost.
        if sys.gettrace() is not None:
            sys.settrace(None)

    def stop(self) -> None:
        """Stop tracing."""
        if self._cov is not None:
            self._cov.stop()

    def summary(self) -> dict[str, Any]:
        """What the run reached: per file and in total, with the lines for the report."""
        modules = []
        total = hit = 0
        for path in self.files:
            _, all_statements, _excluded, all_missing, _ = self._cov.analysis2(str(path))
            functions = _functions(path)
            # Module and class bodies ran at import, before the run: only the
            # code inside functions says what the run reached.
            inside = set().union(*(body for _, body in functions)) if functions else set()
            statements = set(all_statements) & inside
            missing = (set(all_missing) & inside) - self.remote.get(str(path), set())
            executed = statements - missing
            unreached = [
                name for name, body in functions if body & statements and not body & executed
            ]
            count = len(statements)
            total += count
            hit += len(executed)
            modules.append(
                {
                    "path": str(path),
                    "statements": count,
                    "executed": len(executed),
                    "percent": round(100.0 * len(executed) / count, 1) if count else 100.0,
                    "missing": format_ranges(missing),
                    "unreached_functions": unreached,
                }
            )
        percent = round(100.0 * hit / total, 1) if total else 100.0
        below = self.min_reach is not None and percent < self.min_reach
        data: dict[str, Any] = {
            "percent": percent,
            "statements": total,
            "executed": hit,
            "modules": modules,
            "min_reach": self.min_reach,
            "below_minimum": below,
        }
        data["lines"] = _lines(data)
        return data


def _lines(data: dict[str, Any]) -> list[str]:
    lines = ["Reach (the builder's own code the run executed):"]
    for m in data["modules"]:
        path = _short(m["path"])
        text = f"  reached {m['percent']:.0f}% of {path}"
        if m["missing"]:
            text += f" (not reached: {m['missing']})"
        lines.append(text)
    if len(data["modules"]) > 1:
        lines.append(f"  reached {data['percent']:.0f}% in all")
    unreached = [f for m in data["modules"] for f in m["unreached_functions"]]
    if unreached:
        shown = ", ".join(f"{f}()" for f in unreached[:8])
        more = f" and {len(unreached) - 8} more" if len(unreached) > 8 else ""
        lines.append(
            f"  WARNING: never entered: {shown}{more}. Verdicts say nothing about that code; "
            "give the kit your models with --models so it reaches it."
        )
    if data["below_minimum"]:
        lines.append(
            f"  FAILED: reach {data['percent']:.1f}% is below --min-reach {data['min_reach']:g}%"
        )
    return lines


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
