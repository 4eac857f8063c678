"""The wire between a builder's process and the kit's: plain data in, only the kit's types out.

The trust model rests on this decoder: an answer from the builder's process
is JSON-able data, and the kit rebuilds from it nothing but plain values and
its own record types, never running or importing the builder's code.  These
tests send what an honest builder sends, what an odd one sends, and what a
hostile process could write on the pipe.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from specs import full, sw

from conformance.errors import KitError
from conformance.harness import wire
from conformance.harness.wire import (
    Opaque,
    WireError,
    decode,
    decode_exception,
    encode,
    encode_exception,
)
from kvref import (
    FullAttentionSpec,
    InsufficientMemoryError,
    KVCacheLayout,
    KVCacheTensor,
    PlacementError,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)


def through(value: Any) -> Any:
    """``value`` sent as the builder's process sends it: encoded, as JSON text, decoded."""
    return decode(json.loads(json.dumps(encode(value), allow_nan=False)))


def _vendor(**changes: Any) -> dict[str, Any]:
    """Wire data of a vendor's full-attention spec class, with ``changes`` to its keys."""
    body = {"kind": "FullAttentionSpec", "class": "acme:AcmeSpec", "extra": {"tuple": []}}
    body["fields"] = encode(full())["fields"]
    body.update({"class" if k == "cls" else k: v for k, v in changes.items()})
    return {"vendor": body}


def kinds(value: Any) -> Any:
    """``value``'s type, and its items' types all the way down (``==`` equates a set and a
    frozenset, ``True`` and ``1``)."""
    if isinstance(value, dict):
        return dict, sorted((repr(kinds(k)), repr(kinds(v))) for k, v in value.items())
    if isinstance(value, (list, tuple, frozenset)):
        return type(value), sorted(repr(kinds(v)) for v in value)
    return type(value)


class TestRoundTrip:
    """What a builder answers reaches the kit equal to what it answered."""

    @pytest.mark.parametrize(
        "value",
        [
            None,
            True,
            0,
            -(2**70),
            "layer.0",
            1.5,
            math.inf,
            -math.inf,
            Fraction(3, 4),
            (1, (2, 3)),
            [1, [2]],
            {("a", 1): [None], "b": frozenset({1, 2})},
            torch.float8_e4m3fn,
            KVCacheLayout.LBHNC,
        ],
        ids=repr,
    )
    def test_plain_values(self, value: Any) -> None:
        back = through(value)
        assert back == value
        assert kinds(back) == kinds(value)

    def test_nan_stays_a_float(self) -> None:
        """A size the builder made NaN must reach the size invariants, not vanish."""
        assert math.isnan(through(math.nan))

    def test_the_reference_answers(self) -> None:
        """Groups and a placed config of a two-kind model come back equal, as kvref records."""
        builder = ReferenceKVCacheConfigBuilder()
        config = PlanningConfig()
        specs = {f"layers.{i}.attn": (full() if i % 2 else sw()) for i in range(4)}
        groups = builder.get_kv_cache_groups(config, specs)
        placed = builder.get_kv_cache_config_from_groups(config, groups, 10)
        assert through(groups) == groups
        assert through(placed) == placed
        assert through(specs) == specs

    def test_a_record_travels_unvalidated(self) -> None:
        """A tensor of -4096 bytes is an invariant's finding; the wire does not refuse it."""
        fields = {"size": -4096, "layers": {"list": ["x"]}, "layer_stride": 0, "block_stride": 0}
        tensor = decode({"record": "KVCacheTensor", "fields": fields})
        assert type(tensor) is KVCacheTensor
        assert tensor.size == -4096


class TestTheBuildersClassesStayBehind:
    """Subclasses and objects of the builder's arrive as the kit's data, without their code."""

    def test_a_record_subclass_arrives_as_the_record(self) -> None:
        @attrs.frozen(kw_only=True)
        class VendorTensor(KVCacheTensor):
            def pages(self) -> int:
                return 1

        fields: dict[str, Any] = {"size": 64, "layers": ["x"], "layer_stride": 0, "block_stride": 8}
        back = through(VendorTensor(**fields))
        assert type(back) is KVCacheTensor
        assert back == KVCacheTensor(**fields)
        assert not hasattr(back, "pages")

    def test_a_container_subclass_arrives_as_what_it_holds(self) -> None:
        class Lying(list[int]):
            def __len__(self) -> int:
                return 0

        back = through(Lying([1, 2, 3]))
        assert type(back) is list
        assert back == [1, 2, 3]

    def test_an_object_arrives_as_its_name_and_repr(self) -> None:
        class Handle:
            def __repr__(self) -> str:
                return "<handle 7>"

        back = through(Handle())
        assert back == Opaque(f"{__name__}.{Handle.__qualname__}", "<handle 7>")

    def test_a_hostile_object_is_opaque_not_an_error(self) -> None:
        """Reading it raises in the builder's process; the kit still gets a value."""

        class Exploding(Mapping[str, int]):
            def __getitem__(self, key: str) -> int:
                raise RuntimeError("boom")

            def __iter__(self) -> Iterator[str]:
                raise RuntimeError("boom")

            def __len__(self) -> int:
                return 1

            def __repr__(self) -> str:
                raise RuntimeError("boom")

        back = through(Exploding())
        assert isinstance(back, Opaque)
        assert back.text == "<repr failed> (cannot be read as data: RuntimeError)"

    def test_nesting_past_the_limit_is_cut(self) -> None:
        deep: list[Any] = []
        for _ in range(200):
            deep = [deep]
        back = through(deep)
        while isinstance(back, list):
            (back,) = back
        assert isinstance(back, Opaque)
        assert "nested too deep" in back.text

    def test_a_vendor_spec_class_is_named_never_imported(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The kit gets a stand-in of the vendor's class and never imports its module,
        though the module is there to import."""
        module = "acme_vendor_module_never_imported"
        (tmp_path / f"{module}.py").write_text("class AcmeSpec:\n    pass\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        spec = decode(_vendor(cls=f"{module}:AcmeSpec"))
        assert type(spec).__name__ == "AcmeSpec"
        assert type(spec) is not FullAttentionSpec
        assert isinstance(spec, FullAttentionSpec)
        # Not equal to kvref's own spec (another class, as in vLLM), but of its fields.
        assert attrs.asdict(spec, recurse=False) == attrs.asdict(full(), recurse=False)
        assert module not in sys.modules


class TestStrictDecoder:
    """Anything that is not the wire format is refused, naming the place and the value."""

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ([1, 2], "answer=[1, 2] is not wire data"),
            ({"pickle": "gASV"}, "answer: unknown tag 'pickle'"),
            ({"a": 1, "b": 2}, "answer: keys ['a', 'b'] are not wire data"),
            ({"list": 3}, "answer.list=3 must be a list"),
            ({"list": [{"list": "x"}]}, "answer.list[0].list='x' must be a list"),
            ({"float": "1e999"}, "answer.float='1e999' is not nan, inf or -inf"),
            ({"fraction": [1, 0]}, "answer.fraction=[1, 0]: the denominator must be > 0"),
            ({"fraction": [1.0, 2]}, "answer.fraction=[1.0, 2] must be [numerator, denominator]"),
            ({"dtype": "load"}, "answer.dtype='load' is not a torch dtype"),
            ({"dict": [[{"list": []}, 1]]}, "answer.dict[0][0]=[] is not hashable"),
            ({"dict": [[1]]}, "answer.dict[0]=[1] must be a [key, value] pair"),
            ({"frozenset": [{"list": []}]}, "answer.frozenset: an item is not hashable"),
            (
                {"record": "system", "fields": {}},
                "answer: 'system' is not a record type of the kit",
            ),
            (
                {"record": "Opaque", "fields": {}},
                "answer: 'Opaque' is not a record type of the kit",
            ),
            (
                {"record": "KVCacheTensor", "fields": {"size": 1, "__class__": "x"}},
                "answer: KVCacheTensor has no field '__class__'",
            ),
            (
                {"record": "KVCacheTensor", "fields": {}},
                "answer: KVCacheTensor needs a value for 'size'",
            ),
            ({"record": "KVCacheTensor", "fields": [1]}, "answer.fields=[1] must be an object"),
            ({"enum": "KVCacheLayout", "name": "mro"}, "answer.name='mro' is not a KVCacheLayout"),
            (
                {"enum": "PlacementError", "name": "x"},
                "answer.enum='PlacementError' is not an enum of the kit",
            ),
            ({"opaque": {"type": "x"}}, "answer.opaque={'type': 'x'} is no opaque object"),
            (
                {"vendor": {"kind": "FullAttentionSpec"}},
                "answer.vendor={'kind': 'FullAttentionSpec'} is no vendor spec",
            ),
            (
                _vendor(kind="KVCacheTensor"),
                "answer.vendor.kind='KVCacheTensor' is not a kvref spec kind",
            ),
            (_vendor(cls=3), "answer.vendor.class=3 must be a class name"),
            (
                _vendor(extra={"list": []}),
                "answer.vendor.extra must be a tuple of (field, value) pairs",
            ),
        ],
        ids=lambda v: v if isinstance(v, str) else None,
    )
    def test_refused(self, data: Any, message: str) -> None:
        with pytest.raises(WireError, match=f"^{re.escape(message)}$"):
            decode(data)

    def test_two_record_types_of_one_name_are_a_kit_error(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A record travels by its bare name; the decoder never picks one of two classes."""
        (tmp_path / "wire_clash.py").write_text(
            "import attrs\n\n@attrs.frozen\nclass KVCacheTensor:\n    size: int\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(wire, "_RECORD_MODULES", ("kvref.records", "wire_clash"))
        wire._records.cache_clear()
        try:
            with pytest.raises(TypeError, match="share a name"):
                decode({"record": "KVCacheTensor", "fields": {"size": 1}})
        finally:
            monkeypatch.undo()
            wire._records.cache_clear()

    def test_nesting_past_the_limit_is_refused(self) -> None:
        data: Any = 1
        for _ in range(200):
            data = {"list": [data]}
        with pytest.raises(WireError, match="nested deeper than"):
            decode(data)


class TestExceptions:
    """An error raised in the builder's process is raised in the kit's as a class of the kit's."""

    def test_a_kvref_error_is_itself(self) -> None:
        exc = InsufficientMemoryError(
            "too small",
            max_model_len=8192,
            needed_bytes=2**30,
            available_bytes=2**20,
            estimated_max_model_len=8,
        )
        back = decode_exception(json.loads(json.dumps(encode_exception(exc, "tb"))))
        assert type(back) is InsufficientMemoryError
        assert str(back) == "too small"
        assert (back.needed_bytes, back.estimated_max_model_len) == (2**30, 8)

    def test_a_builders_error_is_a_stand_in_under_its_nearest_known_base(self) -> None:
        class AcmeError(PlacementError):
            pass

        back = decode_exception(encode_exception(AcmeError("no slot"), ""))
        assert type(back).__name__ == "AcmeError"
        assert type(back).__qualname__ == AcmeError.__qualname__
        assert isinstance(back, PlacementError)
        assert str(back) == "no slot"

    def test_a_kit_error_stays_the_kits(self) -> None:
        exc = KitError("vLLM adapter", "a bug", "Traceback ...")
        back = decode_exception(encode_exception(exc, ""))
        assert type(back) is KitError
        assert (back.where, back.detail, str(back)) == (
            "vLLM adapter",
            "Traceback ...",
            str(exc),
        )

    def test_an_unprintable_error_is_named(self) -> None:
        class MuteError(ValueError):
            def __str__(self) -> str:
                raise RuntimeError("no")

        back = decode_exception(encode_exception(MuteError(), ""))
        assert isinstance(back, ValueError)
        assert str(back) == "<MuteError whose str() failed>"

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ("boom", "is no exception"),
            ({"mro": [], "message": "", "traceback": "", "fields": {}}, "must be a list"),
            ({"mro": [1], "message": "", "traceback": "", "fields": {}}, "must be a list"),
            (
                {"mro": ["x:Y"], "message": 3, "traceback": "", "fields": {}},
                "message and fields must be",
            ),
        ],
    )
    def test_refused(self, data: Any, message: str) -> None:
        with pytest.raises(WireError, match=message):
            decode_exception(data)
