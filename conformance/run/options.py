"""The options of one kit run, checked before any long work starts.

Every front end (``check_builder``, the CLI, the pytest plugin) builds one
:class:`RunOptions` and hands it whole to the run
(:func:`conformance.run.runner.check_builder`'s ``options=``); the defaults
here are the kit's defaults on every front end (isolated, reach measured when
coverage.py is installed, the ``ci`` profile).  Bad values raise
:class:`OptionError` naming the option and the value, and the printed
reproduce lines are made from the same record, so they carry every option
that shaped the run.
"""

from __future__ import annotations

import importlib.util
import math
import random
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from conformance.errors import OptionError
from conformance.flags import declared
from conformance.run.option_flags import DEFAULT_BUILDER, PROFILES, RUN_FLAGS
from kvref.errors import ConfigError
from kvref.versions import NEWEST, VllmVersion, installed_vllm_version, parse_version

if TYPE_CHECKING:
    from conformance.generate.engine_paths import EnginePath
    from conformance.run.shard import Shard

__all__ = [
    "DEFAULT_BUILDER",
    "DEFAULT_WORKER_MEMORY_GIB",
    "PROFILES",
    "OptionError",
    "RunOptions",
    "ALL_RELEASES",
    "check_device",
    "flag_message",
]


#: GiB of private memory an isolated worker may take over its size at start
#: (``RLIMIT_DATA``, :mod:`conformance.harness.worker_side`).  Planning takes
#: kilobytes to megabytes; a hook that leaks on every call stops there, with a
#: ``MemoryError`` the run reports, long before the machine swaps.  (worker_side
#: has the same default; it is not imported here: the pytest plugin reads these
#: options in every pytest session.)
DEFAULT_WORKER_MEMORY_GIB = 16.0


def _ids(values: Iterable[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip().upper() for v in values)


def _xfail_ids(values: Iterable[str] | None) -> tuple[str, ...]:
    return _ids(values) or ()


def _reach(values: bool | Iterable[str] | None) -> bool | tuple[str, ...] | None:
    if values is None or isinstance(values, bool):
        return values
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip() for v in values if v.strip())


def _strings(values: Iterable[str] | None) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = values.split(",")
    return tuple(v.strip() for v in values if v.strip())


def _default_vllm() -> str:
    """The installed vLLM when the kit supports it, else the newest supported release."""
    return str(installed_vllm_version() or NEWEST)


#: ``vllm``'s value for every supported release (the compatibility matrix).
ALL_RELEASES = "all"


def _vllm(value: object) -> str:
    """The release named, spelled in full (``0.34`` -> ``0.34.0``), checked at once."""
    if value == ALL_RELEASES:
        return ALL_RELEASES
    try:
        return str(parse_version(value, "vllm"))
    except ConfigError as exc:
        raise OptionError(str(exc)) from None


def _random_seed() -> int:
    return random.randrange(2**32)


# Each field's flags are in RUN_FLAGS (asserted when the class is made).
@attrs.frozen(kw_only=True, field_transformer=declared(RUN_FLAGS))
class RunOptions:
    """What one run checks and how: the one record every front end builds and passes whole.

    Attributes:
        builder: the builder's importable name (``module:Class``), or ``None``
            when the builder was passed as an object that cannot be imported.
        device: torch device of the device checks (:func:`check_device`).
        profile: ``ci`` (the default) or ``thorough``.
        max_examples: examples per scenario (default: the profile's).
        seed: the run's seed (default: a random one, which the report names).
        select: invariant ids or prefixes (``None``: all).
        xfail: ids expected to fail.
        unsupported: capabilities the builder declares it lacks.
        timeout: per-call deadline, seconds.
        max_alloc_bytes: cap of one allocation of the device checks.
        shrink: shrink failures to minimal counterexamples.
        database: Hypothesis example database directory (``None``: none).  The
            CLI's own default is ``.hypothesis/kvref-conformance``; a Python
            call and a pytest session save nothing unless asked.
        models: vendor models (``module:attr`` or a JSON path), mixed into generation.
        models_only: generate from the vendor models alone.
        isolate: run the builder in a worker process (:mod:`conformance.harness.isolate`).
        reach: measure which lines of the builder's code ran: ``True``, module
            names, ``False``; ``None`` (the default): measured when coverage.py
            is installed (:attr:`measured_reach`).
        min_reach: fail the run when less than this percentage of those lines ran.
        replays: times each failure's minimal counterexample is judged again
            (:mod:`conformance.extensions.flakes`; 0: none).
        worker_memory: GiB of private memory the isolated worker may take over
            its size at start (``RLIMIT_DATA``): a leaking hook then fails
            ``KV-CALL-RAISES`` with the limit named.
        focus: where the run draws its extra examples (:mod:`conformance.extensions.focus`):
            ``None`` (the default) learns it from the builder's answers, ``"off"``
            draws none, ``family=PATH,...;...`` replays a run's (its reproduce lines
            carry it).
        explore: seconds of coverage-guided exploration after the run's deals
            (:mod:`conformance.extensions.explore`; 0: none).  Needs reach measured.
        explore_candidates: stop exploring after this many candidates, whatever
            time is left (``None``: only the time limits it).
        shard: ``"I/N"``: run only the I-th of N shares of the run's strata
            (:mod:`conformance.run.shard`); ``kvref-conformance merge`` joins the
            N reports into the report of the whole run (``None``: the whole run).
        vllm: the vLLM release whose contract the run judges (``"0.33"``,
            ``"0.34.0"``...; :mod:`kvref.versions`), spelled in full; ``"all"``
            asks the CLI for the compatibility matrix (:mod:`conformance.ci.matrix`).  Default:
            the installed vLLM when the kit supports it, else the newest
            supported release.  The installed vLLM is what the vendor runs, for
            a kvref-native builder too; a vLLM-native builder can only be
            judged under it (:meth:`check_native`).
    """

    builder: str | None
    device: str = "cpu"
    profile: str = "ci"
    max_examples: int = attrs.field(
        default=attrs.Factory(lambda self: PROFILES.get(self.profile, 1), takes_self=True)
    )
    seed: int = attrs.field(factory=_random_seed)
    select: tuple[str, ...] | None = attrs.field(default=None, converter=_ids)
    xfail: tuple[str, ...] = attrs.field(default=(), converter=_xfail_ids)
    unsupported: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    timeout: float = 10.0
    max_alloc_bytes: int | None = None
    shrink: bool = True
    database: str | None = None
    models: str | None = None
    models_only: bool = False
    isolate: bool = True
    reach: bool | tuple[str, ...] | None = attrs.field(default=None, converter=_reach)
    min_reach: float | None = None
    replays: int = 2
    worker_memory: float = DEFAULT_WORKER_MEMORY_GIB
    focus: str | None = None
    explore: float = 0.0
    explore_candidates: int | None = None
    shard: str | None = None
    vllm: str = attrs.field(factory=_default_vllm, converter=_vllm)

    @classmethod
    def create(cls, builder: str | None, **values: Any) -> RunOptions:
        """The options of ``values``, where a value given as ``None`` takes the kit's default.

        What a front end has when an option was not given is ``None`` (argparse,
        pytest, a keyword left out); this is the one place that turns it into
        the default, so every front end gets the same ones.

        Raises:
            OptionError: a value names no option.
        """
        fields = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise OptionError(f"{unknown[0]} is not an option of the run")
        return cls(builder=builder, **{k: v for k, v in values.items() if v is not None})

    @property
    def measured_reach(self) -> bool | tuple[str, ...]:
        """What reach the run measures, :attr:`reach`'s ``None`` resolved.

        ``None`` measures whenever coverage.py is installed (without it the
        report says reach was not measured), and always when ``min_reach``
        asks for it.
        """
        if self.reach is not None:
            return self.reach
        return self.min_reach is not None or importlib.util.find_spec("coverage") is not None

    @property
    def vllm_version(self) -> VllmVersion:
        """:attr:`vllm` as a :class:`~kvref.versions.VllmVersion`.

        Raises:
            OptionError: :attr:`vllm` is ``all``: one run judges one release
                (:func:`conformance.ci.matrix.check_matrix` runs one per release).
        """
        if self.vllm == ALL_RELEASES:
            raise OptionError(
                "vllm='all' asks for the compatibility matrix: one run per release "
                "(kvref-conformance --vllm all, or conformance.ci.matrix.check_matrix)"
            )
        return parse_version(self.vllm)

    def check_native(self) -> None:
        """Refuse judging a vLLM-native builder under a release other than the installed one.

        A vLLM-native builder runs vLLM's own code (its specs, its
        ``VllmConfig``, its Core flow), so only the installed release can
        judge it.  An installed release the kit does not support is judged
        under :attr:`vllm` with a warning (:mod:`conformance.contract`).

        Raises:
            OptionError: a supported vLLM is installed and :attr:`vllm` names another.
        """
        installed = installed_vllm_version()
        if installed is not None and installed != self.vllm_version:
            raise OptionError(
                f"vllm={self.vllm!r}: a vLLM-native builder runs vLLM's own code, and this "
                f"environment has vLLM {installed}; run the kit where vLLM {self.vllm} is "
                "installed to judge it under that release"
            )

    @property
    def worker_memory_bytes(self) -> int:
        """:attr:`worker_memory` in bytes."""
        return int(self.worker_memory * (1 << 30))

    def validate(self, *, capabilities: Iterable[str], focus_shared: bool = False) -> None:
        """Raise :class:`OptionError` for the first unusable option.

        The device is checked apart (:func:`check_device`: it imports torch).

        Args:
            capabilities: the capabilities the catalog knows (``unsupported`` must name them).
            focus_shared: the shards of this run pool what they learn of the focus
                (``check_builder(focus_exchange=...)``), so a shard may learn it.
        """
        if self.profile not in PROFILES:
            raise OptionError(f"profile={self.profile!r} is not one of {sorted(PROFILES)}")
        _positive_int("max_examples", self.max_examples)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise OptionError(f"seed={self.seed!r} must be a non-negative int")
        _positive_number("timeout", self.timeout, "seconds")
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
        _positive_number("worker_memory", self.worker_memory, "GiB")
        if self.min_reach is not None and (
            isinstance(self.min_reach, bool)
            or not isinstance(self.min_reach, (int, float))
            or not 0 <= self.min_reach <= 100
        ):
            raise OptionError(
                f"min_reach={self.min_reach!r} must be a percentage between 0 and 100"
            )
        if self.reach is False and self.min_reach is not None:
            raise OptionError("min_reach needs reach measured (reach=True or module names)")
        self.focus_pins()
        if isinstance(self.explore, bool) or not isinstance(self.explore, (int, float)):
            raise OptionError(f"explore={self.explore!r} must be a number of seconds")
        if self.explore:
            _positive_number("explore", self.explore, "seconds")
            if self.measured_reach is False:
                raise OptionError(
                    f"explore={self.explore:g} steers by reach: it needs reach measured "
                    "(drop --no-reach / reach=False; coverage.py must be installed)"
                )
        if self.explore_candidates is not None:
            _positive_int("explore_candidates", self.explore_candidates)
        self._validate_shard(focus_shared)

    def _validate_shard(self, focus_shared: bool) -> None:
        shard = self.shard_of()
        if shard is None or shard.count == 1:
            return
        if self.focus is None and not focus_shared:
            raise OptionError(
                f"shard={self.shard!r} needs the focus given: a shard sees only its own "
                "families' answers, so it cannot learn the whole run's focus; give it: off, "
                'or the focus an earlier run learned (its report\'s "focus")'
            )
        if self.explore:
            raise OptionError(
                f"shard={self.shard!r} cannot explore (explore={self.explore:g}): exploration "
                "follows the whole run's reach, which no shard has"
            )

    def shard_of(self) -> Shard | None:
        """:attr:`shard` read (``None``: the whole run).

        Raises:
            OptionError: ``shard`` is not ``I/N`` with ``1 <= I <= N``.
        """
        if self.shard is None:
            return None
        try:
            from conformance.run.shard import Shard

            return Shard.parse(self.shard)
        except ValueError as exc:
            raise OptionError(f"shard={self.shard!r} {exc}") from None

    def focus_pins(self) -> dict[str, frozenset[EnginePath]] | None:
        """:attr:`focus` read: ``None`` to learn, else the pins to use (``{}``: ``off``).

        Raises:
            OptionError: ``focus`` is malformed or names an unknown family,
                layout or flag (the message names it).
        """
        if self.focus is None:
            return None
        if not isinstance(self.focus, str):
            raise OptionError(f"focus={self.focus!r} must be a string")
        if self.focus.strip() == "off":
            return {}
        from conformance.generate import engine_paths
        from conformance.generate.families import DEFAULT_FAMILIES

        try:
            pins = engine_paths.parse(self.focus, ["vendor", *DEFAULT_FAMILIES])
        except ValueError as exc:
            raise OptionError(f"focus={self.focus!r}: {exc}") from None
        if not pins:
            raise OptionError(f"focus={self.focus!r} names no family; use 'off' for no focus")
        return pins

    def reproduce(self, invariant: str, focus: str | None = None) -> str:
        """A command that reruns this run's examples for ``invariant`` alone.

        ``focus``: the run's focus spelled (:func:`conformance.generate.engine_paths.spell`),
        which a run of one invariant could not learn from its own scenarios.
        """
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
        focus = self.focus if focus is None else focus
        if focus:
            words += ["--focus", focus]
        if not self.shrink:
            words.append("--no-shrink")
        # Said either way: a crash contained in a worker may end an in-process run.
        words.append("--isolate" if self.isolate else "--no-isolate")
        if self.isolate and self.worker_memory != DEFAULT_WORKER_MEMORY_GIB:
            # A leak meets the limit at another call: another verdict, maybe.
            words += ["--worker-memory", f"{self.worker_memory:g}"]
        words += ["--vllm", self.vllm]
        # Replaying saved counterexamples would run other examples than the seed's.
        words.append("--no-database")
        return " ".join(shlex.quote(w) for w in words)

    def as_dict(self) -> dict[str, Any]:
        """The options as JSON-able data."""
        data = attrs.asdict(self)
        for key in ("select", "xfail", "unsupported", "reach"):
            if isinstance(data[key], (tuple, list)):
                data[key] = list(data[key])
        return data


def check_device(device: str) -> None:
    """Raise :class:`OptionError` unless torch can allocate on ``device`` here.

    One rule for every front end: ``bogus``, or ``cuda`` on a machine without
    a usable GPU, is refused before any example runs (the CLI and the plugin
    turn it into their usage error).
    """
    if not isinstance(device, str) or not device.strip():
        raise OptionError(
            f"device={device!r} must name a torch device (cpu, cuda, cuda:1, meta...)"
        )
    try:
        import torch

        torch.empty(0, device=device)
    except Exception as exc:
        # torch says why in its own words (an unknown type, no CUDA build, no GPU).
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OptionError(f"device={device!r} is not usable here: {reason}") from None


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name}={value!r} must be a positive int")


def _positive_number(name: str, value: object, unit: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise OptionError(f"{name}={value!r} must be a finite number of {unit} > 0")


def flag_message(message: str, prefix: str = "--") -> str:
    """``message`` of an :class:`OptionError` with its keyword turned into a flag.

    ``max_examples=0 must...`` becomes ``--max-examples 0 must...`` (the CLI)
    or ``--kv-max-examples 0 must...`` (``prefix="--kv-"``, the plugin): the
    user typed flags, not keywords.
    """
    fields = {f.name for f in attrs.fields(RunOptions)}
    key, sep, rest = message.partition("=")
    if sep and key in fields:
        return f"{prefix}{key.replace('_', '-')} {rest}"
    for key in sorted(fields, key=len, reverse=True):
        if message.startswith(f"{key} "):
            return f"{prefix}{key.replace('_', '-')}{message[len(key) :]}"
    return message
