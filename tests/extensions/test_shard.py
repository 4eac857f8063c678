"""Shards (``--shard I/N``) and ``kvref-conformance merge``: the whole run, split and joined.

The proof: three shards' reports, merged, give the unsharded run's verdicts,
counts, counterexamples, coverage and reach, on a broken builder whose
failures show in several shards (the merge keeps the one the whole run
meets first) and, in the slow tier, on the reference's whole catalog.
tests/vllm/test_shard_native.py proves it for a vLLM-native builder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conformance.ci.merge import MergeError, read_shard_reports
from conformance.ci.shard_reports import SEAL, sealed
from conformance.cli import main
from conformance.harness.confine import KEY_ENV
from conformance.report.render import json_schema_path
from conformance.run.options import OptionError, RunOptions
from conformance.run.shard import Shard
from tests.shard_runs import differences, merge_is_whole, merged, whole_and_shards

BROKEN = "broken_builders.placement:OverlappingBlocks"
#: Invariants of five scenarios, the planted overlap's among them.
SELECT = "KV-GROUP-PARTITION,KV-PLACE-NUM-BLOCKS,KV-PLACE-NO-BLOCK-ALIAS,KV-CORE-MEMORY,KV-DEV-TAGS"
#: The planted overlap's invariant: it fails in more than one shard.
ALIAS = "KV-PLACE-NO-BLOCK-ALIAS"


@pytest.fixture(scope="module")
def broken_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Path]]:
    """``OverlappingBlocks``: the whole run and its three shards, each its own process."""
    return whole_and_shards(BROKEN, tmp_path_factory.mktemp("shards"), select=SELECT)


class TestOptions:
    @pytest.mark.parametrize(
        ("value", "says"),
        [
            ("3", "must be I/N"),
            ("a/b", "must be I/N"),
            ("0/3", "1 <= I <= N"),
            ("4/3", "1 <= I <= N"),
            ("1/0", "1 <= I <= N"),
        ],
    )
    def test_a_malformed_shard_is_named(self, value: str, says: str) -> None:
        with pytest.raises(OptionError, match=f"shard='{value}'.*{says}"):
            RunOptions(builder=None, shard=value, focus="off").validate(capabilities=())

    def test_a_shard_needs_the_focus_given(self) -> None:
        with pytest.raises(OptionError, match="needs the focus given"):
            RunOptions(builder=None, shard="1/2").validate(capabilities=())
        RunOptions(builder=None, shard="1/1").validate(capabilities=())

    def test_a_shard_cannot_explore(self) -> None:
        with pytest.raises(OptionError, match="cannot explore"):
            RunOptions(builder=None, shard="1/2", focus="off", explore=5.0).validate(
                capabilities=()
            )

    def test_the_cli_says_it_as_a_flag(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--shard", "2/3"]) == 2
        assert "--shard '2/3' needs the focus given" in capsys.readouterr().err

    @pytest.mark.parametrize("count", [1, 2, 3, 5])
    def test_every_stratum_is_in_one_shard(self, count: int) -> None:
        shards = [Shard(i, count) for i in range(1, count + 1)]
        for position in range(23):
            assert sum(s.owns(position) for s in shards) == 1


class TestMergeEquality:
    def test_three_shards_give_the_whole_run(
        self, broken_runs: tuple[dict[str, Any], list[Path]]
    ) -> None:
        # Not vacuous: it failed, and its failures lay in more than one shard.
        assert not merge_is_whole(broken_runs)["ok"]
        failing = [
            p
            for p in broken_runs[1]
            if json.loads(p.read_text())["shard"]["tallies"]["KV-PLACE-NO-BLOCK-ALIAS"][
                "failure_key"
            ]
        ]
        assert len(failing) >= 2, failing

    def test_each_shard_judges_a_part(self, broken_runs: tuple[dict[str, Any], list[Path]]) -> None:
        whole, paths = broken_runs
        parts = [json.loads(p.read_text()) for p in paths]
        for scenario, covered in whole["coverage"].items():
            counts = [d["coverage"].get(scenario, {}).get("examples", 0) for d in parts]
            assert sum(counts) == covered["examples"]
            assert max(counts) < covered["examples"], (scenario, counts)

    def test_the_merged_report_is_valid_json_of_the_schema(
        self, broken_runs: tuple[dict[str, Any], list[Path]], tmp_path: Path
    ) -> None:
        _, paths = broken_runs
        out = tmp_path / "merged.json"
        assert main(["merge", *map(str, paths), "--json", str(out)]) == 1
        data = json.loads(out.read_text())
        jsonschema.validate(data, json.loads(json_schema_path().read_text()))
        assert data["shard"] is None and data["options"]["shard"] is None

    @pytest.mark.slow
    def test_the_reference_whole_catalog(self, tmp_path: Path) -> None:
        """Every scenario, serving and the twin process included, reach measured."""
        runs = whole_and_shards(
            "kvref:ReferenceKVCacheConfigBuilder", tmp_path, select=None, examples=15
        )
        whole = merge_is_whole(runs)
        assert whole["ok"] and whole["reach"] is not None


@pytest.fixture(scope="module")
def vendor_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Path]]:
    """``OverlappingBlocks`` with a vendor's models: the whole run and its three shards."""
    models = Path(__file__).resolve().parents[1] / "data" / "models" / "acme_hydra.json"
    return whole_and_shards(
        BROKEN,
        tmp_path_factory.mktemp("vendor"),
        "--models",
        str(models),
        select="KV-GROUP-PARTITION,KV-PLACE-NO-BLOCK-ALIAS",
        examples=12,
    )


class TestVendorStratum:
    """``--models``: the vendor's half of every scenario is split by example, not dealt whole."""

    def test_the_merge_gives_the_whole_run(
        self, vendor_runs: tuple[dict[str, Any], list[Path]]
    ) -> None:
        assert not merge_is_whole(vendor_runs)["ok"]

    def test_every_shard_judges_part_of_the_vendors_models(
        self, vendor_runs: tuple[dict[str, Any], list[Path]]
    ) -> None:
        whole, paths = vendor_runs
        vendor = whole["coverage"]["placement"]["families"]["vendor"]
        parts = [json.loads(p.read_text())["coverage"]["placement"]["families"] for p in paths]
        counts = [part.get("vendor", 0) for part in parts]
        assert sum(counts) == vendor
        # Dealt whole, one shard judged all of them and the others none.
        assert min(counts) > 0 and max(counts) < vendor, counts

    @pytest.mark.parametrize("count", [1, 2, 3])
    def test_every_example_is_in_one_shard(self, count: int) -> None:
        shards = [Shard(i, count) for i in range(1, count + 1)]
        for index in range(17):
            assert sum(s.owns_example(index) for s in shards) == 1


class TestMergeRefuses:
    def _edit(self, path: Path, tmp: Path, name: str, **changes: Any) -> Path:
        data = json.loads(path.read_text())
        for key, value in changes.items():
            target = data
            *parents, last = key.split(".")
            for parent in parents:
                target = target[parent]
            target[last] = value
        out = tmp / name
        out.write_text(json.dumps(data))
        return out

    def test_a_missing_shard(self, broken_runs: tuple[dict[str, Any], list[Path]]) -> None:
        _, paths = broken_runs
        with pytest.raises(MergeError, match="shard 2 of 3 missing"):
            read_shard_reports([paths[0], paths[2]])

    def test_a_shard_given_twice(self, broken_runs: tuple[dict[str, Any], list[Path]]) -> None:
        _, paths = broken_runs
        with pytest.raises(MergeError, match="both shard 1"):
            read_shard_reports([paths[0], paths[0], paths[1], paths[2]])

    def test_another_option(
        self, broken_runs: tuple[dict[str, Any], list[Path]], tmp_path: Path
    ) -> None:
        _, paths = broken_runs
        other = self._edit(paths[1], tmp_path, "other.json", **{"options.timeout": 99.0})
        with pytest.raises(MergeError, match=r"option timeout=99\.0"):
            read_shard_reports([paths[0], other, paths[2]])
        other = self._edit(paths[1], tmp_path, "seed.json", seed=4)
        with pytest.raises(MergeError, match="seed=4"):
            read_shard_reports([paths[0], other, paths[2]])

    def test_not_a_shard_or_not_ended(
        self, broken_runs: tuple[dict[str, Any], list[Path]], tmp_path: Path
    ) -> None:
        whole, paths = broken_runs
        plain = tmp_path / "plain.json"
        plain.write_text(json.dumps(whole))
        with pytest.raises(MergeError, match="not a shard's report"):
            read_shard_reports([plain])
        cut = self._edit(paths[0], tmp_path, "cut.json", complete=False)
        with pytest.raises(MergeError, match="did not end"):
            read_shard_reports([cut, *paths[1:]])
        junk = tmp_path / "junk.json"
        junk.write_text("{")
        with pytest.raises(MergeError, match=r"junk\.json is not JSON"):
            read_shard_reports([junk])

    def test_the_cli_exits_2(
        self, broken_runs: tuple[dict[str, Any], list[Path]], capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, paths = broken_runs
        assert main(["merge", str(paths[0])]) == 2
        assert "shards 2, 3 of 3 missing" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("edit", "says"),
        [
            # The failure taken out of the tally: the merge would have passed it.
            (lambda d, i: d["shard"]["tallies"][ALIAS].update(failure_key=None), "tally gives"),
            (lambda d, i: d["shard"].pop("tallies"), "shard.tallies is missing"),
            (lambda d, i: d["shard"]["tallies"].pop(ALIAS), "only a skipped invariant"),
            (lambda d, i: d["results"][i].update(examples=999), "examples 999, but its tally"),
            (lambda d, i: d["shard"]["tallies"][ALIAS].update(judged=-1), "below its minimum"),
            (lambda d, i: d["shard"].update(index=3, count=2), "disagrees with its options"),
            (lambda d, i: d["results"][i].update(planted=1), "planted is no result field"),
            (lambda d, i: d["shard"]["coverage"]["placement"].update(models=[[1]]), "not string"),
            (
                lambda d, i: d["reach"]["modules"][0]["functions"].append([[1], "f", []]),
                "is not [index, name, [line, ...]]",
            ),
        ],
    )
    def test_an_edited_shard(
        self,
        broken_runs: tuple[dict[str, Any], list[Path]],
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        edit: Callable[[dict[str, Any], int], object],
        says: str,
    ) -> None:
        """A shard whose results, tallies or sets were edited is a usage error naming it."""
        _, paths = broken_runs
        failing = next(
            p for p in paths if json.loads(p.read_text())["shard"]["tallies"][ALIAS]["failure_key"]
        )
        data = json.loads(failing.read_text())
        edit(data, next(i for i, r in enumerate(data["results"]) if r["id"] == ALIAS))
        edited = tmp_path / "edited.json"
        edited.write_text(json.dumps(data))
        given = [edited if p == failing else p for p in paths]
        with pytest.raises(MergeError, match=f"edited.json: .*{re.escape(says)}"):
            read_shard_reports(given)
        assert main(["merge", *map(str, given)]) == 2
        assert says in capsys.readouterr().err


class TestSealedShards:
    """With the certification key held, merge takes only shards sealed with that key."""

    def _sealed_copies(self, paths: list[Path], tmp: Path) -> list[Path]:
        out = []
        for path in paths:
            copy = tmp / f"sealed-{path.name}"
            copy.write_text(json.dumps(sealed(json.loads(path.read_text()))))
            out.append(copy)
        return out

    def test_sealed_shards_merge_and_an_edit_is_refused(
        self,
        broken_runs: tuple[dict[str, Any], list[Path]],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        whole, paths = broken_runs
        monkeypatch.setenv(KEY_ENV, "the shards' key")
        copies = self._sealed_copies(paths, tmp_path)
        assert all(json.loads(c.read_text())["shard"][SEAL] for c in copies)
        assert differences(whole, merged(copies)) == []
        # Unsealed shards (runs without the key) are refused while the key is held.
        with pytest.raises(MergeError, match=f"{paths[0].name}: shard.seal has no seal"):
            read_shard_reports(paths)
        # An edit the tally checks cannot see: a result's seconds.
        data = json.loads(copies[1].read_text())
        data["results"][0]["seconds"] = 0.5 + data["results"][0]["seconds"]
        copies[1].write_text(json.dumps(data))
        with pytest.raises(MergeError, match="has a seal this key did not make"):
            read_shard_reports(copies)
        # Sealed under another key.
        (tmp_path / "again").mkdir()
        again = self._sealed_copies(paths, tmp_path / "again")
        monkeypatch.setenv(KEY_ENV, "another key")
        with pytest.raises(MergeError, match="has a seal this key did not make"):
            read_shard_reports(again)
        # Without the key a seal cannot be checked, and the tally checks still apply.
        monkeypatch.delenv(KEY_ENV)
        read_shard_reports(again)


class TestMergeTakesTheCiInputs:
    """Expectations and a baseline judge the merged whole run, as they judge a run."""

    def _failing(self, whole: dict[str, Any]) -> list[str]:
        failing = [r["id"] for r in whole["results"] if r["status"] == "fail"]
        assert failing, "the broken builder fails nothing: the fixture no longer tests this"
        return failing

    def test_expected_failures_pass_the_merge(
        self, broken_runs: tuple[dict[str, Any], list[Path]], tmp_path: Path
    ) -> None:
        whole, paths = broken_runs
        failing = self._failing(whole)
        manifest = tmp_path / "expected.toml"
        manifest.write_text(
            'format = "kvref-expectations/1"\n'
            + "".join(
                f'[[expected]]\nid = "{ident}"\nreason = "planted"\nlink = "x#1"\n'
                for ident in failing
            )
        )
        out = tmp_path / "merged.json"
        assert main(["merge", *map(str, paths)]) == 1
        assert (
            main(["merge", *map(str, paths), "--expectations", str(manifest), "--json", str(out)])
            == 0
        )
        merged = json.loads(out.read_text())
        assert {r["id"] for r in merged["results"] if r["status"] == "xfail"} == set(failing)

    def test_a_baseline_with_the_same_failures_passes(
        self, broken_runs: tuple[dict[str, Any], list[Path]], tmp_path: Path
    ) -> None:
        whole, paths = broken_runs
        self._failing(whole)
        baseline = tmp_path / "baseline.json"
        baseline.write_text(json.dumps(whole))
        out = tmp_path / "merged.json"
        args = [*map(str, paths), "--baseline", str(baseline), "--json", str(out)]
        assert main(["merge", *args]) == 0
        compared = json.loads(out.read_text())["baseline"]
        assert compared["new"] == [] and compared["unchanged"]

    def test_a_bad_manifest_is_a_usage_error(
        self,
        broken_runs: tuple[dict[str, Any], list[Path]],
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        _, paths = broken_runs
        bad = tmp_path / "bad.toml"
        bad.write_text("[[expected]\n")
        assert main(["merge", *map(str, paths), "--expectations", str(bad)]) == 2
        assert "--expectations" in capsys.readouterr().err
