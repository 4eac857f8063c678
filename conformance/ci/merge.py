"""``kvref-conformance merge``: the reports of a sharded run joined into the whole run's report.

Each shard (``--shard I/N``, :mod:`conformance.run.shard`) judged the same
seed's examples of its own strata and recorded, beside its report, the
tallies, the place of each first failure in the whole run's order, the
distinct models and block counts it drew and the lines of the builder its
worker ran.  The merge adds the counts, keeps per invariant the failure the
whole run would have met first (with that shard's shrunk counterexample),
counts distinct values over all shards and unites the lines reached: the
verdicts, example counts, coverage and reach of the unsharded run with the
same options.  Not joined: ``reach.over_time`` (each shard's own order) and
the wall time (the merged ``seconds`` is the shards' sum).

Reports that applied an expectations manifest or a baseline are refused:
merge the shards' plain reports and give the merge the expectations and the
baseline (they judge the whole run's verdicts, docs/vendors.md#shards).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from conformance.check.violations import Violation
from conformance.extensions.reach.figures import module_figures, reach_summary
from conformance.extensions.waste.records import LISTED, PlanFigures, WasteSummary, WasteWarning
from conformance.report.model import InvariantResult, Replays, Report
from conformance.run.tally import Tally, expected_status, verdict

__all__ = ["MergeError", "merge_main", "merge_reports", "read_shard_reports"]

#: Fields every shard's report must agree on (with the options but ``shard``).
_SAME = ("builder", "device", "seed", "profile", "max_examples", "contract", "focus")
#: Coverage counts that add up over shards.
_ADDED = ("examples", "odd_block_counts", "over_4gib", "layer_outer_multi_block")
_COUNTERS = ("families", "layouts", "block_buckets", "spec_kinds", "dtypes", "workers")


class MergeError(ValueError):
    """The reports given cannot be joined (the message names the report and the field)."""


def read_shard_reports(paths: Sequence[Path | str]) -> list[dict[str, Any]]:
    """The shards' ``--json`` reports, checked to be the N shards of one run.

    Raises:
        MergeError: a report is unreadable, incomplete or not a shard's; the
            reports disagree on an option; a shard is missing or given twice.
    """
    if not paths:
        raise MergeError("give the --json reports of every shard of the run")
    reports = [_read(Path(p)) for p in paths]
    first, where = reports[0], Path(paths[0])
    count = first["shard"]["count"]
    seen: dict[int, Path] = {}
    for path, data in zip(map(Path, paths), reports, strict=True):
        shard = data["shard"]
        if shard["count"] != count:
            raise MergeError(
                f"{path} is shard {shard['index']}/{shard['count']}, "
                f"but {where} is one of {count} shards"
            )
        if shard["index"] in seen:
            raise MergeError(f"{path} and {seen[shard['index']]} are both shard {shard['index']}")
        seen[shard["index"]] = path
        for key in _SAME:
            if data.get(key) != first.get(key):
                raise MergeError(
                    f"{path} has {key}={data.get(key)!r}, {where} has {first.get(key)!r}: "
                    "the shards of one run share every option but --shard"
                )
        for key in sorted(set(data["options"]) | set(first["options"]) - {"shard"}):
            if key != "shard" and data["options"].get(key) != first["options"].get(key):
                raise MergeError(
                    f"{path} ran with option {key}={data['options'].get(key)!r}, {where} with "
                    f"{first['options'].get(key)!r}: the shards of one run share every option "
                    "but --shard"
                )
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise MergeError(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count} "
            "missing: give the report of every shard"
        )
    return sorted(reports, key=lambda d: d["shard"]["index"])


def _read(path: Path) -> dict[str, Any]:
    from conformance.ci.shard_reports import ShardReportError, read_shard_report

    try:
        return read_shard_report(path)
    except ShardReportError as exc:
        raise MergeError(str(exc)) from None


def merge_reports(reports: Sequence[dict[str, Any]]) -> Report:
    """The whole run's report from its shards' (:func:`read_shard_reports`' order)."""
    first = reports[0]
    interrupted = any(d["interrupted"] for d in reports)
    xfail = set(first["options"].get("xfail") or ())
    results = tuple(
        _result(r["id"], reports, interrupted=interrupted, expected=r["id"] in xfail)
        for r in first["results"]
    )
    return Report(
        builder=first["builder"],
        device=first["device"],
        seed=first["seed"],
        profile=first["profile"],
        max_examples=first["max_examples"],
        results=results,
        seconds=sum(d["seconds"] for d in reports),
        options={**first["options"], "shard": None},
        coverage=_coverage(reports),
        reach=_reach(reports, first["options"].get("min_reach")),
        interrupted=interrupted,
        waste=_waste(reports),
        builder_output="".join(d.get("builder_output", "") for d in reports),
        observe_seconds=dict(_sums(d.get("observe_seconds", {}) for d in reports)),
        started=min((d["started"] for d in reports if d.get("started")), default=None),
        warnings=tuple(dict.fromkeys(w for d in reports for w in d.get("warnings", ()))),
        contract=first["contract"],
        focus=first.get("focus"),
        containment=_containment(reports),
    )


def _containment(reports: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """What held in every shard: the weakest of each (``None`` where a shard was not isolated)."""
    parts: list[dict[str, Any]] = [d.get("containment") or {} for d in reports]
    if not parts or not all(parts):
        return None
    return {
        "roles": parts[0].get("roles", {}),
        "processes": sorted({x for p in parts for x in p.get("processes", ())}),
        "judge_memory": sorted({x for p in parts for x in p.get("judge_memory", ())}),
        "judge_dumpable": any(p.get("judge_dumpable") for p in parts),
        "warnings": list(dict.fromkeys(w for p in parts for w in p.get("warnings", ()))),
    }


def _result(
    invariant: str, reports: Sequence[dict[str, Any]], *, interrupted: bool, expected: bool
) -> InvariantResult:
    """One invariant's result: the shards' counts added, the earliest failure kept."""
    mine = [(d, next(r for r in d["results"] if r["id"] == invariant)) for d in reports]
    tallies = [(d["shard"]["tallies"].get(invariant), r) for d, r in mine]
    if any(t is None for t, _ in tallies):
        # Not judged by the run at all (declared unsupported): as the shards say.
        return _record(mine[0][1])
    tally = Tally(
        judged=sum(t["judged"] for t, _ in tallies),
        unjudged=sum(t["unjudged"] for t, _ in tallies),
        not_applicable=sum(t["not_applicable"] for t, _ in tallies),
        spoiled=sum(t["spoiled"] for t, _ in tallies),
        reason=next((t["reason"] for t, _ in tallies if t["reason"]), None),
        na_reason=next((t["na_reason"] for t, _ in tallies if t["na_reason"]), None),
    )
    # The whole run shows the first failure the builder's parent does not share,
    # else the first failure (Tally.shown): so does the merge.
    failing = [
        ((r.get("inherited") is not None, tuple(t["failure_key"])), r)
        for t, r in tallies
        if t["failure_key"] is not None
    ]
    shown_failure = min(failing, key=lambda f: f[0]) if failing else None
    if shown_failure is not None:
        tally.failure_key = shown_failure[0][1]
    status, reason = verdict(tally, interrupted=interrupted)
    counts = {
        "examples": tally.judged,
        "inconclusive": tally.unjudged,
        "seconds": sum(r["seconds"] for _, r in mine),
    }
    shown = expected_status(status, expected)
    if status == "fail" and shown_failure is not None:
        return _record(shown_failure[1], status=shown, **counts)
    return _record(mine[0][1], status=shown, reason=reason, **_no_failure(), **counts)


def _no_failure() -> dict[str, Any]:
    return dict.fromkeys(
        (
            "counterexample",
            "counterexample_python",
            "counterexample_data",
            "scenario",
            "reproduce",
            "inherited",
            "upstream",
            "replays",
        )
    ) | {"violations": ()}


def _record(data: dict[str, Any], **changes: Any) -> InvariantResult:
    """An :class:`InvariantResult` from its JSON form, with ``changes``."""
    fields = {**data, **changes}
    # Derived from the id when the report is written (conformance.report.trust).
    fields.pop("evidence", None)
    fields["violations"] = tuple(
        v if isinstance(v, Violation) else _violation(v) for v in fields.get("violations") or ()
    )
    replays = fields.get("replays")
    if isinstance(replays, dict):
        fields["replays"] = Replays(**replays)
    return InvariantResult(**fields)


def _violation(data: dict[str, Any]) -> Violation:
    span = data.get("byte_range")
    return Violation(**{**data, "byte_range": None if span is None else tuple(span)})


def _sums(dicts: Iterable[dict[str, Any]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for d in dicts:
        total.update(d)
    return total


def _coverage(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: counts added, distinct values counted over every shard's sets."""
    scenarios = sorted({s for d in reports for s in d["coverage"]})
    out: dict[str, Any] = {}
    for scenario in scenarios:
        parts = [d["coverage"][scenario] for d in reports if scenario in d["coverage"]]
        sets = [d["shard"]["coverage"].get(scenario, {}) for d in reports]
        merged: dict[str, Any] = {k: sum(p.get(k, 0) for p in parts) for k in _ADDED}
        merged["models"] = len({m for s in sets for m in s.get("models", ())})
        merged["block_counts"] = len({b for s in sets for b in s.get("block_counts", ())})
        for key in _COUNTERS:
            merged[key] = dict(sorted(_sums(p.get(key, {}) for p in parts).items()))
        merged["layouts_seen"] = len(merged["layouts"])
        empty = sorted({name for p in parts for name in p.get("no_valid_examples", ())})
        if empty:
            merged["no_valid_examples"] = empty
        focus = _sums(d["shard"]["focus"].get(scenario, {}) for d in reports)
        if focus:
            merged["focus"] = dict(focus)
        out[scenario] = merged
    return out


def _reach(reports: Sequence[dict[str, Any]], min_reach: float | None) -> dict[str, Any] | None:
    """The lines reached by any shard, over the functions that count in any."""
    parts = [d["reach"] for d in reports if d.get("reach") is not None]
    if not parts:
        return None
    functions: dict[str, dict[int, tuple[str, frozenset[int]]]] = {}
    ran: dict[str, set[int]] = {}
    roles: dict[str, str] = {}
    order: list[str] = []
    for part in parts:
        for module in part["modules"]:
            path = module["path"]
            if path not in roles:
                order.append(path)
                roles[path] = module["role"]
            for index, name, lines in module["functions"]:
                functions.setdefault(path, {})[index] = (name, frozenset(lines))
            ran.setdefault(path, set()).update(module["ran"])
    own = [p for p in order if roles[p] == "own"]
    callees = sorted(p for p in order if roles[p] != "own")
    modules = [
        module_figures(
            path,
            roles[path] == "own",
            [(i, n, set(lines)) for i, (n, lines) in sorted(functions.get(path, {}).items())],
            ran[path],
        )
        for path in own + callees
    ]
    return reach_summary(modules, min_reach)


def _waste(reports: Sequence[dict[str, Any]]) -> WasteSummary | None:
    parts = [d["waste"] for d in reports if d.get("waste") is not None]
    if not parts:
        return None
    worst = sorted(
        (w for p in parts for w in p["worst"]),
        key=lambda w: (-(w["ratio"] if w["ratio"] is not None else float("inf")), w["example"]),
    )[:LISTED]
    compared = sum(p["compared"] for p in parts)
    return WasteSummary(
        compared=compared,
        warned=sum(p["warned"] for p in parts),
        worst=tuple(_warning(w) for w in worst),
        note=None if compared else next((p["note"] for p in parts if p["note"]), None),
    )


def _warning(data: dict[str, Any]) -> WasteWarning:
    fields = {k: v for k, v in data.items() if k != "message"}
    fields["builder"] = PlanFigures(**fields["builder"])
    fields["reference"] = PlanFigures(**fields["reference"])
    return WasteWarning(**fields)


def merge_main(argv: Sequence[str]) -> int:
    """``kvref-conformance merge R1 R2 ...``: 0 the whole run passes, 1 it fails, 2 bad input.

    The whole run's report takes the vendor's CI inputs as a run does
    (``--expectations``, ``--xfail-file``, ``--baseline``, ``--update-expectations``: they judge
    the whole run's verdicts, never a shard's) and writes the same outputs.
    """
    from conformance.ci.options import add_ci_options, add_output_options, add_xfail_option
    from conformance.ci.processors import CiError, exit_status, finish, prepare_from, write_outputs
    from conformance.report.render import format_report

    parser = argparse.ArgumentParser(
        prog="kvref-conformance merge",
        description="Join the --json reports of a sharded run (--shard I/N) into the report of "
        "the whole run: its verdicts, example counts, coverage and reach.",
    )
    parser.add_argument("reports", nargs="+", type=Path, help="every shard's --json report")
    add_output_options(parser.add_argument_group("reports"))
    expected = parser.add_argument_group("expected results")
    add_ci_options(expected)
    add_xfail_option(expected)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        ci = prepare_from(args)
        report = finish(merge_reports(read_shard_reports(args.reports)), ci)
    except (MergeError, CiError) as exc:
        print(f"kvref-conformance merge: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report, header=False))
    errors = write_outputs(report, ci)
    for error in errors:
        print(f"kvref-conformance merge: error: {error}", file=sys.stderr)
    return 2 if errors else exit_status(report, ci)
