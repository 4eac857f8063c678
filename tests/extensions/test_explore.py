"""Coverage-guided exploration (conformance/extensions/explore/, ``--explore``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import attrs
import pytest
from draws import draws

import conformance
from conformance.cli import main
from conformance.extensions.explore.corpus import Corpus, CorpusError
from conformance.extensions.explore.explorer import MUTATIONS, mutate
from conformance.generate.limits import NO_LIMITS
from conformance.generate.problems import model_config_fields
from conformance.report.render import report_to_dict
from conformance.run.options import OptionError, RunOptions
from conformance.run.runner import check_builder
from conformance.scenarios.examples import Example, reference_accepts
from conformance.scenarios.registry import examples
from kvref import FullAttentionSpec, PlanningConfig

GATED = "explore_builders:IndexCacheShortBacking"
LEGAL = "explore_builders:IndexCacheSplitTensors"
MEANT = "KV-PLACE-BACKING-SIZE"
#: Candidates, not seconds, end these explorations: the same at any machine load
#: (the time limit is far beyond what they take on a loaded 2-core machine).
CANDIDATES = 400
SECONDS = 600.0


def _run(builder: str, seed: int = 1, **kw: Any) -> Any:
    kw.setdefault("shrink", False)
    return check_builder(builder, select=[MEANT], seed=seed, **kw)


def _examples(n: int = 25) -> list[Example]:
    return draws(examples("placement"), n)


class TestMutations:
    """Each mutation keeps the example a valid problem, or declines."""

    def test_every_mutated_example_is_a_valid_problem(self) -> None:
        rng = random.Random(3)
        made = 0
        for ex in _examples():
            for _ in range(4):
                result = mutate(rng, ex, NO_LIMITS)
                if result is None:
                    continue
                name, child = result
                made += 1
                assert set(name.split("+")) <= set(dict(MUTATIONS))
                assert f"; explored: {name}'," in child.description
                assert reference_accepts(child.config, child.workers)
                assert child != ex
        assert made > 50

    def test_an_added_layer_follows_decoder_layers_that_hold_no_cache(self) -> None:
        """A model whose last decoder layers are cache-less (MLP) grows by one layer, at its end."""
        spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
        workers = ({f"model.layers.{i}.self_attn.attn": spec for i in (0, 1)},)
        config = PlanningConfig(
            max_model_len=4096, **{**model_config_fields(workers[0]), "num_hidden_layers": 4}
        )
        ex = Example(config, workers, (1 << 30,), 8, "two caches over four decoder layers")
        child = dict(MUTATIONS)["add-layer"](random.Random(0), ex)
        assert child is not None
        assert sorted(child.merged) == sorted([*workers[0], "model.layers.4.self_attn.attn"])
        assert child.config.num_hidden_layers == 5

    def test_a_dropped_role_is_gone_from_every_worker(self) -> None:
        operator = dict(MUTATIONS)["drop-role"]
        for ex in _examples():
            child = operator(random.Random(0), ex)
            if child is None:
                continue
            before = {n.rpartition(".")[2] for n in ex.merged}
            after = {n.rpartition(".")[2] for n in child.merged}
            assert len(after) == len(before) - 1 and after < before

    def test_an_added_layer_is_a_copy_after_the_last_target_layer(self) -> None:
        operator = dict(MUTATIONS)["add-layer"]
        added = 0
        for ex in _examples(40):
            child = operator(random.Random(0), ex)
            if child is None:
                continue
            added += 1
            # The copies are target layers of one new decoder layer; drafts keep their specs.
            targets = [s for s in ex.merged.values() if not s.is_draft]
            grown = [s for s in child.merged.values() if not s.is_draft]
            assert len(targets) < len(grown) <= 2 * len(targets), child.description
            assert len(child.merged) - len(ex.merged) == len(grown) - len(targets)
            assert sorted(map(repr, (s for s in child.merged.values() if s.is_draft))) == sorted(
                map(repr, (s for s in ex.merged.values() if s.is_draft))
            )
            if ex.config.num_hidden_layers is not None:
                assert child.config.num_hidden_layers == ex.config.num_hidden_layers + 1
            assert len(child.workers) == len(ex.workers)
        assert added > 10

    def test_an_added_layer_renumbers_the_draft_after_it(self) -> None:
        from conformance.extensions.explore.explorer import _add_layer

        full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
        draft = attrs.evolve(full, is_draft=True)
        specs = {
            "model.layers.0.self_attn.attn": full,
            "model.layers.1.self_attn.attn": full,
            "model.layers.2.self_attn.attn": draft,
        }
        config = PlanningConfig(max_model_len=4096, **model_config_fields(specs))
        ex = Example(config, (specs,), (1 << 30,), 8, "PlanningProblem('toy', ...)")
        child = _add_layer(random.Random(0), ex)
        assert child is not None
        assert list(child.merged) == [
            "model.layers.0.self_attn.attn",
            "model.layers.1.self_attn.attn",
            "model.layers.2.self_attn.attn",
            "model.layers.3.self_attn.attn",
        ]
        assert child.merged["model.layers.3.self_attn.attn"].is_draft
        assert not child.merged["model.layers.2.self_attn.attn"].is_draft
        assert child.config.num_hidden_layers == 3

    def test_a_base_class_is_a_concrete_spec(self) -> None:
        operator = dict(MUTATIONS)["base-class"]
        for ex in _examples():
            child = operator(random.Random(0), ex)
            if child is not None:
                assert all(s.page_size_bytes > 0 for s in child.merged.values())


class TestExploration:
    """A gate the default run never opens, opened by exploration; a legal one stays green."""

    def test_the_default_run_never_enters_the_gate(self) -> None:
        report = _run(GATED)
        assert report.results[0].status == "pass"
        assert "IndexCacheShortBacking._specialise()" in " ".join(report.reach["lines"])

    @pytest.mark.slow
    def test_exploration_finds_the_bug_behind_the_gate(self, tmp_path: Path) -> None:
        report = _run(GATED, explore=SECONDS, explore_candidates=CANDIDATES)
        (result,) = report.results
        assert result.status == "fail", report.reach["explore"]
        assert "explored:" in result.counterexample
        explored = report.reach["explore"]
        assert explored["kept"] >= 1 and explored["lines_after"] > explored["lines_before"]
        # Its example is replayed from the report's data, not redrawn by a seed.
        assert "conformance.reproduce(" in (result.reproduce or "")
        path = tmp_path / "kv.json"
        path.write_text(json.dumps(report_to_dict(report)))
        assert conformance.reproduce(path, MEANT)

    @pytest.mark.slow
    def test_a_legal_builder_behind_the_same_gate_passes(self) -> None:
        report = check_builder(
            LEGAL,
            select=["KV-PLACE"],
            seed=1,
            explore=SECONDS,
            explore_candidates=CANDIDATES,
        )
        failed = [r.id for r in report.results if r.status in ("fail", "inconclusive")]
        assert not failed
        assert "IndexCacheSplitTensors._specialise()" not in " ".join(report.reach["lines"])

    @pytest.mark.slow
    def test_the_corpus_is_judged_first_by_the_next_run(self, tmp_path: Path) -> None:
        database = str(tmp_path / "db")
        first = _run(GATED, explore=SECONDS, explore_candidates=CANDIDATES, database=database)
        assert first.results[0].status == "fail"
        saved = Corpus(database, GATED).load()
        assert saved and any("explored:" in ex.description for ex in saved)
        # Another seed and no exploration: the saved example is judged again.
        again = _run(GATED, seed=2, database=database)
        assert again.results[0].status == "fail"
        assert again.reach["explore"]["replayed"] == len(saved)


class TestOptions:
    """Bad values are refused before any example runs, naming the option."""

    @pytest.mark.parametrize(
        ("values", "named"),
        [
            ({"explore": -1.0}, "explore=-1.0"),
            ({"explore": float("nan")}, "explore=nan"),
            ({"explore": 5.0, "reach": False}, "needs reach measured"),
            ({"explore_candidates": 0}, "explore_candidates=0"),
        ],
    )
    def test_refused(self, values: dict[str, Any], named: str) -> None:
        with pytest.raises(OptionError) as caught:
            RunOptions(builder=None, seed=1, **values).validate(capabilities=())
        assert named in str(caught.value)

    def test_the_cli_refuses_exploring_without_reach(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["--explore", "5", "--no-reach", "--seed", "1", "--no-database"]) == 2
        assert "--explore" in capsys.readouterr().err


def test_a_corpus_the_kit_cannot_read_is_refused(tmp_path: Path) -> None:
    """A corpus file that holds no example is a usage error naming it, never ignored.

    Each entry costs every later run a judged example: a planted or stale
    file is the user's to delete (tests/kit/test_inputs.py lists the bad ones).
    """
    corpus = Corpus(str(tmp_path), GATED)
    assert corpus.path is not None
    corpus.path.parent.mkdir(parents=True)
    corpus.path.write_text('[{"description": "x", "data": {"not": "an example"}}]')
    with pytest.raises(CorpusError, match="entry 0: counterexample_data has keys") as caught:
        corpus.load()
    assert str(corpus.path) in str(caught.value) and "delete the file" in str(caught.value)
    assert Corpus(None, GATED).load() == []
