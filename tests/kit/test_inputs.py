"""What the kit reads from disk is data it checks: each bad file is refused, naming it.

One parametrized test per reader: a JSON document (shards, baselines,
corpus), a baseline, the exploration corpus, the example database, an
expectations manifest.  Each bad input is refused with the reader's own
error (a usage error, exit 2, on every front end), never a crash or a
verdict; none of these tests runs the kit on a builder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis.database import DirectoryBasedExampleDatabase

from conformance.ci.baseline import BaselineError, load_baseline
from conformance.ci.expectations.manifest import ExpectationsError, load_manifest
from conformance.extensions.explore.corpus import CORPUS_LIMIT, Corpus, CorpusError, check_corpus
from conformance.report.documents import DocumentError, read_json
from conformance.report.records import example_data
from conformance.run.options import RunOptions
from conformance.run.search import DatabaseError, Namespaced, check_database
from conformance.scenarios.examples import Example
from kvref.config import PlanningConfig
from kvref.specs import FullAttentionSpec

BUILDER = "kvref:ReferenceKVCacheConfigBuilder"


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"a": ', "is not JSON"),
        ("", "is not JSON"),
        (b"\xff\xfe{}", "is not UTF-8"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper"),
        ("[" * 70 + "]" * 70, "nests deeper than 64"),
        ("x" * 400_001, "has 400001 bytes, over the 400000"),
    ],
)
def test_a_bad_json_document(tmp_path: Path, content: str | bytes, says: str) -> None:
    path = _write(tmp_path / "doc.json", content)
    with pytest.raises(DocumentError, match=r"doc\.json") as caught:
        read_json(path, str(path), max_bytes=400_000)
    assert says in str(caught.value)


def test_a_json_document_that_is_no_file(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="is a directory, not a file"):
        read_json(tmp_path, "here")
    with pytest.raises(DocumentError, match="cannot be read: it does not exist"):
        read_json(tmp_path / "gone.json", "gone")


def _report(**result: Any) -> dict[str, Any]:
    return {"schema_version": 1, "complete": True, "results": [{"id": "KV-X", **result}]}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        # Each of these excused a failure, or crashed the run, before it was checked.
        (_report(status="inconclusive"), "inconclusive without the reason"),
        (_report(status="xpass", expectation={"strict": True}), "strict XPASS without"),
        (_report(status="fail", counterexample="c", examples=True), "examples True is not integer"),
        (_report(status="xpass", expectation="strict"), "expectation 'strict' is not object"),
        (_report(status="fail", counterexample=5, examples=3), "counterexample 5 is not string"),
        (_report(status="pass") | {"schema_version": True}, "schema_version True is not 1"),
        ({"schema_version": 1, "complete": True, "results": [{"id": "\x1b[2J"}]}, "no invariant"),
    ],
)
def test_a_bad_baseline(tmp_path: Path, data: dict[str, Any], says: str) -> None:
    path = _write(tmp_path / "base.json", json.dumps(data))
    with pytest.raises(BaselineError, match=r"base\.json") as caught:
        load_baseline(path)
    assert says in str(caught.value)


def test_a_baseline_that_is_a_run_report_loads(tmp_path: Path) -> None:
    """Not vacuous: what the kit writes for each failing status is accepted."""
    data = _report(status="fail", counterexample="c", examples=3, reason=None)
    data["results"] += [
        {"id": "KV-Y", "status": "inconclusive", "reason": "no example reached it"},
        {"id": "KV-Z", "status": "xpass", "examples": 2, "expectation": {"strict": True}},
    ]
    path = _write(tmp_path / "base.json", json.dumps(data))
    assert load_baseline(path).failing == {"KV-X", "KV-Y", "KV-Z"}


def _example(num_blocks: int = 4, layers: int = 1) -> dict[str, Any]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    example = Example(
        config=PlanningConfig(num_hidden_layers=layers),
        workers=({f"model.layers.{i}.attn": spec for i in range(layers)},),
        available_memory=(1 << 30,),
        num_blocks=num_blocks,
        description="tiny",
    )
    data = example_data(example)
    assert data is not None
    return data


def _unplannable() -> dict[str, Any]:
    """An example's data the reference cannot plan: a host-resident layer the model lacks."""
    data = _example()
    data["config"]["fields"]["host_resident_layers"] = {"frozenset": ["no.such.layer"]}
    return data


def _entry(**changes: Any) -> dict[str, Any]:
    return {"description": "tiny", "data": _example()} | changes


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (lambda: json.dumps([_entry()] * (CORPUS_LIMIT + 1)), f"holds {CORPUS_LIMIT + 1} entries"),
        (lambda: " " * (9 << 20), "over the 8388608"),
        (lambda: "{}", "holds {}, not a list"),
        (lambda: "[" * 100_000 + "]" * 100_000, "nests deeper"),
        (lambda: json.dumps([{"data": _example()}]), "entry 0 is not an object"),
        (lambda: json.dumps([_entry(data={"format": "other"})]), "entry 0: counterexample_data"),
        (lambda: json.dumps([_entry(description="d" * 5000)]), "is not a short string"),
        (lambda: json.dumps([_entry(data=_example(num_blocks=1 << 40))]), "num_blocks 109"),
        (lambda: json.dumps([_entry(data=_example(layers=4097))]), "4097 layers"),
        (lambda: b"\xff", "is not UTF-8"),
        # Judged, it would blame a legal builder for a problem no run makes.
        (lambda: json.dumps([_entry(data=_unplannable())]), "the reference cannot plan it"),
    ],
)
def test_a_bad_corpus(tmp_path: Path, content: Callable[[], str | bytes], says: str) -> None:
    """A planted corpus costs one judged example per entry: refused, before the run."""
    corpus = Corpus(str(tmp_path), BUILDER)
    assert corpus.path is not None
    corpus.path.parent.mkdir(parents=True)
    _write(corpus.path, content())
    with pytest.raises(CorpusError, match="exploration corpus") as caught:
        check_corpus(RunOptions.create(BUILDER, database=str(tmp_path)))
    assert str(corpus.path) in str(caught.value) and says in str(caught.value)
    # A shard replays no corpus, so it does not read it.
    check_corpus(RunOptions.create(BUILDER, database=str(tmp_path), shard="1/2", focus="off"))


def test_a_corpus_the_kit_wrote_loads(tmp_path: Path) -> None:
    corpus = Corpus(str(tmp_path), BUILDER)
    first = Example.from_data(_example(), "first")
    corpus.save([first])
    check_corpus(RunOptions.create(BUILDER, database=str(tmp_path)))
    (loaded,) = corpus.load()
    assert loaded.description == "first" and loaded.num_blocks == 4
    assert Corpus(None, BUILDER).load() == []


def test_a_database_entry_no_run_wrote(tmp_path: Path) -> None:
    """A corner's list of strata holding bytes that are no stratum name.

    It made every later run of the builder crash (UnicodeDecodeError) at
    the replay; the run's check refuses it, and the replay skips it.
    """
    store = DirectoryBasedExampleDatabase(str(tmp_path))
    corner = Namespaced(store, f"{BUILDER}|KV-X|", stratum="uniform")
    corner.save(b"k", b"v")
    check_database(str(tmp_path), BUILDER, ["KV-X"])
    store.save(f"{BUILDER}|KV-X|".encode() + b"\x00strata", b"\xff\xfe" * 8)
    with pytest.raises(DatabaseError, match=r"list of strata of KV-X holds b'\\xff\\xfe"):
        check_database(str(tmp_path), BUILDER, ["KV-X"])
    assert corner.strata() == {"uniform"}
    check_database(str(tmp_path), BUILDER, ["KV-Y"])
    with pytest.raises(DatabaseError, match="is not a directory"):
        check_database(str(_write(tmp_path / "file", "x")), BUILDER, ["KV-X"])
    # A caller's value that is no path (it raised TypeError, or failed later in the run).
    for value in (5, "", "db\x00"):
        with pytest.raises(DatabaseError, match="must be the path of a directory"):
            check_database(value, BUILDER, ["KV-X"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('reason = "r\\u001b[2J"', "control character"),
        ('reason = "' + "r" * 5000 + '"', "longer than"),
        ("strict = 1", "strict 1 must be true or false"),
    ],
)
def test_a_bad_manifest(tmp_path: Path, entry: str, says: str) -> None:
    text = 'format = "kvref-expectations/1"\n[[expected]]\nid = "KV-X"\nlink = "l"\n'
    if not entry.startswith("reason"):
        text += 'reason = "r"\n'
    path = _write(tmp_path / "m.toml", text + entry + "\n")
    with pytest.raises(ExpectationsError, match=r"m\.toml: entry 1") as caught:
        load_manifest(path)
    assert says in str(caught.value)


def test_the_cli_refuses_a_bad_corpus_before_touching_its_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the file, and the previous report left as it was (no run, no marker)."""
    from conformance.cli import main

    database = tmp_path / "db"
    corpus = Corpus(str(database), BUILDER)
    assert corpus.path is not None
    corpus.path.parent.mkdir(parents=True)
    corpus.path.write_text(json.dumps([_entry()] * (CORPUS_LIMIT + 1)))
    previous = _write(tmp_path / "report.json", '{"previous": true}')
    args = [BUILDER, "--database", str(database), "--json", str(previous), "--seed", "1"]
    assert main([*args, "--select", "KV-GROUP-PARTITION", "--max-examples", "2"]) == 2
    err = capsys.readouterr().err
    assert str(corpus.path) in err and f"holds {CORPUS_LIMIT + 1} entries" in err
    assert previous.read_text() == '{"previous": true}'


@pytest.mark.parametrize(
    ("content", "says"),
    [("[" * 100_000 + "]" * 100_000, "nests deeper"), ('{"results": NaN}', "NaN is not")],
)
def test_verify_refuses_a_report_that_is_no_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    """A usage error (exit 2), where a deeply nested file crashed the parser."""
    from conformance.ci.certify import verify_main

    path = _write(tmp_path / "report.json", content)
    assert verify_main([str(path)]) == 2
    assert says in capsys.readouterr().err
