"""Where the builder's code may run, and what the kit knows of a builder without running it.

The kit judges; the builder's code runs in a worker process
(:mod:`conformance.harness.isolate`), and what the kit needs to know of the
builder (its name, its parent builder, whether it is vLLM-native, the
files of its reach) comes from there as data.  :func:`prepare` is the one
place that decides, for every front end, how the run reaches the builder:
isolated by default, by name where a name is given (the builder's module is
then never imported in the kit's process), or in this process for debugging
(``isolate=False``: a builder can then patch the kit, so such verdicts are
not for release decisions).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from conformance.errors import OptionError
from conformance.harness.reach import ReachError, ReachMeter
from kvref.builder import KVCacheConfigBuilder

__all__ = ["Prepared", "prepare"]

Builder = KVCacheConfigBuilder | type[KVCacheConfigBuilder]


@attrs.frozen
class Prepared:
    """The builder as the run reaches it, and the reach meter of the run (``None``: none).

    Attributes:
        builder: the builder, or the proxy of its isolated worker.
        meter: the run's reach meter (``None``: reach not measured).
        owned: :func:`prepare` started the worker, so the run closes it when it
            ends (a proxy the caller isolated is the caller's to close).
    """

    builder: Builder
    meter: ReachMeter | None
    owned: bool = False

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *_exc: object) -> None:
        """Close the worker :func:`prepare` started (a caller's own proxy stays open)."""
        if self.owned:
            self.builder.close()  # type: ignore[union-attr]


def _check_min_reach(reach: bool | Sequence[str] | None, min_reach: float | None) -> None:
    if min_reach is not None and (
        isinstance(min_reach, bool)
        or not isinstance(min_reach, (int, float))
        or not 0 <= min_reach <= 100
    ):
        raise OptionError(f"min_reach={min_reach!r} must be a percentage between 0 and 100")
    if (reach is False or reach is None) and min_reach is not None:
        raise OptionError("min_reach needs reach measured (reach=True or module names)")


def prepare(
    builder: Builder | str,
    name: str | None,
    *,
    isolate: bool,
    reach: bool | Sequence[str] | None,
    min_reach: float | None,
    memory: int | None = None,
) -> Prepared:
    """Reach the builder the way the run will, and set up its reach meter.

    ``memory``: bytes the isolated worker may take over its start (``None``:
    the default limit).  A proxy the caller isolated already keeps its own.

    Raises:
        OptionError: the builder cannot be loaded, or the reach options are unusable.
    """
    from conformance.harness.adapters import BuilderLoadError, load_builder, native_adapter

    _check_min_reach(reach, min_reach)
    try:
        # A vLLM-native class or instance runs behind the vLLM adapter, as a named one does.
        builder = native_adapter(builder, name)
    except BuilderLoadError as exc:
        raise OptionError(str(exc)) from None
    _check_is_builder(builder)
    wanted = None if reach is False or reach is None else reach
    if isolate:
        from conformance.harness.isolate import IsolatedBuilder, isolated

        cls = builder if isinstance(builder, type) else None
        owned = True
        if cls is not None and issubclass(cls, IsolatedBuilder):
            # Isolated by the caller (the plugin keeps one per session), with its reach.
            proxy: type[IsolatedBuilder] = cls
            owned = False
        else:
            if wanted is not None:
                _reach_available()
            try:
                proxy = isolated(builder, name, reach=wanted, memory=memory)
            except BuilderLoadError as exc:
                raise OptionError(str(exc)) from None
        meter = None if wanted is None else _worker_meter(proxy, min_reach)
        return Prepared(proxy, meter, owned)
    if isinstance(builder, str):
        try:
            builder = load_builder(builder)
        except BuilderLoadError as exc:
            raise OptionError(str(exc)) from None
    if wanted is None:
        return Prepared(builder, None)
    modules = None if wanted is True else [str(m) for m in wanted]
    try:
        return Prepared(builder, ReachMeter.for_builder(builder, modules, min_reach))
    except ReachError as exc:
        raise OptionError(str(exc)) from None


def _check_is_builder(builder: object) -> None:
    """Refuse what is neither a builder's name nor a builder class or instance.

    Asked of the object's type as Python keeps it (``type()``, not
    ``__class__``), so nothing of the object runs here.

    Raises:
        OptionError: ``builder`` is something else (``print``, a module, a spec...).
    """
    if isinstance(builder, str):
        return
    cls = builder if isinstance(builder, type) else type(builder)
    if issubclass(cls, KVCacheConfigBuilder):
        return
    what = f"class {cls.__qualname__}" if cls is builder else f"a {cls.__qualname__} object"
    raise OptionError(
        f"builder: {what} is not a KV cache config builder class or "
        "instance (a subclass of kvref.KVCacheConfigBuilder or of vLLM's "
        "KVCacheConfigBuilder), nor its importable name 'module:Class'"
    )


def _worker_meter(proxy: type[Any], min_reach: float | None) -> ReachMeter:
    """The meter of a run whose builder runs in a worker: the files as the worker found them.

    Computed in the worker (finding the files imports the builder's modules).
    """
    files = [Path(f) for f in proxy.__dict__.get("kvref_reach_files", ())]
    scope = proxy.__dict__.get("kvref_reach_scope", {})
    own = scope.get("own")
    platform = scope.get("platform")
    counted = scope.get("counted")
    return ReachMeter(
        files=files,
        min_reach=min_reach,
        own=None if own is None else [Path(f) for f in own],
        platform=None if platform is None else Path(platform),
        counted=None
        if counted is None
        else {path: frozenset(names) for path, names in counted.items()},
    )


def _reach_available() -> None:
    import importlib.util

    if importlib.util.find_spec("coverage") is None:
        raise OptionError("reach needs coverage.py: pip install coverage (or the reach extra)")
