"""Reports for CI: JUnit valid against the common schema, JSON with a schema.

The JUnit file is validated against the schemas CI servers use, as reproduced
in tests/data: Jenkins xunit's ``junit-10.xsd``, the Ant JUnit schema
(``ant-junit.xsd``) and the project's older union of the two (``junit.xsd``);
the JSON against the schema the package ships
(``conformance/report/report.schema.json``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xmlschema
from kit_runs import quick_check
from verdict_builders import ColourfulError

from conformance import InvariantResult, Report, Violation
from conformance.ci.expectations.xfail import XfailFileError, read_xfail_file
from conformance.ci.junit import write_incomplete_junit, write_junit
from conformance.contract import CONTRACT
from conformance.report.render import (
    JSON_SCHEMA_VERSION,
    RunStart,
    format_header,
    format_report,
    incomplete_report_dict,
    json_schema_path,
    report_to_dict,
    write_json,
)
from conformance.run.runner import UnknownIdWarning
from kvref import ReferenceKVCacheConfigBuilder

ROOT = Path(__file__).resolve().parents[2]
JUNIT = xmlschema.XMLSchema(ROOT / "tests" / "data" / "junit.xsd")
JENKINS = xmlschema.XMLSchema(ROOT / "tests" / "data" / "junit-10.xsd")
ANT = xmlschema.XMLSchema(ROOT / "tests" / "data" / "ant-junit.xsd")
SCHEMAS = {"project": JUNIT, "jenkins-xunit-junit-10": JENKINS, "ant": ANT}


def _validate(path: Path) -> None:
    """Validate against every schema; raises with the first error of the first that refuses."""
    for schema in SCHEMAS.values():
        schema.validate(path)


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(json_schema_path().read_text())
    return schema


def _result(status: str, **fields: Any) -> InvariantResult:
    return InvariantResult(
        id=f"KV-TEST-{status.upper()}",
        title=f"a {status} invariant",
        reference="docs/contract.md#verdicts",
        status=status,
        **fields,
    )


def every_status() -> Report:
    """A report with one result of each verdict, failures with their details."""
    broke = (Violation(invariant="KV-TEST-FAIL", message="layer in no group", layer="a"),)
    details = {
        "violations": broke,
        "counterexample": "PlanningProblem(...)",
        "counterexample_python": "config = PlanningConfig()\n",
        "scenario": "grouping",
        "reproduce": "kvref-conformance m:B --select KV-TEST-FAIL --seed 1 --no-database",
    }
    results = (
        _result("pass", examples=3),
        _result("fail", examples=3, **details),
        _result("inconclusive", inconclusive=3, reason="a call it needs failed"),
        _result("not-applicable", reason="not applicable on cpu: cpu has no memory counter"),
        _result("skipped", reason="the builder declares no support for host_resident"),
        _result("xfail", examples=2, **details),
        _result("xpass", examples=4),
    )
    return Report(
        builder="m:B",
        device="cpu",
        seed=1,
        profile="ci",
        max_examples=3,
        results=results,
        seconds=0.5,
    )


def _real_run(builder: Any, *select: str, examples: int, **options: Any) -> Report:
    """A real run's report at seed 1, run as the CLI runs it: isolated, reach measured."""
    return quick_check(
        builder, *select, examples=examples, seed=1, isolate=True, reach=None, **options
    )


def _junit(report: Report, tmp_path: Path) -> ET.Element:
    path = tmp_path / "r.xml"
    write_junit(report, path)
    _validate(path)  # raises with the first schema error
    return ET.parse(path).getroot()


def _edited_junit(tmp_path: Path, find: str, edit: Callable[[ET.Element], object]) -> Path:
    """The JUnit file of :func:`every_status`, its element at ``find`` changed by ``edit``.

    What an older or a broken writer would have written: a schema must refuse it.
    ``find`` is an ElementTree path from the root (``"."``: the root itself).
    """
    path = tmp_path / "r.xml"
    write_junit(every_status(), path)
    tree = ET.parse(path)
    element = tree.getroot().find(find)
    assert element is not None
    edit(element)
    tree.write(path)
    return path


def _suite_of(path: Path) -> ET.Element:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return suite


class TestJUnit:
    """'the JUnit file lacks the errors attribute required by the common JUnit schema'."""

    def test_every_verdict_validates(self, tmp_path: Path) -> None:
        root = _junit(every_status(), tmp_path)
        suite = root.find("testsuite")
        assert suite is not None
        assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
            "tests": "7",
            "failures": "1",
            "errors": "1",
            "skipped": "3",
        }
        assert root.attrib == {}  # Ant's aggregated layout allows none

    def test_schema_rejects_a_suite_without_errors(self, tmp_path: Path) -> None:
        # The validator is no rubber stamp: the old file's shape fails it.
        path = _edited_junit(tmp_path, "testsuite", lambda suite: suite.attrib.pop("errors"))
        assert not any(schema.is_valid(path) for schema in SCHEMAS.values())

    @pytest.mark.parametrize(
        ("schema", "where", "attribute"),
        [
            ("jenkins-xunit-junit-10", "testsuites", "skipped"),
            ("jenkins-xunit-junit-10", "testcase", "status"),
            ("ant", "testsuites", "tests"),
            ("ant", "testcase", "status"),
        ],
    )
    def test_schemas_refuse_what_the_old_file_wrote(
        self, tmp_path: Path, schema: str, where: str, attribute: str
    ) -> None:
        """'testsuites skipped and testcase status, which junit-10.xsd rejects'."""
        find = "." if where == "testsuites" else ".//testcase"
        path = _edited_junit(tmp_path, find, lambda element: element.set(attribute, "1"))
        assert not SCHEMAS[schema].is_valid(path)

    def test_ant_refuses_a_case_with_two_outcomes(self, tmp_path: Path) -> None:
        def add_output(case: ET.Element) -> None:
            ET.SubElement(case, "system-out").text = "x"

        path = _edited_junit(tmp_path, ".//testcase[failure]", add_output)
        assert JENKINS.is_valid(path) and not ANT.is_valid(path)

    def test_times_are_per_invariant(self, tmp_path: Path) -> None:
        """'every testcase has time="0"': each case carries the time spent on it alone."""
        report = _real_run(
            ReferenceKVCacheConfigBuilder, "KV-GROUP-PARTITION", "KV-CORE-SLACK", examples=3
        )
        assert all(r.seconds > 0 for r in report.results)
        assert set(report.observe_seconds) >= {"grouping", "core"}
        # Judging alone never exceeds the run: the shared observations are apart.
        assert sum(r.seconds for r in report.results) < report.seconds
        root = _junit(report, tmp_path)
        times = {c.get("name"): float(c.get("time") or "nan") for c in root.iter("testcase")}
        assert times == {r.id: round(r.seconds, 3) for r in report.results}
        props = {p.get("name"): p.get("value") for p in root.iter("property")}
        assert float(props["observe_seconds.core"] or "nan") > 0

    def test_real_run_validates(self, tmp_path: Path) -> None:
        report = _real_run(
            ReferenceKVCacheConfigBuilder,
            "KV-GROUP",
            "KV-DEV",
            examples=2,
            xfail=["KV-GROUP-NONEMPTY"],
        )
        _junit(report, tmp_path)

    def test_control_characters_are_stripped(self, tmp_path: Path) -> None:
        """'becomes malformed XML when an error message contains control characters'."""
        report = _real_run(ColourfulError, "KV-CALL-RAISES", examples=2)
        message = " ".join(str(v) for v in report.result("KV-CALL-RAISES").violations)
        assert "\x1b[31m" in message and "\x00" in message  # the report keeps them; XML cannot
        root = _junit(report, tmp_path)
        text = ET.tostring(root, encoding="unicode")
        assert "boom" in text and "tail" in text
        assert not any(c in text for c in "\x1b\x00\x07\ud800")
        write_json(report, tmp_path / "r.json")
        loaded = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
        # JSON escapes what it cannot carry, so the message survives as it was.
        assert "\x1b[31mboom" in loaded["results"][0]["violations"][0]["message"]

    def test_xfail_and_xpass_are_visible(self, tmp_path: Path) -> None:
        """'drops XFAIL details and hides XPASS'."""
        root = _junit(every_status(), tmp_path)
        cases = {c.get("name"): c for c in root.iter("testcase")}
        props = {p.get("name"): p.get("value") for p in root.iter("property")}
        verdicts = dict(v.split("=") for v in (props["verdicts"] or "").split(","))
        assert verdicts == {r.id: r.status for r in every_status().results}
        xfail = cases["KV-TEST-XFAIL"]
        skipped = xfail.find("skipped")
        assert skipped is not None and (skipped.get("message") or "").startswith("XFAIL")
        assert "layer in no group" in (skipped.text or "")
        assert "reproduce: kvref-conformance" in (skipped.text or "")
        xpass = cases["KV-TEST-XPASS"]
        assert len(xpass) == 0  # it passes; Ant's layout has no output in a case
        out = root.find("testsuite/system-out")
        assert out is not None and "XPASS KV-TEST-XPASS" in (out.text or "")
        assert "4 examples" in (out.text or "")
        assert props["xpass"] == "KV-TEST-XPASS"
        text = format_report(every_status())
        assert "XPASS KV-TEST-XPASS" in text and "XFAIL KV-TEST-XFAIL" in text


class TestJson:
    """'the JSON has no documented schema and no version'."""

    def test_schema_is_valid_and_versioned(self) -> None:
        schema = _schema()
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["properties"]["schema_version"]["const"] == JSON_SCHEMA_VERSION

    def test_schema_is_shipped(self) -> None:
        # The file beside the module is what an installed wheel carries if package-data says so.
        assert json_schema_path().is_file()
        pyproject = (ROOT / "pyproject.toml").read_text()
        line = next(x for x in pyproject.splitlines() if x.startswith("conformance = ["))
        assert f'"{json_schema_path().relative_to(ROOT / "conformance").as_posix()}"' in line

    @pytest.mark.parametrize("report", ["every_status", "real"])
    def test_reports_validate(self, report: str, tmp_path: Path) -> None:
        made = (
            every_status()
            if report == "every_status"
            else _real_run(ReferenceKVCacheConfigBuilder, "KV-PLACE-NUM-BLOCKS", examples=2)
        )
        path = tmp_path / "r.json"
        write_json(made, path)
        data = json.loads(path.read_text())
        jsonschema.Draft202012Validator(_schema()).validate(data)
        assert data["schema_version"] == JSON_SCHEMA_VERSION
        assert data["kit_version"] == version("kvref")

    def test_every_field_is_documented(self) -> None:
        # Fields may be added without a version bump, but never undocumented.
        schema = _schema()
        data = report_to_dict(every_status())
        assert set(data) == set(schema["properties"])
        result_props = schema["$defs"]["result"]["properties"]
        for result in data["results"]:
            assert set(result) == set(result_props)
            for violation in result["violations"]:
                assert set(violation) == set(schema["$defs"]["violation"]["properties"])
        real = _real_run(ReferenceKVCacheConfigBuilder, "KV-GROUP-PARTITION", examples=1)
        options = report_to_dict(real)["options"]
        assert options and set(options) <= set(schema["properties"]["options"]["properties"])

    @pytest.mark.parametrize(
        ("path", "value"),
        [
            (("results", 0, "status"), "passed"),
            (("results", 0, "examples"), 0),  # a pass that judged nothing
            (("schema_version",), 2),
            (("ok",), "yes"),
        ],
    )
    def test_schema_rejects(self, path: tuple[Any, ...], value: Any) -> None:
        data = report_to_dict(every_status())
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(_schema()).validate(data)


class TestXfailFiles:
    """'unknown KV-DEV-* ids in xfail files' and 'a binary xfail file traceback'."""

    @pytest.mark.parametrize(
        "content", [b"\xff\xfe\x00K\x00V", b"KV-GROUP-PARTITION\x00\x01\x02\n", b"\x89PNG\r\n"]
    )
    def test_binary_file_is_a_clear_error(self, content: bytes, tmp_path: Path) -> None:
        path = tmp_path / "xfail.bin"
        path.write_bytes(content)
        with pytest.raises(XfailFileError, match="xfail file"):
            read_xfail_file(path)

    def test_missing_file_is_a_clear_error(self, tmp_path: Path) -> None:
        with pytest.raises(XfailFileError, match="cannot read"):
            read_xfail_file(tmp_path / "absent.txt")

    def test_unknown_device_id_warns_in_python(self) -> None:
        with pytest.warns(UnknownIdWarning, match="KV-DEV-NOPE"):
            _real_run(
                ReferenceKVCacheConfigBuilder,
                "KV-GROUP-PARTITION",
                xfail=["KV-DEV-NOPE"],
                examples=1,
            )


class TestCounterexampleSource:
    """Counterexamples as Python: the source rebuilds the objects it shows."""

    def test_fractional_tokens_per_state_round_trips(self) -> None:
        """A spec whose tokens_per_state is a Fraction comes back equal, its import included."""
        from fractions import Fraction

        import torch

        from conformance.report.pycode import to_python
        from kvref.specs import MLAAttentionSpec

        spec = MLAAttentionSpec(
            block_size=64,
            num_kv_heads=1,
            head_size=128,
            dtype=torch.uint8,
            tokens_per_state=Fraction(3, 2),
        )
        source = to_python({"spec": spec})
        assert "from fractions import Fraction" in source
        namespace: dict[str, Any] = {}
        exec(compile(source, "<counterexample>", "exec"), namespace)
        assert namespace["spec"] == spec
        assert namespace["spec"].tokens_per_state == Fraction(3, 2)


class TestIncompleteOutputs:
    """The files a run writes before its first example, and how final reports differ."""

    START = RunStart(
        builder="m:B",
        device="cpu",
        seed=9,
        profile="ci",
        max_examples=50,
        options=("--select", "KV-CORE"),
    )

    def test_incomplete_junit_is_a_valid_error(self, tmp_path: Path) -> None:
        """A CI reading the marker sees one error, never a pass; it validates."""
        path = tmp_path / "r.xml"
        write_incomplete_junit(self.START, path)
        _validate(path)
        root = ET.parse(path).getroot()
        props = {p.get("name"): p.get("value") for p in root.iter("property")}
        assert _suite_of(path).get("errors") == "1" and props["complete"] == "False"
        error = root.find(".//testcase/error")
        assert error is not None and error.get("message", "").startswith("INCOMPLETE")

    def test_final_reports_say_complete(self, tmp_path: Path) -> None:
        """The final JSON and JUnit say complete, so readers can tell them from a marker."""
        assert report_to_dict(every_status())["complete"] is True
        root = _junit(every_status(), tmp_path)
        props = {p.get("name"): p.get("value") for p in root.iter("property")}
        assert props["complete"] == "True"

    def test_schema_refuses_an_incomplete_file_with_results(self) -> None:
        """complete false carries no verdicts: results in such a file fail the schema."""
        data = incomplete_report_dict(self.START)
        jsonschema.Draft202012Validator(_schema()).validate(data)
        data["results"] = report_to_dict(every_status())["results"]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(_schema()).validate(data)

    def test_header_is_separable(self) -> None:
        """The CLI prints the header before the run and the report without it after."""
        header = format_header(self.START)
        assert header.splitlines() == [
            f"kvref-conformance {version('kvref')} ({CONTRACT} contract): builder m:B on cpu, "
            "profile ci, "
            "50 examples per scenario, seed 9",
            "options: --select KV-CORE",
        ]
        text = format_report(every_status(), header=False)
        assert not text.startswith("kvref-conformance") and text.startswith("invariant")
        assert format_report(every_status()).startswith("kvref-conformance ")


def test_an_xfail_shows_its_expectations_reason_and_link() -> None:
    """'the HTML report shows XFAIL badges without the expectation's reason or link'."""
    result = {
        "id": "KV-GROUP-PARTITION",
        "title": "t",
        "status": "xfail",
        "reference": "docs/contract.md#grouping-partition",
        "expectation": {
            "id": "KV-GROUP-PARTITION",
            "reason": "drops a layer <b>known</b>",
            "link": "https://example.invalid/issues/1",
            "strict": False,
            "source": "ci/kv.toml",
        },
    }
    data = {"builder": "m:B", "results": [result], "ok": True}
    from conformance.ci.html import format_html

    page = format_html(data)
    assert "expected: drops a layer &lt;b&gt;known&lt;/b&gt;" in page
    assert '<a href="https://example.invalid/issues/1" rel="noreferrer">' in page
    assert "(ci/kv.toml)" in page and "<b>known</b>" not in page
    # A link that is no web address stays text.
    result["expectation"]["link"] = "javascript:alert(1)"  # type: ignore[index]
    assert 'href="javascript' not in format_html(data)


def test_what_the_builder_wrote_is_text_in_every_report_format(tmp_path: Path) -> None:
    """Escapes, controls, a lone surrogate and a huge message of the builder's, in each format.

    Raw terminal escapes reached the text report, raw HTML the Markdown
    summary; a lone surrogate crashed the HTML page; a message of any size
    was kept whole.
    """
    import attrs

    from conformance import InvariantResult, Report
    from conformance.check.violations import TEXT_LIMIT, Violation
    from conformance.ci.html import write_html
    from conformance.ci.markdown import format_markdown
    from conformance.report.render import format_report

    hostile = "\x1b[2K\rOK\x1b]0;title\x07 <img src=x onerror=alert(1)> | done \ud800\x00"
    huge = hostile + "x" * (4 * TEXT_LIMIT)
    result = InvariantResult(
        id="KV-PLACE-IN-BOUNDS",
        title="t",
        reference="docs/contract.md#memory-safety",
        status="fail",
        violations=(Violation(invariant="KV-PLACE-IN-BOUNDS", message=huge, layer=hostile),),
        reason=huge,
        counterexample="c",
    )
    report = Report(
        builder="m:B", device="cpu", seed=1, profile="ci", max_examples=1,
        results=(result,), seconds=1.0, builder_output=hostile,
    )  # fmt: skip
    (kept,) = report.results[0].violations
    assert len(kept.message) < TEXT_LIMIT + 100 and kept.message.endswith("characters cut]")
    assert report.results[0].reason is not None and len(report.results[0].reason) < 2 * TEXT_LIMIT
    text = format_report(report)
    assert not any(c in text for c in "\x1b\r\x07\ud800\x00")
    summary = format_markdown(attrs.evolve(report, builder_output=""))
    assert "<img" not in summary and "&lt;img src=x onerror=alert(1)&gt;" in summary
    assert "\x1b" not in summary
    write_html(report, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<img" not in page and not any(c in page for c in "\x1b\x07\x00")
    write_junit(report, tmp_path / "r.xml")
    xml = ET.tostring(ET.parse(tmp_path / "r.xml").getroot(), encoding="unicode")
    assert not any(c in xml for c in "\x1b\x07\x00")
    write_json(report, tmp_path / "r.json")
    (loaded,) = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["results"]
    assert len(loaded["violations"][0]["message"]) < TEXT_LIMIT + 100
