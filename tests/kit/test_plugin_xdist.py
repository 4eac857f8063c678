"""The plugin's run split over pytest-xdist workers: one run's judgement."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from kit_runs import cli_args, plugin_args

from conformance.cli import main
from conformance.generate.engine_paths import EnginePath
from conformance.plugin_xdist import ShardExchangeError, XdistShard

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parents[1]


class TestShardOfWorker:
    def test_no_worker_no_shard(self, tmp_path: Path) -> None:
        assert XdistShard.of(None) is None
        one = {"workerid": "gw0", "workercount": 1, "kvref_exchange": str(tmp_path)}
        assert XdistShard.of(one) is None

    def test_worker_number_is_the_shard(self, tmp_path: Path) -> None:
        shard = XdistShard.of({"workerid": "gw2", "workercount": 3, "kvref_exchange": tmp_path})
        assert shard == XdistShard(3, 3, tmp_path)
        assert shard.spelled == "3/3"

    def test_a_replaced_worker_gets_no_share(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"'gw4' is not one of gw0..gw1"):
            XdistShard.of({"workerid": "gw4", "workercount": 2, "kvref_exchange": tmp_path})


def _both(tmp_path: Path, work: Any) -> list[Any]:
    """Run ``work(shard)`` for shards 1/2 and 2/2 at once, as two workers would."""
    out: list[Any] = [None, None]

    def one(i: int) -> None:
        try:
            out[i] = work(XdistShard(i + 1, 2, tmp_path))
        except Exception as exc:  # the test reads it
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_every_shard_draws_the_union_of_what_each_learned(tmp_path: Path) -> None:
    """The focus of the whole run: each family's engine paths, from whichever shard owns it."""
    a: EnginePath = ("BLHNC", True, False)
    b: EnginePath = ("LBNHC", False, False)
    learned = [{"hybrid": frozenset({a})}, {"jamba": frozenset({b}), "hybrid": frozenset({b})}]
    got = _both(tmp_path, lambda s: s.share_focus(learned[s.index - 1]))
    want = {"hybrid": frozenset({a, b}), "jamba": frozenset({b})}
    assert got == [want, want]


def test_nothing_learned_anywhere_is_no_focus(tmp_path: Path) -> None:
    assert _both(tmp_path, lambda s: s.share_focus({})) == [{}, {}]


def test_a_failed_shard_stops_the_others_waiting(tmp_path: Path) -> None:
    def work(shard: XdistShard) -> Any:
        if shard.index == 2:
            shard.fail("OptionError: the builder cannot be built")
            return "failed"
        return shard.whole_run()

    first, second = _both(tmp_path, work)
    assert second == "failed"
    assert isinstance(first, ShardExchangeError)
    assert "shard 2 of the kit's run failed: OptionError: the builder cannot be built" in str(first)


def _judgement(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "results": {
            r["id"]: (r["status"], r["examples"], r["inconclusive"], r.get("reproduce"))
            for r in data["results"]
        },
        "coverage": data["coverage"],
        "focus": data["focus"],
    }


@pytest.mark.parametrize(
    ("builder", "select"),
    [
        ("broken_builders:DroppedLayer", "KV-GROUP-PARTITION,KV-GROUP-NONEMPTY,KV-PLACE-IN-BOUNDS"),
    ],
)
@pytest.mark.usefixtures("tests_importable")
def test_two_workers_judge_as_one_run(
    builder: str,
    select: str,
    tmp_path: Path,
    pytester: pytest.Pytester,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``pytest -n 2``: the verdicts, counts, reproduce lines and coverage of the CLI's run."""
    main([builder, *cli_args(select, examples=3, seed=7), "--json", str(tmp_path / "cli.json")])
    capsys.readouterr()
    path = pytester.path / "plugin.json"
    result = pytester.runpytest_subprocess(
        *("-n", "2", *plugin_args(builder, examples=3, seed=7)),
        *("--kv-select", select, "--kv-json", str(path)),
    )
    cli = _judgement(json.loads((tmp_path / "cli.json").read_text()))
    plugin = _judgement(json.loads(path.read_text()))
    assert plugin == cli
    assert cli["results"]["KV-GROUP-PARTITION"][0] == "fail"
    # Learned from several families, which the two workers' shards share out.
    assert cli["focus"] != "off" and ";" in cli["focus"], cli["focus"]
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == sum(s == "fail" for s, *_ in cli["results"].values())


def test_each_worker_makes_a_share_not_the_whole_run(
    tmp_path: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both workers' builder processes answer, and together about as often as one run's."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    builder = "xdist_builders:NotesItsProcess"
    args = [
        *plugin_args(builder, examples=4, seed=4),
        *("--kv-select", "KV-PLACE-IN-BOUNDS,KV-PLACE-NUM-BLOCKS"),
    ]
    calls = {}
    for workers in ("0", "2"):
        log = tmp_path / f"calls-{workers}.txt"
        monkeypatch.setenv("KVREF_TEST_CALLS", str(log))
        result = pytester.runpytest_subprocess("-n", workers, *args)
        assert result.ret == 0, result.outlines[-20:]
        calls[workers] = log.read_text().split()
    assert len(set(calls["0"])) == 1
    assert len(set(calls["2"])) == 2, "one worker made no share of the run"
    # Each stratum's examples are judged once, by one worker (plus each one's own
    # preflight): nowhere near twice the calls of one run.
    assert len(calls["2"]) < 1.3 * len(calls["0"]), (len(calls["2"]), len(calls["0"]))
