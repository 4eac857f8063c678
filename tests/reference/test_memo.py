"""Memoised page geometry of the frozen spec kinds.

The geometry (``real_page_size_bytes``, ``page_size_bytes``,
``block_stride_alignment_bytes``, ``block_stride``) and the equality key with
its hash are cached per instance (the spec classes compare that key instead
of attrs' generated ``__eq__``).
These tests check that the cache never changes what a spec is (equality,
hash, repr, pickled state), never survives into a copy that differs
(``attrs.evolve``, ``evolve_spec``), and never goes stale when a field is
derived during construction.  Expected pages are written out by hand.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specs import compressed_mla, full

import kvref.extra_specs  # noqa: F401 - its spec kinds are read too
from kvref.errors import SpecError
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    evolve_spec,
)


def _memoised() -> frozenset[str]:
    """What kvref's spec kinds memoise per instance, read from the classes themselves.

    attrs turns a slotted class's cached properties into slots beside its fields.
    """
    kinds: list[type] = [KVCacheSpec]
    for kind in kinds:
        kinds.extend(kind.__subclasses__())
    return frozenset(
        name
        for kind in kinds
        if attrs.has(kind) and kind.__module__.startswith("kvref.")
        for name in vars(kind).get("__slots__", ())
        if name != "__weakref__" and name not in attrs.fields_dict(kind)
    )


#: What a spec memoises per instance (its page geometry, its equality key and hash).
CACHED = _memoised()


def geometry(spec: KVCacheSpec) -> tuple[int, int, int, int]:
    return (
        spec.real_page_size_bytes,
        spec.page_size_bytes,
        spec.get_block_stride_alignment(),
        spec.block_stride,
    )


def padded_mla() -> MLAAttentionSpec:
    # 64 states x 584 B = 37,376 bytes, padded to a multiple of 576: 37,440.
    return compressed_mla()


SPECS = [
    pytest.param(full(), id="full"),
    pytest.param(full(block_stride_alignment=3000), id="full-int-alignment"),
    pytest.param(full(block_stride_alignment=MultipleOf(24)), id="full-multiple-of"),
    pytest.param(full(page_size_padded=70_000), id="full-padded"),
    pytest.param(
        SlidingWindowSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype="fp16", sliding_window=128
        ),
        id="sliding-window",
    ),
    pytest.param(padded_mla(), id="mla-aligned"),
    pytest.param(
        MambaSpec(block_size=16, shapes=[[4, 8], [16]], dtypes=["fp32", "bf16"], num_heads=2),
        id="mamba",
    ),
]


def test_hand_computed_geometry() -> None:
    # 8 heads x 16 tokens x (128 + 128) x 2 bytes.
    assert geometry(full()) == (65_536, 65_536, 1, 65_536)
    assert geometry(full(block_stride_alignment=3000)) == (65_536, 65_536, 3000, 66_000)
    # MultipleOf(24) on block 16: the page at gcd(24, 16) = 8 tokens.
    assert geometry(full(block_stride_alignment=MultipleOf(24))) == (65_536, 65_536, 32_768, 65_536)
    assert geometry(padded_mla()) == (37_376, 37_440, 1, 37_440)
    # Mamba: 4*8*4 + 16*2 bytes; num_heads is not part of the page.
    mamba = MambaSpec(block_size=16, shapes=[[4, 8], [16]], dtypes=["fp32", "bf16"], num_heads=2)
    assert geometry(mamba) == (160, 160, 1, 160)


def test_every_memoised_value_is_forgotten() -> None:
    """``_forget_memoised`` drops exactly the memoised values: every cached property of
    every spec kind, and nothing else."""
    assert set(KVCacheSpec._MEMOISED) == CACHED


@pytest.mark.parametrize("spec", SPECS)
def test_cache_is_invisible_to_equality_hash_repr_and_state(spec: KVCacheSpec) -> None:
    fresh = copy.copy(spec)  # copy.copy goes through the pickled state: no cache
    before = (repr(spec), hash(spec))
    computed = geometry(spec)
    assert spec == fresh and fresh == spec
    assert hash(spec) == hash(fresh) == before[1]
    assert repr(spec) == repr(fresh) == before[0]
    state = spec.__getstate__()  # type: ignore[attr-defined]
    assert set(state) == {a.name for a in attrs.fields(type(spec))}
    assert CACHED and not set(state) & CACHED
    assert geometry(fresh) == computed


@pytest.mark.parametrize("spec", SPECS)
def test_pickle_and_deepcopy_keep_value_and_geometry(spec: KVCacheSpec) -> None:
    computed = geometry(spec)
    for clone in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec), copy.copy(spec)):
        assert clone == spec and hash(clone) == hash(spec)
        assert type(clone) is type(spec)
        assert geometry(clone) == computed


def test_evolve_does_not_carry_a_stale_cache() -> None:
    spec = full()
    assert spec.page_size_bytes == 65_536
    smaller = attrs.evolve(spec, num_kv_heads=4)
    assert geometry(smaller) == (32_768, 32_768, 1, 32_768)
    aligned = attrs.evolve(spec, block_stride_alignment=3000)
    assert aligned.block_stride == 66_000
    padded = attrs.evolve(spec, page_size_padded=70_000)
    assert (padded.real_page_size_bytes, padded.page_size_bytes) == (65_536, 70_000)
    assert spec.page_size_bytes == 65_536  # the original keeps its own


def test_evolve_spec_recomputes_alignment_padding_after_caching() -> None:
    spec = padded_mla()
    assert spec.page_size_bytes == 37_440
    doubled = evolve_spec(spec, block_size=512)  # 128 x 584 = 74,752 -> 74,880
    assert (doubled.real_page_size_bytes, doubled.page_size_bytes) == (74_752, 74_880)
    aligned = evolve_spec(spec, block_size=256 * 9)  # 576 x 584 is a multiple of 576
    assert aligned.page_size_padded is None
    assert aligned.page_size_bytes == aligned.real_page_size_bytes == 576 * 584


def test_derived_field_drops_the_cache() -> None:
    spec = full()
    assert spec.page_size_bytes == 65_536 and spec.block_stride == 65_536
    spec._set_derived_field("page_size_padded", 70_000)
    assert (spec.page_size_bytes, spec.block_stride) == (70_000, 70_000)


def test_draft_flag_keeps_equality_and_geometry() -> None:
    spec = full()
    draft = attrs.evolve(spec, is_draft=True)
    assert draft == spec and hash(draft) == hash(spec)
    assert geometry(draft) == geometry(spec)


def test_uniform_type_wrapper_page_is_memoised_and_copies_rebuild() -> None:
    wrapper = UniformTypeKVCacheSpecs(
        kv_cache_specs={"a": full(), "b": full(head_size=64), "c": full()}
    )
    assert wrapper.page_size_bytes == 65_536 * 2 + 32_768
    for clone in (copy.deepcopy(wrapper), pickle.loads(pickle.dumps(wrapper))):
        assert clone == wrapper
        assert clone.page_size_bytes == wrapper.page_size_bytes
    narrower = attrs.evolve(wrapper, kv_cache_specs={"a": full()})
    assert narrower.page_size_bytes == 65_536


def test_a_wrapper_keeps_its_declared_block_size_through_copies() -> None:
    """A declared block size is what the wrapper counts in, kept by copies; bad values refused."""
    layers = {"a": full(), "b": full(head_size=64)}
    plain = UniformTypeKVCacheSpecs(kv_cache_specs=layers)
    declared = UniformTypeKVCacheSpecs(kv_cache_specs=layers, declared_block_size=64)
    assert plain.block_size == full().block_size != 64 and declared.block_size == 64
    assert declared != plain and declared.page_size_bytes == plain.page_size_bytes
    for clone in (copy.deepcopy(declared), pickle.loads(pickle.dumps(declared))):
        assert clone == declared and clone.block_size == 64
    for bad in (0, -16, True, 16.0):
        with pytest.raises(SpecError, match="declared_block_size"):
            UniformTypeKVCacheSpecs(kv_cache_specs=layers, declared_block_size=bad)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([1, 8, 16, 32, 64]),
    heads=st.integers(1, 16),
    head_size=st.integers(1, 300),
    head_size_v=st.integers(0, 300),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.uint8]),
    alignment=st.one_of(st.none(), st.integers(1, 5000)),
    new_head_size=st.integers(1, 300),
)
def test_memoised_geometry_matches_the_formula_through_evolve(
    block_size: int,
    heads: int,
    head_size: int,
    head_size_v: int,
    dtype: torch.dtype,
    alignment: int | None,
    new_head_size: int,
) -> None:
    def page(hs: int) -> int:
        return heads * block_size * (hs + head_size_v) * dtype.itemsize

    def stride(hs: int) -> int:
        a = alignment or 1
        return -(-page(hs) // a) * a

    spec = full(
        block_size=block_size,
        heads=heads,
        head_size=head_size,
        head_size_v=head_size_v,
        dtype=dtype,
        block_stride_alignment=alignment,
    )
    assert (spec.page_size_bytes, spec.block_stride) == (page(head_size), stride(head_size))
    evolved = attrs.evolve(spec, head_size=new_head_size)
    assert (evolved.page_size_bytes, evolved.block_stride) == (
        page(new_head_size),
        stride(new_head_size),
    )
    assert (evolved == spec) == (new_head_size == head_size)
    # The cached hash belongs to the instance: an evolved copy hashes like a fresh equal spec.
    hash(spec)
    rebuilt = attrs.evolve(evolved)
    assert hash(evolved) == hash(rebuilt) == hash(pickle.loads(pickle.dumps(evolved)))
    assert len({spec, evolved, rebuilt}) == (1 if new_head_size == head_size else 2)


def _other_value(value: object) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 16
    if isinstance(value, torch.dtype):
        return torch.float32 if value != torch.float32 else torch.float16
    if isinstance(value, str):
        return value + "_X"
    if value is None:  # every optional int field; above any real page here
        return 1 << 20
    raise AssertionError(f"no other value for {value!r}")


@pytest.mark.parametrize("name", [f.name for f in attrs.fields(FullAttentionSpec)])
def test_every_compared_field_takes_part_in_equality(name: str) -> None:
    spec = full(sliding_window=None)
    assert spec.page_size_bytes > 0 and hash(spec)  # memoise first
    # 2 tokens per state: 1 + 16 would leave a 16-token block without a state.
    other: Any = 2 if name == "tokens_per_state" else _other_value(getattr(spec, name))
    changed = attrs.evolve(spec, **{name: other})
    field = attrs.fields_dict(FullAttentionSpec)[name]
    if field.eq:
        assert changed != spec and spec != changed, name
        assert len({spec, changed}) == 2
    else:  # is_draft: left out of equality and hash, as in vLLM
        assert changed == spec and hash(changed) == hash(spec)


def test_equality_needs_the_same_class() -> None:
    fields: dict[str, Any] = {
        "block_size": 16,
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": torch.bfloat16,
    }
    plain, sink = FullAttentionSpec(**fields), SinkFullAttentionSpec(**fields)
    assert plain != sink and sink != plain
    assert plain != object() and plain != "FullAttentionSpec"
    chunked = ChunkedLocalAttentionSpec(**fields, attention_chunk_size=16)
    assert chunked == ChunkedLocalAttentionSpec(**fields, attention_chunk_size=16)
    assert chunked != ChunkedLocalAttentionSpec(**fields, attention_chunk_size=32)
    assert len({plain, sink, full(), chunked}) == 3
