"""Counterexamples as data (conformance.report.records): a faithful round trip, a strict decoder."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.report.records import (
    RecordError,
    decode_example,
    decode_value,
    encode_example,
    encode_value,
    example_data,
    record_types,
)
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import examples
from kvref import FullAttentionSpec, PlanningConfig


def _round_trip(example: Any) -> None:
    problem = getattr(example, "example", example)
    data = json.loads(json.dumps(encode_example(example)))
    config, workers, memory, num_blocks = decode_example(data)
    assert config == problem.config
    assert list(workers) == [dict(w) for w in problem.workers]
    # Equal is not enough: a spec must come back as its own class.
    assert [type(s) for w in workers for s in w.values()] == [
        type(s) for w in problem.workers for s in w.values()
    ]
    assert memory == tuple(problem.available_memory) and num_blocks == problem.num_blocks
    if isinstance(problem, Example):
        assert Example.from_data(data, problem.description) == problem


@pytest.mark.parametrize("scenario", ["core", "host", "placement", "serve"])
def test_examples_round_trip(scenario: str) -> None:
    """Every drawn problem comes back equal, spec classes included, through JSON."""

    @settings(
        max_examples=20, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(examples(scenario))
    def check(example: Any) -> None:
        _round_trip(example)

    check()


def test_record_types_are_the_kits_own() -> None:
    """Specs and configs are there; nothing of the standard library or torch is."""
    types = record_types()
    assert {"FullAttentionSpec", "MambaSpec", "PlanningConfig", "KVCacheLayout"} <= set(types)
    assert all(t.__module__.startswith(("kvref", "conformance")) for t in types.values())


def test_unknown_values_do_not_encode() -> None:
    """A callable in a config has no data form; example_data says None, the run goes on."""
    config = PlanningConfig(model_kv_cache_grouping=lambda config, specs: [])
    with pytest.raises(RecordError, match="cannot be stored as data"):
        encode_value(config)
    example = Example(config, ({},), (1,), 1, "")
    assert example_data(example) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"record": "Popen", "fields": {}}, r"value\.record='Popen' is not one of"),
        ({"record": "PlanningConfig", "fields": {"max_model_len": "5"}}, "max_model_len='5'"),
        ({"enum": "KVCacheLayout", "name": "XYZ"}, r"value\.name='XYZ' is not a member"),
        ({"dtype": "__import__"}, "not the name of a torch dtype"),
        ({"eval": "1"}, "unknown tag 'eval'"),
        ([1, 2], r"value=\[1, 2\] is a list"),
        ({"fraction": [1, 0]}, r"fraction=\[1, 0\] must be"),
        (float("nan"), "not a finite number"),
    ],
)
def test_decoder_refuses_with_the_field_and_value(data: Any, message: str) -> None:
    """Anything but the kit's records and plain values is a RecordError naming where and what."""
    with pytest.raises(RecordError, match=message):
        decode_value(data)


def test_example_fields_are_checked() -> None:
    """A decoded config that is no PlanningConfig, or a worker value that is no spec, is refused."""
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
    good = encode_example(Example(PlanningConfig(), ({"l0": spec},), (2**20,), 4, ""))
    decode_example(good)
    bad = {**good, "config": encode_value(spec)}
    with pytest.raises(RecordError, match=r"counterexample_data\.config is a FullAttentionSpec"):
        decode_example(bad)
    bad = {**good, "workers": {"list": [{"dict": [["l0", 3]]}]}}
    with pytest.raises(RecordError, match=r"workers\[0\]\['l0'\]=3 is not a KV cache spec"):
        decode_example(bad)
    bad = {**good, "num_blocks": 0}
    with pytest.raises(RecordError, match=r"num_blocks=0 must be an int >= 1"):
        decode_example(bad)


def test_an_example_is_never_rebuilt_by_executing_python() -> None:
    """Replay rebuilds from data: the example type offers no way to run a report's Python."""
    assert not hasattr(Example, "from_python")


def test_a_layout_left_to_planning_stays_left_to_it() -> None:
    """A config whose layout planning resolves comes back resolving, as data and as Python."""
    from conformance.report.pycode import to_python
    from kvref import KVCacheLayout

    config = PlanningConfig(kv_connector_layout=KVCacheLayout.BLHNC)
    assert config.resolves_kv_cache_layout
    back = decode_value(json.loads(json.dumps(encode_value(config))))
    assert back == config and back.resolves_kv_cache_layout
    namespace: dict[str, Any] = {}
    exec(to_python({"config": config}), namespace)  # the kit's own source, not a report's
    assert namespace["config"].resolves_kv_cache_layout
    given = PlanningConfig(kv_connector_layout=KVCacheLayout.BLHNC, kv_cache_layout="BLHNC")
    assert not decode_value(encode_value(given)).resolves_kv_cache_layout
