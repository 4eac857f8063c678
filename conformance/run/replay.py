"""Replay one failure of a JSON report in this process, for a debugger.

``conformance.reproduce("report.json", "KV-PLACE-IN-BOUNDS")`` rebuilds the
failure's minimal counterexample from the report's structured data
(``counterexample_data``, decoded by :func:`conformance.report.records.decode_example`,
which accepts only plain values and the kit's own record types), makes the
builder the report names (or the one given), observes the example in the
failing scenario with a fresh guard and returns what the invariant says now.
A breakpoint set in the builder's hook stops there: the calls run in this
process, on a guard thread.

The report's ``counterexample_python`` is never executed: a report is
another team's CI artifact, and replaying it must not run what it contains.
(The builder is still imported by the name in ``options.builder`` unless
``builder=`` is given: pass the builder for a report you do not trust.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.check.catalog import Unjudged, by_id
from conformance.check.observations import ConstructFailure
from conformance.check.violations import Violation
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.report.records import RecordError, decode_example
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref.builder import KVCacheConfigBuilder

__all__ = ["ReplayError", "replay_example", "reproduce"]

Builder = KVCacheConfigBuilder | type[KVCacheConfigBuilder]


class ReplayError(ValueError):
    """The report cannot be replayed: unreadable, no such failure, or the failure is not judged."""


def _read(report: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(report, Mapping):
        return report
    path = Path(report)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReplayError(f"report {str(path)!r} is not a readable JSON report: {exc}") from None
    if not isinstance(data, dict):
        raise ReplayError(f"report {str(path)!r} holds {type(data).__name__}, not a JSON object")
    return data


def _result(data: Mapping[str, Any], invariant_id: str) -> Mapping[str, Any]:
    results = data.get("results")
    if not isinstance(results, list):
        raise ReplayError("the report has no 'results' list")
    for entry in results:
        if isinstance(entry, dict) and entry.get("id") == invariant_id:
            if entry.get("status") not in ("fail", "xfail") or not entry.get("scenario"):
                raise ReplayError(
                    f"{invariant_id} has status {entry.get('status')!r} in the report and no "
                    "counterexample to replay (only failures carry one)"
                )
            return entry
    raise ReplayError(f"the report has no result for invariant_id={invariant_id!r}")


def _example(entry: Mapping[str, Any], invariant_id: str) -> Example:
    """The failure's counterexample, rebuilt from its data (never from its Python)."""
    data = entry.get("counterexample_data")
    if data is None:
        raise ReplayError(
            f"{invariant_id} has no counterexample_data in the report (an older kit "
            "wrote none, and a vendor's own vLLM spec class has no data form); the kit does "
            "not execute counterexample_python: rerun its reproduce line instead"
        )
    try:
        config, workers, memory, num_blocks = decode_example(
            data, where=f"results[{invariant_id}].counterexample_data"
        )
    except RecordError as exc:
        raise ReplayError(f"the counterexample of {invariant_id} does not rebuild: {exc}") from None
    description = entry.get("counterexample")
    return Example(
        config=config,
        workers=workers,
        available_memory=memory,
        num_blocks=num_blocks,
        description=description if isinstance(description, str) else "",
    )


def _builder(data: Mapping[str, Any], given: Builder | None) -> Builder:
    if given is not None:
        return given
    from conformance.harness.adapters import load_builder

    options = data.get("options")
    name = options.get("builder") if isinstance(options, dict) else None
    if not isinstance(name, str) or not name:
        raise ReplayError(
            "the report names no importable builder (options.builder); pass builder=..."
        )
    try:
        return load_builder(name)
    except ValueError as exc:
        raise ReplayError(f"cannot load the report's builder {name!r}: {exc}") from None


def replay_example(
    builder: Builder,
    invariant_id: str,
    scenario: str,
    example: Example,
    *,
    timeout: float = 10.0,
    device: str = "cpu",
    max_alloc_bytes: int | None = None,
) -> list[Violation]:
    """Observe ``example`` in ``scenario`` with a fresh guard and judge it by ``invariant_id``.

    Returns:
        The violations (empty: the invariant holds on this example now).

    Raises:
        ReplayError: the invariant is unknown, or the example could not judge it.
    """
    inv = by_id().get(invariant_id)
    if inv is None:
        raise ReplayError(f"invariant_id={invariant_id!r} is not in the catalog")
    if not inv.reads(scenario):
        raise ReplayError(f"{invariant_id} is not judged in scenario={scenario!r}")
    guard = Guard(timeout)
    ctx = Context(
        factory=make_factory(builder, guard),
        guard=guard,
        device=device,
        max_alloc_bytes=max_alloc_bytes,
        core=getattr(builder, "kvref_core", None),
    )
    obs = observe_in(ctx, scenario, example)
    if isinstance(obs, ConstructFailure) and inv.id != "KV-CALL-CONSTRUCT":
        raise ReplayError(f"the builder could not be constructed: {obs.result.describe()}")
    outcome = inv.check(obs)
    if outcome is None or isinstance(outcome, Unjudged):
        reason = outcome.reason if isinstance(outcome, Unjudged) else "the check did not apply"
        raise ReplayError(f"{invariant_id} could not judge the replayed example: {reason}")
    return list(outcome)


def reproduce(
    report: str | Path | Mapping[str, Any],
    invariant_id: str,
    *,
    builder: Builder | None = None,
) -> list[Violation]:
    """Replay ``invariant_id``'s failure from a JSON report (``--json``) in this process.

    Args:
        report: the JSON report's path (or its loaded data).
        invariant_id: the failed invariant to replay, e.g. ``"KV-PLACE-IN-BOUNDS"``.
        builder: the builder to replay against (default: the report's
            ``options.builder``, imported as the CLI imports it), e.g. a fixed version.

    Returns:
        The violations the replayed counterexample shows now (empty: it holds).

    Raises:
        ReplayError: the report is unreadable, has no failure of ``invariant_id``,
            names no importable builder, or the replay could not judge the invariant.
    """
    data = _read(report)
    entry = _result(data, invariant_id)
    raw = data.get("options")
    options: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    example = _example(entry, invariant_id)
    return replay_example(
        _builder(data, builder),
        invariant_id,
        str(entry["scenario"]),
        example,
        timeout=float(options.get("timeout") or 10.0),
        device=str(options.get("device") or data.get("device") or "cpu"),
        max_alloc_bytes=options.get("max_alloc_bytes"),
    )
