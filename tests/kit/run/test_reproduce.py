"""Every failure is reproducible: the printed line reruns it, and the JSON report replays it.

For each meta-test broken builder the kit runs as ``tests/kit/test_meta.py`` runs
it; the reproduce line it prints for the meant invariant is then run as a
vendor would run it, in a fresh process, and must fail the same invariant.
``conformance.reproduce`` replays a failure from the JSON report in-process.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import broken_builders
import pytest
import reproduce_lines
from subprocesses import kit_env, run_captured

import conformance
from conformance.report.model import InvariantResult
from conformance.report.render import write_json
from conformance.run.replay import ReplayError
from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]
_TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def work() -> Iterator[Path]:
    """A private working directory (pytest's tmp_path may be pruned by concurrent sessions)."""
    with tempfile.TemporaryDirectory(prefix="kvref-reproduce-") as name:
        yield Path(name)


_ROW = reproduce_lines.ROW
_command = reproduce_lines.command


def _meta_run(builder: type) -> conformance.Report:
    """The run of tests/kit/test_meta.py, with the same options."""
    return check_builder(
        builder,
        select=_PAPER,
        max_examples=builder.EXAMPLES,
        seed=11,
        timeout=broken_builders.meta_timeout(builder),
        shrink=builder is not broken_builders.Hangs,
    )


_run_line = reproduce_lines.run_line


@attrs.define
class _Rerun:
    """One builder's meta-run failure and the rerun of its reproduce line."""

    failure: InvariantResult
    process: subprocess.Popen[bytes] | None = None
    out: Path | None = None
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""

    def start(self, out: Path) -> None:
        """Rerun the failure's reproduce line in a subprocess, its output in ``out.*``."""
        assert self.failure.reproduce is not None
        self.out = out
        with (
            open(out.with_suffix(".out"), "wb") as stdout,
            open(out.with_suffix(".err"), "wb") as stderr,
        ):
            self.process = subprocess.Popen(
                _command(self.failure.reproduce),
                cwd=out.parent,
                env=kit_env(),
                stdout=stdout,
                stderr=stderr,
            )

    def finish(self) -> None:
        assert self.process is not None and self.out is not None
        self.returncode = self.process.wait(timeout=300)
        self.stdout = self.out.with_suffix(".out").read_text()
        self.stderr = self.out.with_suffix(".err").read_text()


_SELF = "test_reproduce_line_fails_the_same_invariant"


@pytest.fixture(scope="module")
def reruns(request: pytest.FixtureRequest) -> Iterator[dict[str, _Rerun]]:
    """Meta-runs in this process, each line rerun in a subprocess alongside the next meta-run.

    Only the builders this session selected are run.  The two overlap so the
    check takes about the meta-tests' own time on two cores.  Under
    pytest-xdist a worker collects every item but runs only its share, so
    there nothing is run ahead: each test reruns its own line (:func:`_rerun_alone`).
    """
    in_xdist_worker = hasattr(request.config, "workerinput")
    wanted = [
        item.callspec.params["builder"]
        for item in ([] if in_xdist_worker else request.session.items)
        if getattr(item, "originalname", None) == _SELF and hasattr(item, "callspec")
    ]
    done: dict[str, _Rerun] = {}
    with tempfile.TemporaryDirectory(prefix="kvref-reproduce-") as root:
        for builder in wanted:
            rerun = _Rerun(failure=_meta_run(builder).result(builder.CAUGHT_BY))
            done[builder.__name__] = rerun
            if rerun.failure.reproduce is None:
                continue
            while any(r.process is not None and r.process.poll() is None for r in done.values()):
                time.sleep(0.05)
            rerun.start(Path(root) / builder.__name__)
        for rerun in done.values():
            if rerun.process is not None:
                rerun.finish()
        yield done


def _rerun_alone(builder: type, root: Path) -> _Rerun:
    """The meta-run of ``builder`` and the rerun of its line, one after the other."""
    rerun = _Rerun(failure=_meta_run(builder).result(builder.CAUGHT_BY))
    if rerun.failure.reproduce is not None:
        rerun.start(root / builder.__name__)
        rerun.finish()
    return rerun


#: Every broken builder's line, under `-m slow`: the default suite reruns the
#: lines of ``broken_builders.REPRODUCED`` inside tests/kit/test_meta.py's own runs.
@pytest.mark.slow
@pytest.mark.parametrize("builder", broken_builders.ALL, ids=lambda b: b.__name__)
def test_reproduce_line_fails_the_same_invariant(
    builder: type, reruns: dict[str, _Rerun], work: Path
) -> None:
    """The meant invariant's printed reproduce line exits 1 with that invariant FAILED."""
    meant = builder.CAUGHT_BY
    rerun = reruns.get(builder.__name__) or _rerun_alone(builder, work)
    failure = rerun.failure
    assert failure.status == "fail" and failure.reproduce, failure
    line = failure.reproduce
    assert f"--select {meant}" in line and "--seed 11" in line
    assert f"--timeout {broken_builders.meta_timeout(builder):g}" in line
    assert line.split()[1] == f"{builder.__module__}:{builder.__name__}"
    rows = dict(_ROW.findall(rerun.stdout))
    assert rerun.returncode == 1, (rerun.returncode, rerun.stdout[-2000:], rerun.stderr[-2000:])
    assert rows == {meant: "FAIL"}, (rows, rerun.stdout[-2000:], rerun.stderr[-2000:])
    assert f"[{meant}]" in rerun.stdout


def test_reproduce_line_names_a_main_builder_by_path(work: Path) -> None:
    """A builder defined in a script is named path.py:Class, and that line reproduces."""
    script = work / "vendor_script.py"
    script.write_text(
        "import sys\n"
        "from broken_builders import DroppedLayer\n"
        "from conformance.run.runner import check_builder\n"
        "class Mine(DroppedLayer):\n"
        "    pass\n"
        "if __name__ == '__main__':\n"
        "    r = check_builder(Mine, select=['KV-GROUP-PARTITION'], max_examples=10, seed=3,\n"
        "                      timeout=2.5, shrink=False)\n"
        "    print(next(x.reproduce for x in r.results if x.id == 'KV-GROUP-PARTITION'))\n"
    )
    env = kit_env()
    made = run_captured([sys.executable, str(script)], cwd=work, env=env, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    line = made.stdout.strip().splitlines()[-1]
    assert f"{script.resolve()}:Mine" in line and "--timeout 2.5" in line and "--no-shrink" in line
    done = _run_line(line, work)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert dict(_ROW.findall(done.stdout)) == {"KV-GROUP-PARTITION": "FAIL"}


# -- conformance.reproduce ----------------------------------------------------------------


def _report_json(builder: type, select: list[str], path: Path) -> Path:
    report = check_builder(builder, select=select, max_examples=15, seed=5, timeout=2.0)
    write_json(report, path)
    return path


@pytest.mark.parametrize(
    "builder", [broken_builders.OutOfBoundsOffset, broken_builders.DroppedLayer]
)
def test_replay_from_json_shows_the_same_violations(builder: type, work: Path) -> None:
    """The JSON's counterexample, rebuilt as objects and observed again, breaks the invariant."""
    meant = builder.CAUGHT_BY
    path = _report_json(builder, [meant], work / "report.json")
    data = json.loads(path.read_text())
    stored = next(r for r in data["results"] if r["id"] == meant)
    violations = conformance.reproduce(path, meant)
    assert violations and {v.invariant for v in violations} == {meant}
    # The replay sees what the run saw on its minimal counterexample.
    assert violations[0].message == stored["violations"][0]["message"]


def test_replay_with_a_fixed_builder_holds(work: Path) -> None:
    """Replaying against a fixed builder (here the reference) shows no violation."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    path = _report_json(broken_builders.OutOfBoundsOffset, [meant], work / "r.json")
    assert conformance.reproduce(path, meant, builder=ReferenceKVCacheConfigBuilder) == []


def test_replay_errors_name_what_is_missing(work: Path) -> None:
    """A passing invariant, an unknown id and an unreadable file are clear ReplayErrors."""
    path = _report_json(ReferenceKVCacheConfigBuilder, ["KV-GROUP-PARTITION"], work / "r.json")
    with pytest.raises(ReplayError, match="status 'pass'"):
        conformance.reproduce(path, "KV-GROUP-PARTITION")
    with pytest.raises(ReplayError, match="no result for invariant_id='KV-NOPE'"):
        conformance.reproduce(path, "KV-NOPE")
    bad = work / "bad.json"
    bad.write_bytes(b"\xff\x00not json")
    with pytest.raises(ReplayError, match="not a readable JSON report"):
        conformance.reproduce(bad, "KV-GROUP-PARTITION")
    assert isinstance(ReplayError("x"), ValueError)


# -- replay from data, never from the report's Python ---------------------------------------


@pytest.fixture(scope="module")
def out_of_bounds_report() -> Iterator[dict[str, Any]]:
    """One JSON report (as data) of a failure of KV-PLACE-IN-BOUNDS, shared by the tests below."""
    with tempfile.TemporaryDirectory(prefix="kvref-reproduce-") as name:
        builder = broken_builders.OutOfBoundsOffset
        path = _report_json(builder, [builder.CAUGHT_BY], Path(name) / "r.json")
        yield json.loads(path.read_text())


def _with_result(report: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``report`` whose failing result has ``changes``."""
    data = copy.deepcopy(report)
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    entry = next(r for r in data["results"] if r["id"] == meant)
    entry.update(changes)
    return data


def _spec_fields(report: dict[str, Any]) -> dict[str, Any]:
    """The fields of the first layer spec of the first worker, in the report's data."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    entry = next(r for r in report["results"] if r["id"] == meant)
    worker = entry["counterexample_data"]["workers"]["list"][0]
    spec: dict[str, Any] = worker["dict"][0][1]
    return spec


def test_replay_never_runs_the_python_field(
    out_of_bounds_report: dict[str, Any], work: Path
) -> None:
    """A planted payload in counterexample_python is neither run nor needed."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    marker = work / "pwned"
    payload = f"open({str(marker)!r}, 'w').write('ran')\nconfig = workers = None\n"
    planted = _with_result(out_of_bounds_report, counterexample_python=payload)
    path = work / "planted.json"
    path.write_text(json.dumps(planted))
    violations = conformance.reproduce(path, meant)
    assert not marker.exists()
    assert violations and {v.invariant for v in violations} == {meant}
    # Without any Python at all: the structured data alone reproduces the failure.
    bare = _with_result(out_of_bounds_report, counterexample_python=None)
    assert conformance.reproduce(bare, meant) == violations
    assert not marker.exists()


def test_replay_refuses_an_unknown_class(out_of_bounds_report: dict[str, Any]) -> None:
    """A record naming a class outside the kit's record types is refused, named."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    data = copy.deepcopy(out_of_bounds_report)
    _spec_fields(data)["record"] = "Popen"
    with pytest.raises(ReplayError, match=r"workers\[0\]\[.*\]\.record='Popen' is not one of"):
        conformance.reproduce(data, meant)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("block_size", "16", r"block_size='16' must be a positive int"),
        ("dtype", {"dtype": "system"}, r"\.dtype\.dtype='system' is not the name of a torch dtype"),
        ("head_size", [128], r"\.head_size=\[128\] is a list"),
        ("__class__", 1, r"has no field '__class__'"),
    ],
)
def test_replay_refuses_a_wrong_type(
    out_of_bounds_report: dict[str, Any], field: str, value: Any, message: str
) -> None:
    """A field carrying a value its type refuses is a ReplayError naming field and value."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    data = copy.deepcopy(out_of_bounds_report)
    _spec_fields(data)["fields"][field] = value
    with pytest.raises(ReplayError, match=message):
        conformance.reproduce(data, meant)


def test_replay_without_data_says_why(out_of_bounds_report: dict[str, Any]) -> None:
    """A report without counterexample_data (an older kit) is refused, not executed."""
    meant = broken_builders.OutOfBoundsOffset.CAUGHT_BY
    data = _with_result(out_of_bounds_report, counterexample_data=None)
    with pytest.raises(ReplayError, match="does not execute counterexample_python"):
        conformance.reproduce(data, meant)
