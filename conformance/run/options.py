"""The options of one kit run, checked before any long work starts.

Every front end (``check_builder``, the CLI, the pytest plugin) builds a
:class:`RunOptions`; bad values raise :class:`OptionError` naming the option
and the value, and the printed reproduce lines are made from the same
record, so they carry every option that shaped the run.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable
from typing import Any

import attrs

__all__ = ["PROFILES", "OptionError", "RunOptions"]

#: Examples per scenario for each profile.
PROFILES: dict[str, int] = {"ci": 50, "thorough": 500}


class OptionError(ValueError):
    """An option of the run has a value the kit cannot use."""


def _ids(values: Iterable[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip().upper() for v in values)


def _xfail_ids(values: Iterable[str] | None) -> tuple[str, ...]:
    return _ids(values) or ()


def _strings(values: Iterable[str] | None) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip() for v in values if v.strip())


@attrs.frozen(kw_only=True)
class RunOptions:
    """What one run checks and how.

    Attributes:
        builder: the builder's importable name (``module:Class``), or ``None``
            when the builder was passed as an object that cannot be imported.
        device: torch device of the device checks.
        max_examples: examples per scenario.
        seed: the run's seed.
        profile: ``ci`` or ``thorough``.
        select: invariant ids or prefixes (``None``: all).
        xfail: ids expected to fail.
        unsupported: capabilities the builder declares it lacks.
        timeout: per-call deadline, seconds.
        max_alloc_bytes: cap of one allocation of the device checks.
        shrink: shrink failures to minimal counterexamples.
        database: Hypothesis example database directory (``None``: none).
        models: vendor models (``module:attr`` or a JSON path), mixed into generation.
        models_only: generate from the vendor models alone.
        isolate: run the builder in a worker process (:mod:`conformance.run.isolate`).
        replays: times each failure's minimal counterexample is judged again
            (:mod:`conformance.run.flakes`; 0: none).
    """

    builder: str | None
    device: str = "cpu"
    max_examples: int = PROFILES["ci"]
    seed: int = 0
    profile: str = "ci"
    select: tuple[str, ...] | None = attrs.field(default=None, converter=_ids)
    xfail: tuple[str, ...] = attrs.field(default=(), converter=_xfail_ids)
    unsupported: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    timeout: float = 10.0
    max_alloc_bytes: int | None = None
    shrink: bool = True
    database: str | None = None
    models: str | None = None
    models_only: bool = False
    isolate: bool = False
    replays: int = 2

    def validate(self, *, capabilities: Iterable[str]) -> None:
        """Raise :class:`OptionError` for the first unusable option.

        Args:
            capabilities: the capabilities the catalog knows (``unsupported`` must name them).
        """
        if self.profile not in PROFILES:
            raise OptionError(f"profile={self.profile!r} is not one of {sorted(PROFILES)}")
        _positive_int("max_examples", self.max_examples)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise OptionError(f"seed={self.seed!r} must be a non-negative int")
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise OptionError(f"timeout={self.timeout!r} must be a finite number of seconds > 0")
        if self.max_alloc_bytes is not None:
            _positive_int("max_alloc_bytes", self.max_alloc_bytes)
        if self.select is not None and not [s for s in self.select if s]:
            raise OptionError(f"select={self.select!r} selects nothing; name at least one id")
        known = set(capabilities)
        for capability in self.unsupported:
            if capability not in known:
                raise OptionError(
                    f"unsupported={capability!r} is not a capability the kit knows "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
        if isinstance(self.replays, bool) or not isinstance(self.replays, int) or self.replays < 0:
            raise OptionError(f"replays={self.replays!r} must be a non-negative int")
        if self.models_only and self.models is None:
            raise OptionError("models_only=True needs models (the vendor models to generate from)")

    def reproduce(self, invariant: str) -> str:
        """A command that reruns this run's examples for ``invariant`` alone."""
        builder = self.builder or "<builder: pass it to check_builder>"
        words = ["kvref-conformance", builder, "--select", invariant, "--seed", str(self.seed)]
        words += ["--max-examples", str(self.max_examples), "--profile", self.profile]
        words += ["--device", self.device, "--timeout", f"{self.timeout:g}"]
        if self.max_alloc_bytes is not None:
            words += ["--max-alloc-bytes", str(self.max_alloc_bytes)]
        if self.unsupported:
            words += ["--unsupported", ",".join(self.unsupported)]
        if self.models is not None:
            words += ["--models", self.models]
        if self.models_only:
            words.append("--models-only")
        if not self.shrink:
            words.append("--no-shrink")
        # Said either way: a crash contained in a worker may end an in-process run.
        words.append("--isolate" if self.isolate else "--no-isolate")
        # Replaying saved counterexamples would run other examples than the seed's.
        words.append("--no-database")
        return " ".join(shlex.quote(w) for w in words)

    def as_dict(self) -> dict[str, Any]:
        """The options as JSON-able data."""
        data = attrs.asdict(self)
        for key in ("select", "xfail", "unsupported"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name}={value!r} must be a positive int")
