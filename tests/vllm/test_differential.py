"""kvref and the installed vLLM plan alike: a catalog of model shapes, then Hypothesis problems.

kvref plans as the installed release (``installed_vllm_version()``: 0.33.0 or
0.34.0), so the same tests hold under either.

Both sides get the same problem; they must agree on the global groups, the
block count, the (auto-fitted) length, every tensor's size, strides and
offset, Core's per-worker figures, and the kind of error when both refuse.
The deliberate differences (contract.md#deliberate-differences) are asserted on their own in
``test_deliberate.py``; here a problem that hits vLLM's PP projection defect
is recognised and checked for that defect instead of equality.

Run: ``/work/vllm-venv/bin/python -m pytest -m vllm tests/vllm`` (or ``tox -e vllm``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from _vllm_diff import (
    INSTALLED,
    VLLMDefault,
    Workers,
    assert_agree,
    describe_tensors,
    run_kvref,
    run_vllm,
    split_stages,
)
from hypothesis import HealthCheck, assume, given, settings
from specs import full, mamba, mla, sw

from conformance.generate import strategies as kst
from kvref import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheLayout,
    KVCacheSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)

pytestmark = pytest.mark.vllm

GIB = 2**30
BF16 = {"head_size": 128, "dtype": "bfloat16", "block_size": 16}


def _layers(pattern: str, specs: dict[str, KVCacheSpec], repeats: int) -> dict[str, KVCacheSpec]:
    """``model.layers.{i}.attn`` for the pattern repeated (one letter per layer)."""
    out: dict[str, KVCacheSpec] = {}
    for i, letter in enumerate(pattern * repeats):
        out[f"model.layers.{i}.attn"] = specs[letter]
    return out


def _mamba_hybrid() -> dict[str, KVCacheSpec]:
    # contract.md#grouping-examples, model (d): attention every 4th layer, block 80 (page 163,840);
    # the
    # Mamba state (139,264 B) pre-padded by the platform to the same page.
    attention = full(heads=2, head_size=256, block_size=80)
    state = mamba(page_size_padded=163_840, mamba_cache_mode="align")
    return {f"model.layers.{i}.mixer": attention if i % 4 == 3 else state for i in range(16)}


def _mla(draft: bool) -> dict[str, KVCacheSpec]:
    model: dict[str, KVCacheSpec] = {f"model.layers.{i}.attn": mla() for i in range(4)}
    if draft:
        # contract.md#grouping-examples, model (e): an SWA draft whose page does not divide the MLA
        # page.
        model["drafter.attn"] = sw(128, block_size=64, is_draft=True)
    return model


def _eagle() -> dict[str, KVCacheSpec]:
    # contract.md#grouping-examples, model (b): gpt-oss-like 12 S + 12 F alternating, plus a
    # full-attention draft.
    spec = {"S": sw(128, heads=8, head_size=64), "F": full(8, head_size=64)}
    model = _layers("SF", spec, 12)
    model["drafter.attn"] = attrs.evolve(spec["F"], is_draft=True)
    return model


def _cross() -> dict[str, KVCacheSpec]:
    model: dict[str, KVCacheSpec] = {}
    for i in range(4):
        model[f"decoder.layers.{i}.self_attn"] = full(4, head_size=64)
        model[f"decoder.layers.{i}.encoder_attn"] = CrossAttentionSpec(
            num_kv_heads=4, head_size=64, dtype="bfloat16", block_size=16
        )
    return model


def _mixed(heads: int) -> dict[str, KVCacheSpec]:
    # contract.md#grouping-examples, model (c): (F 8 heads, S, S) x 4 with S of 4 heads (divides) or
    # 6 (pads / packs).
    return _layers("FSS", {"F": full(8), "S": sw(1024, heads=heads)}, 4)


#: name -> (model, workers, config changes, memory per worker)
Case = tuple[dict[str, KVCacheSpec], int | list[int], dict[str, object], list[int] | int]

#: contract.md#core-flow: 30 layers (F,S,S), stages of 16 and 14 layers, 2 GiB / 1.5 GiB,
#: max_model_len 32,768 and I = 2,048 (two batches of 1,024 tokens in flight).
SPEC_54 = {"max_model_len": 32768, "async_scheduling": False, "max_num_batched_tokens": 1024}

CATALOG: dict[str, Callable[[], Case]] = {
    "uniform": lambda: (_layers("F", {"F": full()}, 32), 1, {}, 8 * GIB),
    "hybrid-5to1": lambda: (_layers("SSSSSF", {"S": sw(), "F": full()}, 4), 1, {}, 4 * GIB),
    "hybrid-3to1": lambda: (_layers("SSSF", {"S": sw(), "F": full()}, 4), 1, {}, 4 * GIB),
    "hybrid-1to1": lambda: (_layers("SF", {"S": sw(), "F": full()}, 6), 1, {}, 4 * GIB),
    "fss-x10": lambda: (_layers("FSS", {"S": sw(), "F": full()}, 10), 1, {}, 4 * GIB),
    "12-vs-13-eagle": lambda: (
        _eagle(),
        1,
        {"num_prefill_lookahead_tokens": 1, "eagle_block_drop": True},
        2 * GIB,
    ),
    "chunked-local": lambda: (
        _layers(
            "CCCF",
            {
                "C": ChunkedLocalAttentionSpec(**BF16, num_kv_heads=8, attention_chunk_size=8192),
                "F": full(),
            },
            4,
        ),
        1,
        {},
        4 * GIB,
    ),
    "mla": lambda: (_mla(draft=False), 1, {}, 2 * GIB),
    "mla-swa-draft": lambda: (_mla(draft=True), 1, {"num_prefill_lookahead_tokens": 1}, 2 * GIB),
    "mamba-hybrid-padded": lambda: (
        _mamba_hybrid(),
        1,
        {"mamba_cache_mode": "align", "max_model_len": 32768},
        4 * GIB,
    ),
    "cross-attention": lambda: (_cross(), 1, {"max_num_encoder_input_tokens": 1500}, GIB),
    "mixed-pages-4h": lambda: (_mixed(4), 1, {}, 4 * GIB),
    "mixed-pages-6h": lambda: (_mixed(6), 1, {}, 4 * GIB),
    "pp2-unequal": lambda: (
        # contract.md#core-flow: 30 layers (F,S,S), 2 GiB / 1.5 GiB, max_model_len 32,768.
        _layers("FSS", {"S": sw(), "F": full()}, 10),
        [16, 14],
        SPEC_54,
        [2 * GIB, 3 * GIB // 2],
    ),
    "pp4-uniform": lambda: (_layers("F", {"F": full()}, 32), 4, {}, 2 * GIB),
    "pp3-hybrid": lambda: (_layers("SSSF", {"S": sw(), "F": full()}, 6), 3, {}, 2 * GIB),
    "override-fits": lambda: (
        _layers("FSS", {"S": sw(), "F": full()}, 10),
        [16, 14],
        {**SPEC_54, "num_gpu_blocks_override": 3000},
        [2 * GIB, 3 * GIB // 2],
    ),
    "override-too-small": lambda: (
        _layers("FSS", {"S": sw(), "F": full()}, 10),
        [16, 14],
        {**SPEC_54, "num_gpu_blocks_override": 2000},
        [2 * GIB, 3 * GIB // 2],
    ),
    "auto-fit": lambda: (
        _layers("FSS", {"S": sw(), "F": full()}, 10),
        [16, 14],
        {**SPEC_54, "max_model_len": 131072, "auto_fit_max_model_len": True},
        [2 * GIB, 3 * GIB // 2],
    ),
    "auto-fit-nothing-fits": lambda: (
        _layers("F", {"F": full()}, 4),
        1,
        {"max_model_len": 131072, "auto_fit_max_model_len": True},
        300_000,
    ),
    "too-little-memory": lambda: (_layers("F", {"F": full()}, 32), 1, {}, 64 * 2**20),
    "no-memory": lambda: (_layers("F", {"F": full()}, 4), 1, {}, 0),
    "hybrid-disabled": lambda: (
        _layers("SSSF", {"S": sw(), "F": full()}, 4),
        1,
        {"disable_hybrid_kv_cache_manager": True},
        4 * GIB,
    ),
    "mtp-lookahead": lambda: (
        _layers("SF", {"S": sw(), "F": full()}, 4),
        1,
        {"num_prefill_lookahead_tokens": 3},
        4 * GIB,
    ),
    "attention-free": lambda: ({}, 1, {}, GIB),
    "sink-and-swa": lambda: (
        _layers(
            "SK",
            {
                "S": sw(),
                "K": SinkFullAttentionSpec(
                    block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sink_len=4
                ),
            },
            6,
        ),
        1,
        {},
        4 * GIB,
    ),
    "rswa": lambda: (
        _layers(
            "RF",
            {
                "R": RSWASpec(
                    block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", rswa_window=512
                ),
                "F": full(),
            },
            4,
        ),
        1,
        {},
        4 * GIB,
    ),
}


def _cases() -> list[object]:
    params = []
    for name, make in CATALOG.items():
        model, _, changes, _ = make()
        layouts = kst.allowed_layouts(model)
        if "kv_cache_layout" in changes:
            layouts = (KVCacheLayout.parse(str(changes["kv_cache_layout"])),)
        params += [pytest.param(name, layout, id=f"{name}-{layout.name}") for layout in layouts]
    return params


def _problem(name: str, layout: KVCacheLayout) -> tuple[PlanningConfig, Workers, list[int]]:
    model, workers, changes, memory = CATALOG[name]()
    split = split_stages(model, workers) if model else [{} for _ in range(int(workers))]
    config = PlanningConfig(
        kv_cache_layout=layout,
        pipeline_parallel_size=len(split),
        vllm_version=INSTALLED,
        **changes,  # type: ignore[arg-type]
    )
    per_worker = memory if isinstance(memory, list) else [memory] * len(split)
    return config, split, per_worker


class TestCatalog:
    """Named model shapes, in every layout vLLM's layout resolution would allow for them."""

    @pytest.mark.parametrize(("name", "layout"), _cases())
    def test_core_flow_agrees(self, name: str, layout: KVCacheLayout) -> None:
        """Core's flow gives the same plan (or the same kind of error) in kvref and vLLM."""
        config, workers, memory = _problem(name, layout)
        assert_agree(config, workers, memory)

    @pytest.mark.parametrize(("name", "layout"), _cases())
    def test_hooks_agree(self, name: str, layout: KVCacheLayout) -> None:
        """The builder hooks agree: same groups, and the same placement at 1, 7 and 1000 blocks."""
        config, workers, _ = _problem(name, layout)
        config = attrs.evolve(config, num_gpu_blocks_override=None)
        merged = {n: s for w in workers for n, s in w.items()}
        ref, vl = ReferenceKVCacheConfigBuilder(), VLLMDefault()
        groups = ref.get_kv_cache_groups(config, dict(merged))
        assert vl.get_kv_cache_groups(config, dict(merged)) == groups
        for n in (1, 7, 1000):
            assert vl.get_kv_cache_config_from_groups(
                config, groups, n
            ) == ref.get_kv_cache_config_from_groups(config, groups, n)


class TestWorkedNumbers:
    """contract.md#core-flow's worked numbers come out of both flows."""

    def test_pp2_blocks(self) -> None:
        """PP=2, 2 GiB / 1.5 GiB: 4,915 blocks, w0 re-planned to 1,932,656,640 bytes."""
        config, workers, memory = _problem("pp2-unequal", KVCacheLayout.LBNHC)
        for outcome in (run_kvref(config, workers, memory), run_vllm(config, workers, memory)):
            assert outcome.plan is not None
            assert outcome.plan.num_blocks == 4915
            assert describe_tensors(outcome.plan)[0][0][1:4] == (1_932_656_640, 322_109_440, 65_536)

    def test_auto_fit_length(self) -> None:
        """Auto-fit lowers max_model_len to 72,448 on both sides."""
        config, workers, memory = _problem("auto-fit", KVCacheLayout.LBNHC)
        for outcome in (run_kvref(config, workers, memory), run_vllm(config, workers, memory)):
            assert outcome.plan is not None
            assert (outcome.plan.max_model_len, outcome.plan.num_blocks) == (72_448, 4915)

    def test_override_too_small_numbers(self) -> None:
        """Override 2000: both refuse with the estimated length 25,808."""
        config, workers, memory = _problem("override-too-small", KVCacheLayout.LBNHC)
        for outcome in (run_kvref(config, workers, memory), run_vllm(config, workers, memory)):
            assert outcome.kind == "insufficient"
            assert outcome.error.estimated_max_model_len == 25_808  # type: ignore[union-attr]


def test_pipeline_split_of_two_strides_gives_each_worker_one() -> None:
    """Aligned hybrid split 1+2: no worker holds two strides, so vLLM aliases nothing.

    kvref still plans the common stride (contract.md#deliberate-differences);
    vLLM's plan has no aliasing block IDs to find (a generated case once
    failed the difference's assertion here).
    """
    common = {"block_size": 1, "num_kv_heads": 64, "head_size": 256, "dtype": "bfloat16"}
    full = FullAttentionSpec(block_stride_alignment=64, **common)
    window = SlidingWindowSpec(block_stride_alignment=576, sliding_window=1024, **common)
    config = PlanningConfig(
        max_model_len=2048,
        max_num_batched_tokens=2048,
        kv_cache_layout=KVCacheLayout.LBNHC,
        pipeline_parallel_size=2,
        num_hidden_layers=3,
        vllm_version=INSTALLED,
    )
    workers: Workers = (
        {"model.layers.0.self_attn.attn": full},
        {"model.layers.1.self_attn.attn": window, "model.layers.2.self_attn.attn": window},
    )
    assert assert_agree(config, workers, (537_395_200, GIB)) == "common-stride"


class TestGenerated:
    """Hypothesis problems from the kit's own strategies (few examples: vLLM calls are slow)."""

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(problem=kst.planning_problems())
    def test_core_flow_agrees(self, problem: kst.PlanningProblem) -> None:
        """kvref and vLLM agree on generated problems, except vLLM 0.33.0's PP projection defect."""
        assume(not problem.config.host_resident_layers)  # vLLM: HiSparse only
        assert_agree(problem.config, problem.workers, problem.available_memory)
