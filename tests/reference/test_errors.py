"""Bad input gets a typed kvref error naming the field and the value, never a bare crash."""

from __future__ import annotations

import contextlib

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.generate import strategies as kst
from kvref import (
    FullAttentionSpec,
    KVRefError,
    MambaSpec,
    MultipleOf,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    plan_kv_cache,
)
from kvref.errors import ConfigError, SpecError


def bad_values(table: dict[str, tuple[object, ...]]) -> list[tuple[str, object]]:
    """``(field, value)`` for each of the table's invalid values of each field."""
    return [(field, value) for field, values in table.items() for value in values]


class TestSpecErrors:
    """Spec fields are validated at construction."""

    @pytest.mark.parametrize(
        ("field", "value"),
        bad_values(
            {
                "block_size": (0, -16),
                "num_kv_heads": (0,),
                "head_size": (-1,),
                "dtype": ("bfloat17", 3),
                "page_size_padded": (100,),
                "block_stride_alignment": (0, -64),
                "head_size_v": (-1,),
                "tokens_per_state": (0,),
            }
        ),
    )
    def test_field_named(self, field: str, value: object) -> None:
        """Each invalid field raises SpecError whose message names the field and the value."""
        base: dict[str, object] = {
            "block_size": 16,
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype": "bfloat16",
        }
        with pytest.raises(SpecError) as info:
            FullAttentionSpec(**{**base, field: value})  # type: ignore[arg-type]
        assert field in str(info.value)
        assert repr(value) in str(info.value) or str(value) in str(info.value)

    def test_multiple_of_zero(self) -> None:
        """MultipleOf(0) is a SpecError naming n."""
        with pytest.raises(SpecError, match="n=0"):
            MultipleOf(n=0)

    def test_mamba_padding_below_state(self) -> None:
        """A Mamba page padded below its state is a SpecError with both sizes."""
        with pytest.raises(SpecError, match="page_size_padded=10"):
            MambaSpec(block_size=16, shapes=[[4, 4]], dtypes=["float32"], page_size_padded=10)

    def test_dtype_names(self) -> None:
        """Dtype names and aliases convert to torch dtypes, and equal specs compare equal."""
        a = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16")
        b = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="torch.bfloat16")
        assert a == b and hash(a) == hash(b)


class TestConfigErrors:
    """PlanningConfig fields are validated at construction."""

    @pytest.mark.parametrize(
        ("field", "value"),
        bad_values(
            {
                "max_model_len": (0,),
                "max_num_batched_tokens": (-1,),
                "num_gpu_blocks_override": (0,),
                "kv_cache_layout": ("XYZ",),
                "mamba_cache_mode": ("sometimes",),
                "pipeline_parallel_size": (0,),
                "host_resident_layers": ("l0",),
            }
        ),
    )
    def test_field_named(self, field: str, value: object) -> None:
        """Each invalid field raises a kvref error naming the field."""
        with pytest.raises(KVRefError, match=field):
            PlanningConfig(**{field: value})  # type: ignore[arg-type]

    def test_unknown_host_layer(self) -> None:
        """A host-resident layer the model does not have is a ConfigError naming it."""
        spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
        config = PlanningConfig(host_resident_layers={"nope"}, host_pool_bytes=2**20)
        with pytest.raises(ConfigError, match="nope"):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, {"l0": spec})


class TestNoBareErrors:
    """Whatever the input, the public API raises only kvref errors."""

    @settings(max_examples=150, deadline=None)
    @given(problem=kst.planning_problems(), shrink_memory=st.integers(0, 3), data=st.data())
    def test_planning_raises_only_kvref_errors(
        self, problem: kst.PlanningProblem, shrink_memory: int, data: st.DataObject
    ) -> None:
        """Generated problems, with any layout and starved memory, plan or raise KVRefError."""
        config = problem.config
        layout = data.draw(st.sampled_from(["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]))
        config = attrs.evolve(config, kv_cache_layout=layout)
        memory = [m >> (8 * shrink_memory) for m in problem.available_memory]
        with contextlib.suppress(KVRefError):
            plan_kv_cache(
                ReferenceKVCacheConfigBuilder, config, [dict(w) for w in problem.workers], memory
            )

    @settings(max_examples=100, deadline=None)
    @given(
        windows=st.lists(st.sampled_from([None, 512, 1024]), min_size=1, max_size=6),
        chunks=st.lists(st.sampled_from([None, 2048]), min_size=1, max_size=6),
        disable_hybrid=st.booleans(),
    )
    def test_conflicting_windows(
        self, windows: list[int | None], chunks: list[int | None], disable_hybrid: bool
    ) -> None:
        """Conflicting windows or chunks give typed errors, never AssertionError."""
        specs = {}
        for i, (w, c) in enumerate(zip(windows, chunks, strict=False)):
            if i % 2:
                specs[f"l{i}"] = SlidingWindowSpec(
                    block_size=16,
                    num_kv_heads=8,
                    head_size=128,
                    dtype="bfloat16",
                    sliding_window=w or 256,
                )
            else:
                specs[f"l{i}"] = FullAttentionSpec(
                    block_size=16,
                    num_kv_heads=8,
                    head_size=128,
                    dtype="bfloat16",
                    sliding_window=w,
                    attention_chunk_size=None if w else c,
                )
        config = PlanningConfig(disable_hybrid_kv_cache_manager=disable_hybrid)
        with contextlib.suppress(KVRefError):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, specs)
