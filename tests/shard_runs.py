"""Helpers of the shard tests: a run and its three shards, each a fresh CLI process, compared.

Each run is its own process, as on the machines of a CI matrix: a run in a
process that already ran one inherits caches (the spec classes' field lists,
say) and would reach other lines.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from subprocesses import clean_env, run_captured

from conformance.ci.merge import merge_reports, read_shard_reports
from conformance.report.render import report_to_dict

ROOT = Path(__file__).resolve().parents[1]
SHARDS = 3


def cli(builder: str, out: Path, *extra: str, select: str | None, examples: int) -> int:
    """``kvref-conformance BUILDER --json OUT ...`` in a fresh process; its exit status."""
    argv = [sys.executable, "-m", "conformance.cli", builder, "--seed", "3"]
    argv += ["--max-examples", str(examples), "--focus", "off", "--no-database"]
    if select:
        argv += ["--select", select]
    env = clean_env(PYTHONPATH=f"{ROOT / 'tests'}{os.pathsep}{ROOT}")
    done = run_captured([*argv, *extra, "--json", str(out)], cwd=ROOT, env=env, timeout=900)
    assert out.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode


def whole_and_shards(
    builder: str,
    tmp: Path,
    *extra: str,
    select: str | None,
    examples: int = 20,
) -> tuple[dict[str, Any], list[Path]]:
    """The unsharded run's JSON report, and the paths of its shards' reports."""
    cli(builder, tmp / "whole.json", *extra, select=select, examples=examples)
    paths = [tmp / f"shard{i}.json" for i in range(1, SHARDS + 1)]
    for i, path in enumerate(paths, 1):
        shard = ("--shard", f"{i}/{SHARDS}")
        cli(builder, path, *extra, *shard, select=select, examples=examples)
    return json.loads((tmp / "whole.json").read_text()), paths


def merged(paths: list[Path]) -> dict[str, Any]:
    """The shard reports at ``paths`` merged (``kvref-conformance merge``), as their JSON reads."""
    report = merge_reports(read_shard_reports(paths))
    data: dict[str, Any] = json.loads(json.dumps(report_to_dict(report), default=str))
    return data


def merge_is_whole(runs: tuple[dict[str, Any], list[Path]]) -> dict[str, Any]:
    """The whole run's report of ``runs`` (:func:`whole_and_shards`), once its shards' merge is."""
    whole, paths = runs
    assert differences(whole, merged(paths)) == []
    return whole


#: What of each result must be the same: the verdict, the counts and the finding.
RESULT_KEYS = ("id", "status", "examples", "inconclusive", "violations", "counterexample")


def differences(whole: dict[str, Any], merged: dict[str, Any]) -> list[str]:
    """Where the merged report differs from the unsharded run's (empty: nowhere)."""
    found = [
        f"{a['id']}.{key}: {a[key]!r:.200} != {b[key]!r:.200}"
        for a, b in zip(whole["results"], merged["results"], strict=True)
        for key in (*RESULT_KEYS, "scenario")
        if a[key] != b[key]
    ]
    for scenario in sorted(whole["coverage"].keys() | merged["coverage"].keys()):
        mine, theirs = whole["coverage"].get(scenario), merged["coverage"].get(scenario)
        if mine != theirs:
            found.append(f"coverage[{scenario}]: {mine} != {theirs}")
    if (whole["reach"] is None) != (merged["reach"] is None):
        found.append("reach measured in one report only")
    elif whole["reach"] is not None:
        for key in ("percent", "statements", "executed", "lines"):
            if whole["reach"][key] != merged["reach"][key]:
                found.append(f"reach.{key}: {whole['reach'][key]} != {merged['reach'][key]}")
    for key in ("compared", "warned"):
        if (whole["waste"] or {}).get(key) != (merged["waste"] or {}).get(key):
            found.append(f"waste.{key}")
    if whole["ok"] != merged["ok"]:
        found.append(f"ok: {whole['ok']} != {merged['ok']}")
    return found
