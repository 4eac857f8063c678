"""One builder, three front ends, one judgement.

The CLI, ``check_builder`` and the pytest plugin each build one
:class:`~conformance.run.options.RunOptions` with the kit's defaults and hand
it whole to the run: the same builder must get the same verdicts, the same
number of judged examples per invariant and the same reproduce lines from
each, whether it is legal, broken, or patches the kit to forge a pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit_runs import cli_args, plugin_args

from conformance.check.catalog import catalog
from conformance.cli import _options, _parser, main
from conformance.report.render import report_to_dict
from conformance.run.options import RunOptions
from conformance.run.runner import check_builder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow


#: builder, selected invariants, examples: each run costs seconds.
CASES = [
    ("kvref:ReferenceKVCacheConfigBuilder", ["KV-GROUP-PARTITION", "KV-PLACE-NUM-BLOCKS"], 3),
    ("broken_builders:DroppedLayer", ["KV-GROUP-PARTITION", "KV-GROUP-NONEMPTY"], 4),
    ("hostile_builders:PatchesCheck", ["KV-GROUP-PARTITION"], 4),
]
SEED = 5

# Every invariant module imported now: pytester drops the modules a test
# imports when it ends, and a second import would declare the ids twice.
catalog()

_OUTCOME = {"pass": "passed", "fail": "failed", "inconclusive": "failed", "xfail": "xfailed"}


def _judgement(data: dict[str, Any]) -> dict[str, Any]:
    """What must agree: each invariant's verdict, counts and reproduce line, and the options."""
    options = dict(data["options"])
    return {
        "results": {
            r["id"]: (r["status"], r["examples"], r["inconclusive"], r.get("reproduce"))
            for r in data["results"]
        },
        "options": options,
        "reach measured": data["reach"] is not None,
    }


def _cli(builder: str, select: list[str], examples: int, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "cli.json"
    main([builder, *cli_args(*select, examples=examples, seed=SEED), "--json", str(path)])
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _plugin(
    builder: str, select: list[str], examples: int, pytester: pytest.Pytester
) -> tuple[dict[str, Any], dict[str, int]]:
    path = pytester.path / "plugin.json"
    result = pytester.runpytest_subprocess(
        *plugin_args(builder, examples=examples, seed=SEED),
        *("--kv-select", ",".join(select), "--kv-json", str(path)),
    )
    outcomes = result.parseoutcomes()
    outcomes.pop("deselected", None)
    return json.loads(path.read_text()), outcomes


@pytest.mark.usefixtures("tests_importable")
@pytest.mark.parametrize(("builder", "select", "examples"), CASES, ids=[c[0] for c in CASES])
def test_the_front_ends_judge_alike(
    builder: str,
    select: list[str],
    examples: int,
    tmp_path: Path,
    pytester: pytest.Pytester,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Same verdicts, counts per invariant, reproduce lines and options on every front end."""
    cli = _judgement(_cli(builder, select, examples, tmp_path))
    capsys.readouterr()
    report = check_builder(builder, select=select, max_examples=examples, seed=SEED)
    python = _judgement(report_to_dict(report))
    data, outcomes = _plugin(builder, select, examples, pytester)
    plugin = _judgement(data)
    assert cli == python == plugin
    assert set(cli["results"]) == set(select)
    assert cli["options"]["isolate"] is True and cli["reach measured"]
    expected: dict[str, int] = {}
    for status, *_ in cli["results"].values():
        expected[_OUTCOME[status]] = expected.get(_OUTCOME[status], 0) + 1
    assert outcomes == expected, outcomes
    if builder != CASES[0][0]:
        # The broken and the hostile builder are caught, whatever the front end.
        assert cli["results"]["KV-GROUP-PARTITION"][0] == "fail"


def test_the_clis_defaults_are_the_kits() -> None:
    """The CLI's options with nothing given equal RunOptions' defaults, the database aside."""
    args = _parser().parse_args(["--seed", "1"])
    cli = _options(args, [])
    kit = RunOptions(builder=args.builder, seed=1)
    assert cli.database == ".hypothesis/kvref-conformance"  # the one deliberate difference
    import attrs

    assert attrs.evolve(cli, database=None) == kit


@pytest.mark.parametrize(("minimum", "failed"), [("100", 1), ("1", 0)])
def test_the_plugin_judges_the_reach_minimum(
    pytester: pytest.Pytester, minimum: str, failed: int
) -> None:
    """``--kv-min-reach`` fails the session as ``--min-reach`` fails the CLI (it was ignored)."""
    result = pytester.runpytest_subprocess(
        *plugin_args("kvref:ReferenceKVCacheConfigBuilder", examples=3, seed=SEED),
        *("--kv-select", "KV-GROUP-PARTITION", "--kv-min-reach", minimum),
    )
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed", 0)) == (2 - failed, failed), outcomes
    if failed:
        result.stdout.fnmatch_lines(["*below --kv-min-reach 100%*"])
