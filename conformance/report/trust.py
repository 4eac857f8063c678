"""What each verdict rests on, and what the run's containment held (docs/trust.md).

The judging process makes every verdict, but a few rest on evidence that
only the builder's own process can gather: a builder that detects the
harness can shape that evidence there.  Each such invariant is labelled
``builder-process`` in the JSON report (``results[].evidence``) and listed
in the text report; every other verdict rests on answers the judge checked
itself (``judge``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUILDER_PROCESS",
    "BUILDER_PROCESS_EVIDENCE",
    "JUDGE",
    "REACH_EVIDENCE",
    "evidence",
    "summary",
    "trust_lines",
]

#: The label of a verdict made on answers the judge checked itself.
JUDGE = "judge"
#: The label of a verdict that rests on evidence gathered in the builder's process.
BUILDER_PROCESS = "builder-process"

#: Invariant id -> the evidence gathered in the builder's own process it rests on.
BUILDER_PROCESS_EVIDENCE: Mapping[str, str] = {
    "KV-GROUP-INPUT-UNCHANGED": (
        "the worker snapshots the grouping hook's inputs and reports what changed"
    ),
    "KV-PLACE-INPUT-UNCHANGED": (
        "the worker snapshots the placement hook's inputs and reports what changed"
    ),
    "KV-GROUP-HASH-STABLE": (
        "the twin process, which runs the builder's code, gives the answers compared"
    ),
    "KV-CALL-FRESH": "the worker reports the identity of each object resolution made",
    "KV-CALL-RETURN-TYPE": "the worker encodes each answer: the type it reports is read there",
}

#: The reach section's evidence (not an invariant).
REACH_EVIDENCE = "reach: the lines the builder ran are traced in its worker"


def evidence(invariant: str) -> str:
    """:data:`BUILDER_PROCESS` or :data:`JUDGE`: what the verdict on ``invariant`` rests on."""
    return BUILDER_PROCESS if invariant in BUILDER_PROCESS_EVIDENCE else JUDGE


def summary(
    roles: Mapping[str, Mapping[str, Any]], *, judge_dumpable: bool, key_env: str
) -> dict[str, Any]:
    """The report's ``containment``: what each role's chain said held, and warnings.

    ``roles``: per process role (worker, twin, models, files) the facts its
    containment chain sent (:func:`conformance.harness.confine.enter`);
    ``judge_dumpable``: the judging process could not be made non-dumpable.
    """
    processes = sorted({str(f.get("processes")) for f in roles.values()})
    memory = sorted({str(f.get("judge_memory")) for f in roles.values()})
    warnings = []
    weak = [p for p in processes if p in ("subreaper", "process-group")]
    if weak:
        warnings.append(
            "no PID namespace on this platform: the builder's processes end with the run "
            f"through a {weak[0].replace('-', ' ')}, which a builder that kills the kit's "
            "sentinel processes first can escape (docs/trust.md)"
        )
    if any(m != "refused" for m in memory):
        warnings.append(
            "a process that runs the builder's code could open the judge's memory on this "
            f"platform ({', '.join(memory)}): the verdict is only as good as the builder is "
            "honest (docs/trust.md)"
        )
    if judge_dumpable:
        warnings.append("the judging process could not be made non-dumpable (docs/trust.md)")
    if any(f.get("certify_key") != "absent" for f in roles.values()):
        warnings.append(
            f"a process that runs the builder's code holds a copy of {key_env} in its memory "
            "(forked from a judge that holds it; name the builder 'module:Class' so that its "
            "worker starts afresh): certificates made with it prove nothing (docs/trust.md)"
        )
    return {
        "roles": {
            role: {k: v for k, v in facts.items() if k != "init"}
            for role, facts in sorted(roles.items())
        },
        "processes": processes,
        "judge_memory": memory,
        "judge_dumpable": judge_dumpable,
        "warnings": warnings,
    }


def trust_lines(
    results_ids: list[str], containment: Mapping[str, Any] | None, reach: bool
) -> list[str]:
    """The text report's trust section: what the verdict rests on, and what held."""
    lines = []
    labelled = [i for i in results_ids if i in BUILDER_PROCESS_EVIDENCE]
    if labelled or reach:
        lines += [
            "",
            "Evidence gathered in the builder's own process (a builder that detects the "
            "harness can shape it; docs/trust.md):",
        ]
        lines += [f"  {i}: {BUILDER_PROCESS_EVIDENCE[i]}" for i in labelled]
        if reach:
            lines.append(f"  {REACH_EVIDENCE}")
    if containment is None:
        lines += [
            "",
            "Trust (docs/trust.md): NOT ISOLATED: the builder ran in the judging process; "
            "a verdict for debugging only",
        ]
        return lines
    processes = ", ".join(containment.get("processes") or ["none started"])
    memory = ", ".join(containment.get("judge_memory") or ["not tried"])
    lines += [
        "",
        "Trust (docs/trust.md): this verdict was made in a process that ran none of the "
        f"builder's code; its processes ended with the run ({processes}); judge's memory: "
        f"{memory} to them",
    ]
    lines += [f"  warning: {w}" for w in containment.get("warnings", ())]
    return lines
