"""Reach: which lines of the builder's own code the run executed.

A verdict about code the run never entered says nothing.  A vendor builder
typically calls ``super()`` for ordinary models and specialises on a few
families; reach tells whether the run got into those specialisations.

Reach is measured with coverage.py (the ``reach`` extra, or ``pip install
coverage``).  Which modules count is :func:`reach_scope`'s rule
(docs/vendors.md, "Which modules reach counts"):

- a vendor's builder: the classes of its MRO in its own top-level package,
  whole, and every function and class of that package their code names,
  directly or through each other, entered or not (a gated helper the run
  never entered counts as unreached).  A helper of the same package that
  none of this code names (another builder's) is not this builder's code
  (:mod:`conformance.harness.call_graph` gives the rule);
- a builder of a platform the kit plans against (kvref's reference, vLLM's
  default builder): the modules that define the classes of its MRO, every
  function counted, plus the modules of the platform whose functions its
  hooks entered, counted over the functions entered only (the rest of such
  a module is the platform's, not the builder's);
- ``--reach MODULE,...``: exactly those modules, every function counted.

It is an observation of the run, not an invariant: it fails the run only
below ``--min-reach``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from conformance.harness.call_graph import callee_closure

__all__ = [
    "line_tracer",
    "PLATFORMS",
    "module_figures",
    "reach_summary",
    "ReachError",
    "ReachMeter",
    "ReachScope",
    "builder_modules",
    "format_ranges",
    "reach_scope",
]

#: The top-level packages of the platforms the kit plans against.  A
#: builder defined in one of them is the platform's own (kvref's reference,
#: vLLM's default builder): its package is the whole platform, most of which
#: is not the builder's code.
PLATFORMS = ("kvref", "vllm")


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


def _source_of(module_name: str) -> Path | None:
    """The ``.py`` file of an imported (or importable) module, ``None`` for anything else."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            return None
        path = None if spec is None else spec.origin
    if path is None or not str(path).endswith(".py"):
        return None
    return Path(path).resolve()


@attrs.frozen
class ReachScope:
    """The modules reach counts for one builder (see :func:`reach_scope`).

    Attributes:
        own: modules whose counted functions are the builder's own code.
        platform: the platform's package directory when the builder is a
            platform's own; its other modules count where the hooks entered
            them, over the functions entered only.  ``None`` for a vendor's builder.
        counted: for a vendor's builder, each own module's top-level names
            whose functions count (``*``: every function); a module not in it
            counts whole.  ``None``: every own module counts whole.
    """

    own: tuple[Path, ...]
    platform: Path | None = None
    counted: dict[str, frozenset[str]] | None = None


def _builder_class(builder: object) -> type:
    cls = builder if isinstance(builder, type) else type(builder)
    # A vLLM-native builder wrapped by the kit's adapter is the native class's code.
    native: type = getattr(cls, "native_cls", cls)
    return native


def reach_scope(builder: object) -> ReachScope:
    """Which modules hold ``builder``'s code (the rule of the module docstring).

    The MRO's classes count where they are defined in the builder's own
    top-level package: a vendor builder's parents in kvref or vLLM are the
    platform's code, measured (and judged) as the platform's.
    """
    cls = _builder_class(builder)
    top = cls.__module__.partition(".")[0]
    mro_modules = [
        c.__module__
        for c in cls.__mro__
        if c is not object and c.__module__.partition(".")[0] == top
    ]
    if top in PLATFORMS:
        roots = list(dict.fromkeys(mro_modules))
        own = sorted({p for m in roots if (p := _source_of(m)) is not None})
        package = _source_of(top)
        return ReachScope(tuple(own), None if package is None else package.parent)
    classes = [
        (c.__module__, c.__qualname__.partition(".")[0])
        for c in cls.__mro__
        if c is not object and c.__module__.partition(".")[0] == top
    ]
    found = callee_closure(classes, top, _source_of)
    files = {m: path.resolve() for m, path in found.files.items()}
    return ReachScope(
        tuple(sorted(set(files.values()))),
        None,
        {str(files[m]): names for m, names in found.names.items()},
    )


def builder_modules(builder: object) -> list[Path]:
    """The source files whose every function counts as the builder's (``reach_scope(...).own``)."""
    return list(reach_scope(builder).own)


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


def _own_lines(node: ast.AST) -> set[int]:
    """The statement lines of a function's body, less those of functions and classes inside it."""
    lines: set[int] = set()
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, ast.stmt):
            lines.add(child.lineno)
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(child))
    # The signature's own lines (decorators, defaults) are not the body.
    lines.discard(getattr(node, "lineno", -1))
    return lines


def _functions(source: Path) -> list[tuple[str, set[int]]]:
    """``(qualified name, body lines)`` of every function in ``source``, nested ones apart."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found: list[tuple[str, set[int]]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, _own_lines(child)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def line_tracer(files: Sequence[str]) -> Any:
    """A coverage.py tracer of ``files``' lines, not started (the kit's and the worker's)."""
    import coverage

    cov = coverage.Coverage(data_file=None, include=list(files), branch=False, config_file=False)
    # Reach is read after every scenario; a builder whose own code has not
    # run yet (its grouping inherited, say) is a figure of 0, not a warning.
    cov.set_option("run:disable_warnings", ["no-data-collected"])
    return cov


@attrs.define
class ReachMeter:
    """Measures the reach of a run (start, run, stop, then :meth:`summary`).

    Attributes:
        files: what is traced (coverage.py ``include`` patterns): the own
            modules, and the platform's directory for a platform's builder.
            An isolated run's worker traces the same (``worker_side._start_reach``,
            through :func:`line_tracer`).
        own: the modules every function of which counts.
        platform: the directory whose other modules count over the
            functions the hooks entered (``None``: none).
    """

    files: Sequence[Path]
    min_reach: float | None = None
    _cov: Any = None
    #: Lines executed elsewhere (an isolated run's worker process), by file.
    remote: dict[str, set[int]] = attrs.field(factory=dict)
    own: Sequence[Path] | None = attrs.field(default=None, kw_only=True)
    platform: Path | None = attrs.field(default=None, kw_only=True)
    #: Per own module (resolved path), the top-level names that count (:class:`ReachScope`).
    counted: dict[str, frozenset[str]] | None = attrs.field(default=None, kw_only=True)

    def lines_reached(self, builder: object) -> int:
        """``builder``'s lines run so far, here and in its worker (exploration's signal)."""
        worker = getattr(builder, "_kvref_worker", None)
        if worker is not None:
            self.add_lines(worker.reach_lines())
        return self.executed_count()

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
        """A meter over the builder's code (:func:`reach_scope`), or ``modules`` when given.

        Raises:
            ReachError: coverage.py is not installed, or a module cannot be found.
        """
        if importlib.util.find_spec("coverage") is None:
            raise ReachError(
                "measuring reach needs coverage.py: pip install coverage (the kit's 'reach' extra)"
            )
        if modules:
            files = [_module_file(m) for m in modules]
            return cls(files=files, min_reach=min_reach, own=files)
        scope = reach_scope(builder)
        traced = list(scope.own)
        if scope.platform is not None:
            # A glob: coverage.py's '*' crosses directories, so every module of the platform.
            traced.append(scope.platform / "*")
        return cls(
            files=traced,
            min_reach=min_reach,
            own=scope.own,
            platform=scope.platform,
            counted=scope.counted,
        )

    def start(self, *, trace_here: bool = True) -> None:
        """Start tracing the threads that call the builder from now on.

        ``trace_here=False`` traces nothing in this process: the builder runs
        elsewhere (an isolated worker) and its lines arrive by :meth:`add_lines`.
        """
        self._cov = line_tracer([str(f) for f in self.files])
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

    def _executed(self) -> dict[str, set[int]]:
        """Every line that ran, by resolved file: traced here and sent from a worker."""
        found = {p: set(lines) for p, lines in self.remote.items()}
        data = self._cov.get_data()
        for path in data.measured_files():
            found.setdefault(str(Path(path).resolve()), set()).update(data.lines(path) or ())
        return found

    def executed_count(self) -> int:
        """How many lines of the traced files have run so far (exploration's signal)."""
        return sum(len(lines) for lines in self._executed().values())

    def _callees(self, executed: dict[str, set[int]], own: Sequence[Path]) -> list[Path]:
        """The platform's other modules whose functions ran (a platform builder's callees)."""
        if self.platform is None:
            return []
        root, mine = self.platform.resolve(), {p.resolve() for p in own}
        found = []
        for name, lines in executed.items():
            path = Path(name)
            if lines and path not in mine and path.suffix == ".py" and path.is_relative_to(root):
                found.append(path)
        return sorted(found)

    def _module(self, path: Path, executed: set[int], whole: bool) -> dict[str, Any] | None:
        """One module's figures; a callee (``whole=False``) over its entered functions only."""
        _, all_statements, _excluded, _missing, _ = self._cov.analysis2(str(path))
        functions = [(i, n, body) for i, (n, body) in enumerate(_functions(path))]
        names = (self.counted or {}).get(str(Path(path).resolve()))
        if whole and names is not None and "*" not in names:
            # Another builder's helpers in a shared module are not this builder's code.
            functions = [f for f in functions if f[1].partition(".")[0] in names]
        if not whole:
            # Only what the hooks entered is the builder's; the rest is the platform's.
            functions = [f for f in functions if f[2] & executed]
            if not functions:
                return None
        statements = set(all_statements)
        counted = [(i, name, body & statements) for i, name, body in functions]
        return module_figures(str(path), whole, counted, executed)

    def summary(self) -> dict[str, Any]:
        """What the run reached: per module and in total, with the lines for the report."""
        executed = self._executed()
        own = list(self.own if self.own is not None else self.files)
        listed = [(p, True) for p in own] + [(p, False) for p in self._callees(executed, own)]
        modules = []
        for path, whole in listed:
            module = self._module(path, executed.get(str(Path(path).resolve()), set()), whole)
            if module is not None:
                modules.append(module)
        return reach_summary(modules, self.min_reach)


def module_figures(
    path: str, whole: bool, functions: Sequence[tuple[int, str, set[int]]], executed: set[int]
) -> dict[str, Any]:
    """One module's reach figures from its counted functions and the lines executed.

    ``functions``: ``(position in the source, qualified name, statement lines
    of its body)`` of every function that counts.  Module and class bodies ran
    at import, before the run: only the code inside functions says what the
    run reached.  ``functions`` and ``ran`` are in the figures too, so that the
    reports of a sharded run can be joined (:mod:`conformance.merge`).
    """
    statements = set().union(*(body for _, _, body in functions)) if functions else set()
    ran = statements & executed
    missing = statements - ran
    unreached = [name for _, name, body in functions if body and not body & ran]
    count = len(statements)
    return {
        "path": path,
        "statements": count,
        "executed": len(ran),
        "percent": round(100.0 * len(ran) / count, 1) if count else 100.0,
        "missing": format_ranges(missing),
        "unreached_functions": unreached,
        "role": "own" if whole else "callee",
        "functions": [[i, name, sorted(body)] for i, name, body in functions],
        "ran": sorted(ran),
    }


def reach_summary(modules: list[dict[str, Any]], min_reach: float | None) -> dict[str, Any]:
    """The reach section of a report over ``modules`` (:func:`module_figures`'s)."""
    total = sum(m["statements"] for m in modules)
    hit = sum(m["executed"] for m in modules)
    percent = round(100.0 * hit / total, 1) if total else 100.0
    below = min_reach is not None and percent < min_reach
    data: dict[str, Any] = {
        "percent": percent,
        "statements": total,
        "executed": hit,
        "modules": modules,
        "min_reach": min_reach,
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
            "give the kit your models with --models, or explore with --explore SECONDS, so it "
            "reaches it."
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
