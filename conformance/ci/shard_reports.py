"""A shard's ``--json`` report, read and checked before ``merge`` joins it.

The merge turns the shards' counts into the whole run's verdicts, so a shard
report is data that carries a verdict: it is read whole
(:func:`conformance.report.documents.read_json`), checked against the
report's JSON schema and against the shapes the merge reads that the schema
leaves open (:data:`MERGED`), and then checked to say what a shard of the
kit says: each result's status, example count and counterexample are those
its own tallies give (:func:`conformance.run.tally.verdict`).  A shard
edited by hand (a failing result made to pass, a tally's failure dropped, the
tallies taken out) is refused, naming the file and the field.

What no check of a plain JSON file can catch: a shard rewritten consistently
(its results and its tallies both) by someone who knows the format.  Where
the shards and the merge hold the certification key (``KVREF_CERTIFY_KEY``),
each shard's report carries a keyed seal (``shard.seal``, HMAC-SHA256 of its
canonical JSON, :func:`sealed`) and the merge takes no shard without a seal
that key made: an edit, however consistent, or a shard sealed under another
key, is refused.  Without the key a shard's report is as trustworthy as the
machine and the person that hand it over; a certified run (``--certify``) is
never sharded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from conformance.harness.confine import KEY_ENV, held_key
from conformance.report.documents import DocumentError, read_json, report_schema, schema_error
from conformance.report.model import InvariantResult
from conformance.run.tally import Tally, expected_status, verdict

__all__ = ["MERGED", "SEAL", "ShardReportError", "read_shard_report", "sealed"]


class ShardReportError(ValueError):
    """A shard's report cannot be merged; the message names the file and the field."""


#: The field of a shard's ``shard`` record that holds its keyed seal.
SEAL = "seal"


def _seal_of(data: Mapping[str, Any], key: bytes) -> str:
    # Through JSON first: what is sealed is what a reader of the file loads.
    plain = json.loads(json.dumps(data, default=str))
    plain["shard"][SEAL] = None
    canonical = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def sealed(data: dict[str, Any]) -> dict[str, Any]:
    """A shard's report data with its keyed seal, where this process holds the key.

    Any other report, or a process without the key, gets ``data`` unchanged.
    """
    key = held_key()
    if key is not None and isinstance(data.get("shard"), dict):
        data["shard"][SEAL] = _seal_of(data, key)
    return data


def _check_seal(path: Path, data: Mapping[str, Any]) -> None:
    key = held_key()
    if key is None:
        return
    seal = data["shard"].get(SEAL)
    if seal is None:
        problem = "has no seal"
    elif not isinstance(seal, str) or not hmac.compare_digest(seal, _seal_of(data, key)):
        problem = (
            "has a seal this key did not make (the file was edited, or sealed under another key)"
        )
    else:
        return
    raise ShardReportError(
        f"{path}: shard.{SEAL} {problem}; with {KEY_ENV} set, merge takes only shards "
        "whose runs held the same key"
    )


_COUNT = {"type": "integer", "minimum": 0}
_COUNTS = {"type": "object", "additionalProperties": _COUNT}

#: What the merge reads of a shard's report beyond what report.schema.json fixes.
MERGED: Mapping[str, Any] = {
    "type": "object",
    "required": ["contract"],
    "properties": {
        "contract": {"type": "string"},
        "results": {"type": "array", "items": {"type": "object", "required": ["seconds"]}},
        "coverage": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    **dict.fromkeys(
                        ("examples", "odd_block_counts", "over_4gib", "layer_outer_multi_block"),
                        _COUNT,
                    ),
                    **dict.fromkeys(
                        ("families", "layouts", "block_buckets", "spec_kinds", "dtypes"), _COUNTS
                    ),
                    "workers": _COUNTS,
                    "no_valid_examples": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "shard": {
            "type": "object",
            "properties": {
                "coverage": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "models": {"type": "array", "items": {"type": "string"}},
                            "block_counts": {"type": "array", "items": _COUNT},
                        },
                    },
                },
                "focus": {"type": "object", "additionalProperties": _COUNTS},
                "tallies": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        # The merge reads both, which the report's schema leaves optional.
                        "required": ["reason", "na_reason"],
                        "properties": {
                            "failure_key": {
                                "type": ["array", "null"],
                                "items": _COUNT,
                                "minItems": 4,
                                "maxItems": 4,
                            }
                        },
                    },
                },
            },
        },
        "reach": {
            "type": ["object", "null"],
            "required": ["modules"],
            "properties": {
                "modules": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["path", "role", "functions", "ran"],
                        "properties": {
                            "path": {"type": "string"},
                            "role": {"type": "string"},
                            "functions": {
                                "type": "array",
                                "items": {
                                    "type": "array",
                                    "minItems": 3,
                                    "maxItems": 3,
                                    "items": {"type": ["integer", "string", "array"]},
                                },
                            },
                            "ran": {"type": "array", "items": _COUNT},
                        },
                    },
                }
            },
        },
        "builder_output": {"type": "string"},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
}

#: The fields of a result the merge rebuilds (``evidence`` is derived when written).
_RESULT_FIELDS = frozenset(a.name for a in attrs.fields(InvariantResult)) | {"evidence"}


def read_shard_report(path: Path) -> dict[str, Any]:
    """The report of one shard at ``path``, checked (module docstring).

    Raises:
        ShardReportError: unreadable, not a complete shard's report, off the
            schema, or its results are not what its tallies give.
    """
    try:
        data = read_json(path, str(path))
    except DocumentError as exc:
        raise ShardReportError(str(exc)) from None
    if not isinstance(data, dict) or "results" not in data:
        raise ShardReportError(f"{path} is not a kvref-conformance --json report")
    if data.get("complete") is not True:
        raise ShardReportError(
            f"{path} is the report of a run that did not end: no verdict to merge"
        )
    if not isinstance(data.get("shard"), dict):
        raise ShardReportError(f"{path} is not a shard's report: run each shard with --shard I/N")
    results = data["results"] if isinstance(data["results"], list) else []
    if data.get("baseline") is not None or any(
        isinstance(r, dict) and r.get("expectation") for r in results
    ):
        raise ShardReportError(
            f"{path} applied a baseline or expectations: merge the shards' plain reports"
        )
    for schema in (report_schema(), MERGED):
        found = schema_error(data, schema)
        if found:
            raise ShardReportError(f"{path}: {found}")
    _check_shard(path, data)
    _check_seal(path, data)
    return data


def _check_shard(path: Path, data: dict[str, Any]) -> None:
    shard = data["shard"]
    spelled = f"{shard['index']}/{shard['count']}"
    if shard["index"] > shard["count"] or data["options"].get("shard") != spelled:
        raise ShardReportError(
            f"{path}: shard {spelled} disagrees with its options.shard "
            f"{data['options'].get('shard')!r}"
        )
    for m, module in enumerate((data.get("reach") or {}).get("modules", ())):
        for f, entry in enumerate(module["functions"]):
            index, name, lines = entry
            if not (
                type(index) is int
                and isinstance(name, str)
                and isinstance(lines, list)
                and all(type(line) is int for line in lines)
            ):
                raise ShardReportError(
                    f"{path}: reach.modules[{m}].functions[{f}] {entry!r:.80} is not "
                    "[index, name, [line, ...]]"
                )
    ids = [r["id"] for r in data["results"]]
    if len(set(ids)) != len(ids):
        raise ShardReportError(f"{path}: results name an invariant twice")
    extra = sorted(set(shard["tallies"]) - set(ids))
    if extra:
        raise ShardReportError(f"{path}: shard.tallies.{extra[0]} tallies no result of the report")
    xfail = set(data["options"].get("xfail") or ())
    for index, result in enumerate(data["results"]):
        unknown = sorted(set(result) - _RESULT_FIELDS)
        if unknown:
            raise ShardReportError(f"{path}: results[{index}].{unknown[0]} is no result field")
        _check_result(path, index, result, shard["tallies"].get(result["id"]), data, xfail)


def _check_result(
    path: Path,
    index: int,
    result: dict[str, Any],
    tally: dict[str, Any] | None,
    data: dict[str, Any],
    xfail: set[str],
) -> None:
    """The result is what its tally gives, as the shard's run computed it."""
    where = f"{path}: results[{index}] ({result['id']})"
    if tally is None:
        # Only an invariant the run did not judge at all has no tally.
        if result["status"] != "skipped":
            raise ShardReportError(
                f"{where}: status {result['status']!r} without shard.tallies.{result['id']}: "
                "only a skipped invariant has no tally"
            )
        return
    counts = Tally(
        judged=tally["judged"],
        unjudged=tally["unjudged"],
        not_applicable=tally["not_applicable"],
        spoiled=tally["spoiled"],
        reason=tally.get("reason"),
        na_reason=tally.get("na_reason"),
        failure_key=None if tally["failure_key"] is None else tuple(tally["failure_key"]),
    )
    status, _ = verdict(counts, interrupted=data["interrupted"])
    shown = expected_status(status, result["id"] in xfail)
    if result["status"] != shown:
        raise ShardReportError(
            f"{where}: status {result['status']!r}, but its tally gives {shown!r} "
            f"(judged {tally['judged']}, failure_key {tally['failure_key']!r}): "
            "not the report the shard's run wrote"
        )
    for field, counted in (("examples", "judged"), ("inconclusive", "unjudged")):
        if result[field] != tally[counted]:
            raise ShardReportError(
                f"{where}: {field} {result[field]!r}, but its tally counts {counted} "
                f"{tally[counted]!r}: not the report the shard's run wrote"
            )
    if status == "fail" and not (
        isinstance(result.get("counterexample"), str) and result["counterexample"].strip()
    ):
        raise ShardReportError(
            f"{where}: fails without its counterexample: not the report the shard's run wrote"
        )
