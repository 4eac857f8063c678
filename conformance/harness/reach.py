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

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from conformance.harness.call_graph import callee_closure

__all__ = [
    "line_tracer",
    "PLATFORMS",
    "ReachError",
    "ReachMeter",
    "ReachScope",
    "builder_modules",
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
    """Measures the reach of a run (start, run, stop; the reach extension sums it up).

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

    def executed(self) -> dict[str, set[int]]:
        """Every line that ran, by resolved file: traced here and sent from a worker."""
        found = {p: set(lines) for p, lines in self.remote.items()}
        data = self._cov.get_data()
        for path in data.measured_files():
            found.setdefault(str(Path(path).resolve()), set()).update(data.lines(path) or ())
        return found

    def executed_count(self) -> int:
        """How many lines of the traced files have run so far (exploration's signal)."""
        return sum(len(lines) for lines in self.executed().values())

    def statements(self, path: Path) -> set[int]:
        """The statement lines of the traced file ``path``, as coverage.py parses them."""
        _, found, _excluded, _missing, _ = self._cov.analysis2(str(path))
        return set(found)
