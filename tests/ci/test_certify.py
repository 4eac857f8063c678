"""Certified runs: ``--certify`` and ``kvref-conformance verify``.

The certified run's plumbing is tested at a few examples per scenario
(``conformance.ci.certify.EXAMPLES``); the real run (the thorough profile) is
under ``-m slow``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conformance.ci import certify
from conformance.cli import _header_options, _parser, main
from conformance.report.render import json_schema_path
from kvref.versions import NEWEST, installed_vllm_version

BUILDER = '''"""A vendor's builder: the reference's planning, under its own name."""

from kvref import ReferenceKVCacheConfigBuilder


class Mine(ReferenceKVCacheConfigBuilder):
    """Plans as the reference does."""
'''
QUICK = ["--replays", "0", "--no-reach"]


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding a vendor builder and its certified report (``report.json``)."""
    root = tmp_path_factory.mktemp("certified")
    (root / "mine.py").write_text(BUILDER)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(certify, "EXAMPLES", 1)
        mp.delenv(certify.KEY_ENV, raising=False)
        code = main(
            ["mine.py:Mine", "--certify", "--json", "report.json", "--markdown", "kv.md", *QUICK]
        )
    # The verdict of one example per scenario is no matter here; the certificate is.
    assert code in (0, 1)
    yield root


@pytest.fixture
def copy_of(certified: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the certified directory, the current one (a test may edit it)."""
    shutil.copytree(certified, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(certify.KEY_ENV, raising=False)
    return tmp_path


def _report(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "report.json").read_text())
    return data


class TestCertifiedReport:
    def test_records_what_it_certifies(self, copy_of: Path) -> None:
        data = _report(copy_of)
        jsonschema.validate(data, json.loads(json_schema_path().read_text()))
        cert = data["certificate"]
        source = (copy_of / "mine.py").read_bytes()
        assert cert["files"] == [
            {"path": "mine.py", "sha256": hashlib.sha256(source).hexdigest(), "bytes": len(source)}
        ]
        # The release the run judged: the installed vLLM when supported, else the newest.
        judged = f"vLLM {installed_vllm_version() or NEWEST}"
        assert cert["contract"] == data["contract"] == judged
        assert cert["kit_version"] == data["kit_version"]
        assert cert["profile"] == "thorough" == data["profile"]
        assert cert["seed"] == certify.SEED == data["seed"]
        assert cert["device"] == "cpu" and cert["torch"] and cert["device_name"]
        assert cert["conformant"] == data["ok"]
        assert data["options"]["database"] is None
        assert cert["digest"]["algorithm"] == "sha256"
        # Nothing narrowed the run: every invariant, no expectation.
        assert data["options"]["select"] is None and data["options"]["unsupported"] == []
        assert all(r["expectation"] is None for r in data["results"])

    def test_summaries_name_it(self, copy_of: Path) -> None:
        digest = _report(copy_of)["certificate"]["digest"]["value"]
        summary = (copy_of / "kv.md").read_text()
        assert "### Certificate" in summary and digest in summary

    def test_verifies(self, copy_of: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["verify", "report.json"]) == 0
        out = capsys.readouterr().out
        judged = f"vLLM {installed_vllm_version() or NEWEST}"
        assert "valid" in out and judged in out and "mine.py:Mine" in out

    def test_tampered_verdict_fails(
        self, copy_of: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        data = _report(copy_of)
        result = data["results"][0]
        result["status"] = "pass" if result["status"] != "pass" else "fail"
        (copy_of / "report.json").write_text(json.dumps(data, indent=2))
        assert main(["verify", "report.json"]) == 1
        assert "digest does not match" in capsys.readouterr().err

    def test_reformatted_report_still_verifies(self, copy_of: Path) -> None:
        """The digest is over the data, not the bytes: re-indenting the file keeps it valid."""
        data = _report(copy_of)
        (copy_of / "report.json").write_text(json.dumps(data, sort_keys=True))
        assert main(["verify", "report.json"]) == 0

    def test_edited_builder_fails(self, copy_of: Path, capsys: pytest.CaptureFixture[str]) -> None:
        with (copy_of / "mine.py").open("a") as f:
            f.write("\n# a later edit\n")
        assert main(["verify", "report.json"]) == 1
        assert "mine.py changed since it was certified" in capsys.readouterr().err

    def test_missing_builder_file_fails(
        self, copy_of: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        (copy_of / "mine.py").unlink()
        assert main(["verify", "report.json"]) == 1
        assert "mine.py is missing" in capsys.readouterr().err

    def test_root_option(self, copy_of: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
        """Relative paths are read from --root: another checkout of the sources verifies."""
        elsewhere = tmp_path_factory.mktemp("elsewhere")
        shutil.move(copy_of / "report.json", elsewhere / "report.json")
        assert main(["verify", str(elsewhere / "report.json"), "--root", str(copy_of)]) == 0

    def test_conformant_flag(self, copy_of: Path) -> None:
        expected = 0 if _report(copy_of)["ok"] else 1
        assert main(["verify", "report.json", "--conformant"]) == expected


class TestKeyedDigest:
    def _keyed(self, root: Path, key: bytes) -> None:
        data = _report(root)
        data["certificate"]["digest"]["algorithm"] = "hmac-sha256"
        data["certificate"]["digest"]["value"] = certify.report_digest(data, key)
        (root / "report.json").write_text(json.dumps(data))

    def test_keyed_verifies_only_with_the_key(
        self, copy_of: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        self._keyed(copy_of, b"ci-secret")
        assert main(["verify", "report.json"]) == 1
        assert certify.KEY_ENV in capsys.readouterr().err
        monkeypatch.setenv(certify.KEY_ENV, "another")
        assert main(["verify", "report.json"]) == 1
        monkeypatch.setenv(certify.KEY_ENV, "ci-secret")
        assert main(["verify", "report.json"]) == 0

    def test_a_report_minted_with_the_public_algorithm_is_refused_under_a_key(
        self, copy_of: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Anyone can forge a verdict and recompute a plain sha256: a key set refuses it."""
        data = _report(copy_of)
        for result in data["results"]:
            result.update(status="pass", violations=[])
        data["ok"] = data["certificate"]["conformant"] = True
        data["certificate"]["digest"] = {"algorithm": "sha256", "value": None}
        data["certificate"]["digest"]["value"] = certify.report_digest(data, None)
        (copy_of / "report.json").write_text(json.dumps(data))
        assert main(["verify", "report.json"]) == 0  # no key: only an edit check
        monkeypatch.setenv(certify.KEY_ENV, "ci-secret")
        assert main(["verify", "report.json"]) == 1
        assert "not signed with the key" in capsys.readouterr().err
        assert not certify.verify(copy_of / "report.json", key=b"ci-secret").valid

    def test_plain_digest_is_no_signature(self, copy_of: Path) -> None:
        """Documented: whoever edits a plain-sha256 report and recomputes the digest passes."""
        data = _report(copy_of)
        data["results"][0]["status"] = "pass"
        data["certificate"]["digest"]["value"] = certify.report_digest(data, None)
        (copy_of / "report.json").write_text(json.dumps(data))
        assert main(["verify", "report.json"]) == 0


class TestContainment:
    """A certificate only where the builder could reach neither the verdict nor the key."""

    @pytest.mark.parametrize(
        ("facts", "named"),
        [
            ({"judge_memory": "writable", "certify_key": "absent"}, "open the judging"),
            ({"judge_memory": "refused", "certify_key": "in memory"}, certify.KEY_ENV),
        ],
    )
    def test_no_certificate_where_it_did_not_hold(
        self, copy_of: Path, facts: dict[str, str], named: str
    ) -> None:
        from conformance.report.model import Report

        report = Report(
            builder="mine.py:Mine",
            device="cpu",
            seed=certify.SEED,
            profile=certify.PROFILE,
            max_examples=1,
            results=(),
            seconds=0.0,
            containment={"roles": {"worker": facts}},
        )
        inputs = certify.CertifyInputs(builder="mine.py:Mine", root=copy_of, files=())
        with pytest.raises(certify.CertifyError, match=named):
            certify.seal(report, inputs)


class TestRefused:
    @pytest.mark.parametrize(
        ("extra", "named"),
        [
            (["--select", "KV-GROUP"], "--select"),
            (["--unsupported", "host_resident"], "--unsupported"),
            (["--expectations", "vllm-0.33.0"], "--expectations"),
            (["--seed", "3"], "--seed"),
            (["--max-examples", "3"], "--max-examples"),
            (["--no-isolate"], "--no-isolate"),
        ],
    )
    def test_conflicting_option(
        self,
        extra: list[str],
        named: str,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        args = ["--certify", "--json", str(tmp_path / "r.json"), *extra]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"--certify cannot be combined with {named}" in err
        assert "Traceback" not in err and not (tmp_path / "r.json").exists()

    def test_needs_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--certify"]) == 2
        assert "--certify needs --json" in capsys.readouterr().err

    def test_unloadable_builder(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["no_such_module:B", "--certify", "--json", str(tmp_path / "r.json")]) == 2
        assert "no_such_module" in capsys.readouterr().err


HIDES = '''"""Lies to the child process that lists its files: claims another file only."""

import atexit
import sys

from kvref import ReferenceKVCacheConfigBuilder

atexit.register(lambda: sys.stdout.write('\\n["/dev/null"]\\n'))


class Hides(ReferenceKVCacheConfigBuilder):
    """Plans as the reference does."""
'''


def test_named_module_is_hashed_whatever_the_child_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builder's own module is found without running it: a lying builder cannot drop it."""
    (tmp_path / "hides.py").write_text(HIDES)
    monkeypatch.chdir(tmp_path)
    listed = certify.builder_files("hides.py:Hides")
    assert Path("/dev/null") in listed  # the child's answer is the builder's to forge ...
    assert certify.named_module_file("hides.py:Hides") == (tmp_path / "hides.py").resolve()
    assert certify.named_module_file("hides:Hides") == (tmp_path / "hides.py").resolve()
    assert certify.named_module_file("no.such.module:X") is None
    # ... but the certificate holds the named module too.
    args = _parser().parse_args(["hides.py:Hides", "--certify", "--json", "r.json"])
    assert "hides.py" in [f["path"] for f in certify.certify_args(args).files]


class TestVerifyInput:
    def test_missing_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["verify", str(tmp_path / "nope.json")]) == 2
        assert "nope.json" in capsys.readouterr().err

    def test_not_json(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (tmp_path / "r.json").write_text("{not json")
        assert main(["verify", str(tmp_path / "r.json")]) == 2
        err = capsys.readouterr().err
        assert "r.json" in err and "not JSON" in err

    def test_not_a_report(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (tmp_path / "r.json").write_text("[1, 2]")
        assert main(["verify", str(tmp_path / "r.json")]) == 2
        assert "is not a kvref-conformance JSON report" in capsys.readouterr().err

    def test_uncertified_report(self, copy_of: Path, capsys: pytest.CaptureFixture[str]) -> None:
        data = copy.deepcopy(_report(copy_of))
        data.pop("certificate")
        (copy_of / "report.json").write_text(json.dumps(data))
        assert main(["verify", "report.json"]) == 1
        assert "no certificate" in capsys.readouterr().err


@pytest.mark.slow
def test_real_certified_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's certified run of the reference: thorough profile, conformant, verifies."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(certify.KEY_ENV, raising=False)
    assert main(["--certify", "--json", "report.json", "--no-database"]) == 0
    assert _report(tmp_path)["certificate"]["conformant"] is True
    assert main(["verify", "report.json", "--conformant"]) == 0


class TestHeader:
    def test_header_names_certify_and_html(self) -> None:
        """The run header repeats --certify and --html, as it repeats --json and --junit."""
        args = _parser().parse_args(["--certify", "--json", "r.json", "--html", "r.html"])
        words = _header_options(args)
        assert "--certify" in words
        assert words[words.index("--html") + 1] == "r.html"
        plain = _header_options(_parser().parse_args([]))
        assert "--certify" not in plain and "--html" not in plain
