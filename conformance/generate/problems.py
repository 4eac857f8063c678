"""Planning configs, memory budgets, block counts and whole planning problems."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from hypothesis import reject
from hypothesis import strategies as st

from conformance.check.geometry import cdiv
from conformance.generate.backends import draw_kernel_backends
from conformance.generate.estimate import blocks_per_request, promotion_succeeds, worker_estimate
from conformance.generate.families import models
from conformance.generate.families.drafts import speculation
from conformance.generate.families.extras import ExtendedModel, draw_model_extras
from conformance.generate.hf import cache_dtype_of
from conformance.generate.layouts import allowed_layouts, as_specs
from conformance.generate.pipeline import decoder_layers, draw_pipeline_split
from conformance.generate.records import Model, PlanningProblem
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import (
    AUTO_FIT_MAX_MODEL_LENS,
    MAX_MODEL_LENS,
    MAX_NUM_BATCHED_TOKENS,
    rarely,
)
from kvref.axes import KVCacheLayout
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.specs import CrossAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec

__all__ = [
    "DEFAULT_MAX_MEMORY_BYTES",
    "DEFAULT_MAX_WORKERS",
    "Steer",
    "memory_budgets",
    "num_blocks",
    "num_blocks_for",
    "planning_configs",
    "planning_problems",
    "problem_num_blocks",
]

#: Default ceiling of one worker's available memory in :func:`planning_problems`
#: (the kit's default device allocation cap).
DEFAULT_MAX_MEMORY_BYTES = 2**30
#: Default most pipeline stages (workers) of :func:`planning_problems`.
DEFAULT_MAX_WORKERS = 4


@attrs.frozen
class Steer:
    """What a problem's config must be drawn with (``None``: drawn as usual).

    A focus (conformance.extensions.focus) wants the few engine paths a builder
    acted on; drawing them directly, instead of rejecting every other
    problem after it is drawn, costs a tenth of the generation.

    Attributes:
        layouts: the layouts to draw from (those the model allows among them).
        hybrid_off: whether the hybrid KV cache manager is switched off.
        block_outer: a lean, not a rule: draw among the allowed layouts whose
            blocks are outermost (``True``) or not (``False``) when the
            model allows any such, else among all it allows.
    """

    layouts: frozenset[KVCacheLayout] | None = None
    hybrid_off: bool | None = None
    block_outer: bool | None = None


def draw_planning_config(
    draw: st.DrawFn,
    model: Model | Mapping[str, KVCacheSpec],
    pipeline_parallel_size: int,
    max_memory_bytes: int | None,
    steer: Steer,
) -> PlanningConfig:
    """One draw of :func:`planning_configs`, made with the caller's ``draw``.

    The kit's own composites call this rather than drawing a strategy built
    for each model: Hypothesis validates and labels every strategy object it
    is handed, which cost about a tenth of generation.
    """
    specs = as_specs(model)
    values = list(specs.values())
    if steer.layouts is None and steer.block_outer is not None:
        allowed = allowed_layouts(specs)
        leaning = [lay for lay in allowed if lay.is_block_outermost == steer.block_outer]
        layout = pick(draw, leaning or list(allowed))
    elif steer.layouts is None:
        layout = pick(draw, list(allowed_layouts(specs)))
    else:
        wanted = [lay for lay in allowed_layouts(specs) if lay in steer.layouts]
        if not wanted:
            reject()  # the model cannot take the wanted layouts
        layout = pick(draw, wanted)
    modes = {s.mamba_cache_mode for s in values if isinstance(s, MambaSpec)}
    mamba_mode = next(iter(modes)) if len(modes) == 1 else "none"
    auto_fit = rarely(draw)
    base = PlanningConfig(
        kv_cache_layout=layout,
        max_num_batched_tokens=pick(draw, MAX_NUM_BATCHED_TOKENS),
        async_scheduling=not rarely(draw),
        mamba_cache_mode=mamba_mode,
        pipeline_parallel_size=pipeline_parallel_size,
        auto_fit_max_model_len=auto_fit,
    )
    if auto_fit:
        # The auto-fit upper bound is the model's derived length: large on purpose.
        lengths = list(AUTO_FIT_MAX_MODEL_LENS)
    else:
        lengths = list(MAX_MODEL_LENS)
        mamba_blocks = [s.block_size for s in values if isinstance(s, MambaSpec)]
        if mamba_mode == "none" and mamba_blocks and mamba_blocks[0] not in lengths:
            # vLLM sizes the Mamba block as max_model_len in this mode.
            lengths.insert(0, mamba_blocks[0])
        if max_memory_bytes is not None and values:
            # Lengths whose one request fits in half the memory cap, so that
            # roomy budgets stay under the cap.
            fitting = [
                n
                for n in lengths
                if worker_estimate(specs, base.with_max_model_len(n))[1] <= max_memory_bytes // 2
            ]
            lengths = fitting or [min(lengths)]
    config = base.with_max_model_len(pick(draw, lengths))

    changes: dict[str, Any] = _model_fields(model)
    if any(isinstance(s, CrossAttentionSpec) for s in values) and draw(st.booleans()):
        changes["max_num_encoder_input_tokens"] = 1500  # Whisper's encoder length
    if any(s.is_draft for s in values):
        # The lookahead vLLM derives (1, or the chain of several MTP modules)
        # and the block drop the EAGLE-style methods may switch off.
        changes["num_prefill_lookahead_tokens"] = _derived_lookahead(changes)
        changes["eagle_block_drop"] = draw(st.booleans())
    elif rarely(draw) and changes["speculative_method"] is None:
        changes["num_prefill_lookahead_tokens"] = pick(draw, [2, 4])  # MTP
    if steer.hybrid_off is None:
        if rarely(draw) and promotion_succeeds(values):
            changes["disable_hybrid_kv_cache_manager"] = True
    elif steer.hybrid_off:
        if not promotion_succeeds(values):
            reject()  # the hybrid manager can be switched off for one group only
        changes["disable_hybrid_kv_cache_manager"] = True
    if values and rarely(draw):
        page_sum = sum(s.block_stride for s in values)
        cap = max(1, min((max_memory_bytes or 64 * 2**30) // page_sum, 65536))
        # At least one request's blocks (an upper bound: one group per layer)
        # plus the null block, or a handful that may not admit a request.
        enough = min(cap, 1 + sum(blocks_per_request(s, config) for s in values))
        changes["num_gpu_blocks_override"] = draw(
            st.one_of(st.integers(enough, cap), st.integers(1, min(16, cap)))
        )
    if rarely(draw):
        changes.update(_parallel(draw, values))
    if rarely(draw):
        changes["prefix_cache_retention_interval"] = pick(draw, _retention_intervals(values))
    # A model-declared grouping owns every layer's group, host residency included.
    declared = isinstance(model, ExtendedModel) and model.extras.kv_cache_grouping is not None
    if len(values) >= 2 and rarely(draw) and not declared:
        changes.update(_host_resident(draw, specs, config))
    backends = draw_kernel_backends(draw, specs, layout)
    if backends:
        changes["attention_backends"] = backends
    return attrs.evolve(config, **changes) if changes else config


#: Tensor-parallel sizes of real deployments (a vendor builder may gate on them).
TENSOR_PARALLEL_SIZES = (2, 4, 8)


def _parallel(draw: st.DrawFn, specs: list[KVCacheSpec]) -> dict[str, int]:
    """A tensor-parallel size and a decode-context-parallel size within it.

    vLLM's DCP ranks are TP ranks (the DCP size divides the TP size), and it
    refuses DCP-sharded sliding-window layers under DCP: such models keep
    DCP at 1.
    """
    tp = pick(draw, TENSOR_PARALLEL_SIZES)
    sharded_window = any(isinstance(s, SlidingWindowSpec) and s.dcp_sharded for s in specs)
    dcps = [d for d in TENSOR_PARALLEL_SIZES if tp % d == 0 and not sharded_window]
    dcp = pick(draw, [1, *dcps])
    return {"tensor_parallel_size": tp, "decode_context_parallel_size": dcp}


def _retention_intervals(specs: list[KVCacheSpec]) -> list[int | None]:
    """Retention intervals other than the default 0 that vLLM serves the model with.

    ``None`` (dense checkpoints) always; a positive interval only beside
    sliding-window or Mamba layers, the only ones it thins (vLLM refuses it
    elsewhere).
    """
    thinned = any(isinstance(s, (SlidingWindowSpec, MambaSpec)) for s in specs)
    return [None, 2048, 8192] if thinned else [None]


def model_config_fields(model: Model | Mapping[str, KVCacheSpec]) -> dict[str, Any]:
    """The config fields every problem of ``model`` carries: decoder layers, drafts, speculation.

    With draft layers this includes the prefill lookahead vLLM derives, so
    ``PlanningConfig(**model_config_fields(model))`` is valid exactly when
    the model's speculation is one vLLM would serve.
    """
    fields = _model_fields(model)
    if any(s.is_draft for s in as_specs(model).values()):
        fields["num_prefill_lookahead_tokens"] = _derived_lookahead(fields)
    return fields


def _model_fields(model: Model | Mapping[str, KVCacheSpec]) -> dict[str, Any]:
    """The config fields that describe ``model`` (decoder layers, drafts, speculation)."""
    hidden = decoder_layers(model).num_hidden_layers
    spec = speculation(model)
    return {
        "num_hidden_layers": hidden or None,
        "num_draft_layers": spec.num_draft_layers,
        "speculative_method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        # What vLLM shows a builder of this model beside its specs (generate/hf.py).
        "hf_config": model.hf_config if isinstance(model, Model) else (),
        "cache_dtype": cache_dtype_of(as_specs(model)),
    }


def _derived_lookahead(fields: Mapping[str, Any]) -> int:
    """The prefill lookahead vLLM derives for a model with draft layers.

    EAGLE-style drafters read the next token; a chain of several MTP modules
    (``min(modules, tokens) > 1``) reads ``num_speculative_tokens`` ahead.
    """
    tokens = fields["num_speculative_tokens"]
    if fields["speculative_method"] == "mtp" and min(fields["num_draft_layers"], tokens) > 1:
        return int(tokens)
    return 1


def _host_resident(
    draw: st.DrawFn, specs: Mapping[str, KVCacheSpec], config: PlanningConfig
) -> dict[str, Any]:
    """``host_resident_layers`` (a proper subset of one spec's layers) and a host pool for them."""
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        by_spec.setdefault(spec, []).append(name)
    spec = pick(draw, list(by_spec))
    candidates = by_spec[spec]
    # Keep at least one device layer: a plan with no device group says
    # nothing about device placement.
    most = min(len(candidates), len(specs) - 1)
    host = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=most, unique=True))
    host_bytes_per_block = len(host) * spec.block_stride
    # vLLM's HiSparse pool holds at least one request plus two blocks.
    minimum = cdiv(config.max_model_len, spec.block_size) + 2
    blocks = draw(st.integers(minimum, 4 * minimum))
    return {
        "host_resident_layers": frozenset(host),
        "host_pool_bytes": blocks * host_bytes_per_block,
    }


def planning_configs(
    model: Model | Mapping[str, KVCacheSpec],
    *,
    pipeline_parallel_size: int = 1,
    max_memory_bytes: int | None = None,
    steer: Steer | None = None,
) -> st.SearchStrategy[PlanningConfig]:
    """Planning configs consistent with ``model``.

    Draws: a layout from :func:`layouts_for`; ``max_model_len`` (8192 first;
    with ``max_memory_bytes``, only lengths whose estimated request fits in half
    of it); ``max_num_batched_tokens``; rarely auto-fit (with a large upper
    bound), ``num_gpu_blocks_override`` (enough for a request, or 1..16; at
    most ``max_memory_bytes`` worth of blocks), MTP lookahead,
    ``disable_hybrid_kv_cache_manager`` (only when promotion gives one
    group) and host-resident layers (a proper subset of one spec's layers,
    with a host pool of at least one request; never beside a model-declared
    grouping).  For three in four problems whose attention specs allow it, an
    attention backend whose kernels take only blocks smaller than the cache
    block (:func:`~conformance.generate.backends.kernel_backends`).  The
    Mamba cache mode is the model's; the config describes the model
    (``num_hidden_layers``, ``num_draft_layers`` and the speculative method
    and tokens of
    :func:`~conformance.generate.families.drafts.speculation`), and draft
    layers turn on the lookahead vLLM derives for that method.
    Rarely a tensor-parallel size of 2, 4 or 8 with a decode-context-parallel
    size that divides it (1 where the model has DCP-sharded sliding-window
    layers, which vLLM refuses under DCP); rarely a prefix-cache retention
    interval other than 0 (``None``, or a positive one beside sliding-window
    or Mamba layers).  Never HiSparse.
    ``steer`` draws only the layouts and hybrid-manager setting it names.
    """
    return _planning_configs(model, pipeline_parallel_size, max_memory_bytes, steer or Steer())


_planning_configs = st.composite(draw_planning_config)


def memory_budgets(
    bytes_per_block: int, blocks_per_request: int, *, max_extra_blocks: int = 4096
) -> st.SearchStrategy[int]:
    """Available-memory figures around Core's admission boundary (contract.md#core-admission).

    ``exact`` is ``(blocks_per_request + 1) * bytes_per_block``: the smallest
    budget that admits one request after the null block.  Generates ``exact``
    (shrinks to it), large budgets in ``(exact, exact + max_extra_blocks
    blocks]`` (not always a whole number of blocks), and too-small ones in
    ``[0, exact)``, 0 included.  With ``bytes_per_block == 0``
    (attention-free) any budget up to 1 GiB, 0 first.

    Raises:
        ValueError: a negative argument.

    """
    if bytes_per_block < 0 or blocks_per_request < 0 or max_extra_blocks < 0:
        raise ValueError(
            f"memory_budgets({bytes_per_block}, {blocks_per_request}, "
            f"max_extra_blocks={max_extra_blocks}): arguments must be non-negative"
        )
    if bytes_per_block == 0:
        return st.one_of(st.just(0), st.integers(0, 2**30))
    exact = (blocks_per_request + 1) * bytes_per_block
    large = st.integers(exact + 1, exact + (max_extra_blocks + 1) * bytes_per_block - 1)
    return st.one_of(st.just(exact), large, st.integers(0, exact - 1))


def num_blocks(*, max_value: int = 1 << 16) -> st.SearchStrategy[int]:
    """Block counts for placement, spread over the regimes where placement bugs live.

    Within ``1..max_value``: 1 (shrinks to it, half the weight of the
    others); 2..4;
    an odd count 5..63 (the last block of a run, strides computed for
    another count); 17..1024; and 1025..``max_value``.  Never 0 or negative
    (the block pool needs its null block).  :func:`num_blocks_for` adds
    counts whose backing passes 4 GiB for a given weight per block.
    """
    if max_value < 1:
        raise ValueError(f"num_blocks(max_value={max_value}) must allow at least one block")
    return _spread(_count_buckets(max_value))


def _spread(buckets: Sequence[st.SearchStrategy[int]]) -> st.SearchStrategy[int]:
    return _spread_drawn(tuple(buckets))


def _draw_spread(draw: st.DrawFn, buckets: Sequence[st.SearchStrategy[int]]) -> int:
    """One draw of :func:`_spread`, made with the caller's ``draw``."""
    # The first bucket (one block) is what shrinking returns to, but
    # Hypothesis favours low choices while generating: give every other
    # bucket twice its weight so one block stays a minority of the examples.
    i = draw(st.integers(0, 2 * len(buckets) - 2))
    return draw(buckets[(i + 1) // 2])


_spread_drawn = st.composite(_draw_spread)


@functools.lru_cache(maxsize=16)
def _count_buckets(max_value: int) -> tuple[st.SearchStrategy[int], ...]:
    buckets: list[st.SearchStrategy[int]] = [st.just(1)]
    if max_value >= 2:
        buckets.append(st.integers(2, min(4, max_value)))
    if max_value >= 5:
        buckets.append(st.integers(2, (min(63, max_value) - 1) // 2).map(lambda k: 2 * k + 1))
    if max_value >= 17:
        buckets.append(st.integers(17, min(1024, max_value)))
    if max_value > 1024:
        buckets.append(st.integers(1025, max_value))
    return tuple(buckets)


#: Backings above this many bytes need 64-bit offsets and strides.
FOUR_GIB = 1 << 32
#: Offsets and strides from this many bytes wrap in a signed 32-bit field.
TWO_GIB = 1 << 31
#: The most blocks the over-4-GiB bucket asks for (the checks stay cheap).
MAX_HUGE_BLOCKS = 1 << 22


def num_blocks_for(
    bytes_per_block: int, *, max_value: int = 1 << 16, layer_bytes: int = 0
) -> st.SearchStrategy[int]:
    """Block counts spread over the regimes where placement bugs live.

    The buckets of :func:`num_blocks` and, when ``bytes_per_block`` (the problem's bytes
    per block, e.g. the sum of its layers' block strides) makes it
    reachable with at most :data:`MAX_HUGE_BLOCKS` blocks, the first
    counts whose backing passes 2 GiB (a signed 32-bit offset or stride
    wraps) and 4 GiB (an unsigned one does).
    With ``layer_bytes`` (the largest layer's block stride) also the first
    counts at which one layer's run passes 2 GiB and 4 GiB: a layer-outer
    layout's ``layer_stride`` (``num_blocks x page``) and the offsets after
    it no longer fit a 32-bit descriptor field.
    Nothing is allocated for them: device checks cap their allocations.

    Raises:
        ValueError: ``bytes_per_block`` is negative or ``max_value`` is below 1.
    """
    return _spread(_block_buckets(bytes_per_block, max_value, layer_bytes))


def _block_buckets(
    bytes_per_block: int, max_value: int, layer_bytes: int
) -> list[st.SearchStrategy[int]]:
    if bytes_per_block < 0 or max_value < 1:
        raise ValueError(
            f"num_blocks_for({bytes_per_block}, max_value={max_value}): bytes_per_block must "
            "be non-negative and max_value at least 1"
        )
    strategies = list(_count_buckets(max_value))
    for weight in dict.fromkeys((bytes_per_block, layer_bytes)):
        for limit in (TWO_GIB, FOUR_GIB):
            first = limit // weight + 1 if weight > 0 else MAX_HUGE_BLOCKS + 1
            if first <= MAX_HUGE_BLOCKS:
                strategies.append(st.integers(first, first + 7))
    return strategies


def _problem_strides(problem: PlanningProblem) -> tuple[int, int]:
    host = problem.config.host_resident_layers
    strides = [s.block_stride for n, s in problem.specs.items() if n not in host]
    return sum(strides), max(strides, default=0)


def problem_num_blocks(problem: PlanningProblem) -> st.SearchStrategy[int]:
    """:func:`num_blocks_for` sized by the problem's device layers (Σ and max block strides)."""
    total, largest = _problem_strides(problem)
    return num_blocks_for(total, layer_bytes=largest)


def draw_problem_num_blocks(draw: st.DrawFn, problem: PlanningProblem) -> int:
    """One draw of :func:`problem_num_blocks`, made with the caller's ``draw``."""
    total, largest = _problem_strides(problem)
    return _draw_spread(draw, _block_buckets(total, 1 << 16, largest))


def _groupable(config: PlanningConfig, specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether the reference groups ``specs`` under ``config`` (a valid input)."""
    try:
        ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, dict(specs))
    except KVRefError:
        return False
    return True


def draw_planning_problem(
    draw: st.DrawFn,
    model_strategy: st.SearchStrategy[Model],
    max_workers: int,
    max_memory_bytes: int,
    steer: Steer,
) -> PlanningProblem:
    """One draw of :func:`planning_problems`, made with the caller's ``draw``."""
    model = draw(model_strategy)
    split = draw_pipeline_split(draw, model, max_workers)
    workers = list(split.workers)
    config = draw_planning_config(draw, model, len(workers), max_memory_bytes, steer)
    # Settings the model brings (HiSparse, a declared grouping) need the drawn length.
    config, workers = draw_model_extras(draw, model, config, workers)
    host = config.host_resident_layers
    if host and any(w and all(n in host for n in w) for w in workers):
        # A worker with only host layers has no device group; keep the
        # problem about device placement instead.
        config = attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
    elif host and not _groupable(config, {n: s for w in workers for n, s in w.items()}):
        # The host layers drawn can leave device layers that no grouping
        # packs (page sizes with no whole repeat): vLLM refuses that model,
        # so the problem keeps its layers on the device.
        config = attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
    regime = pick(draw, ["roomy", "boundary", "short"])
    budgets = []
    for worker in workers:
        page_sum, need = worker_estimate(worker, config, model.specs)
        if page_sum == 0:
            budgets.append(draw(memory_budgets(0, 0)))
            continue
        # The estimate is a lower bound of Core's figure, often close to it:
        # "boundary" budgets land on both sides of it.
        exact = (cdiv(need, page_sum) + 1) * page_sum
        cap = max(max_memory_bytes, 2 * page_sum)
        if regime == "roomy":
            low = min(4 * exact, cap)
            budgets.append(draw(st.integers(low, max(low, cap))))
        elif regime == "boundary":
            budgets.append(draw(st.integers(max(0, exact - 4 * page_sum), exact + 4 * page_sum)))
        else:
            budgets.append(draw(st.integers(0, max(0, min(exact * 3 // 4, cap)))))
    description = f"{model.description}; {split.describe()}; {regime} memory"
    return PlanningProblem(
        config,
        workers,
        budgets,
        description,
        num_hidden_layers=split.num_hidden_layers or None,
        partition=split.partition,
    )


def planning_problems(
    *,
    models_strategy: st.SearchStrategy[Model] | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    steer: Steer | None = None,
) -> st.SearchStrategy[PlanningProblem]:
    """Whole planning problems: a model, a config, a PP split and each worker's free memory.

    Pipeline stages are cut between decoder layers
    (:func:`~conformance.generate.pipeline.pipeline_splits`).  Memory is
    sized from the model's pages and the estimated bytes of one request, in
    one of three regimes per problem: ``roomy`` (every worker
    has at least four times the estimate; shrinks to it),
    ``boundary`` (within four blocks of it, either side) and ``short``
    (at most 75% of it).  The estimate is a lower bound of what Core
    needs, computed without grouping, so a roomy problem can still be short
    (or fit only after auto-fit).  Budgets stay at or below ``max_memory_bytes``
    when the request fits in it, so most plans are allocatable; the
    attention-free model gets any budget.  Never a problem whose layout
    vLLM would refuse, or with a worker without device layers (unless the
    model is attention-free).  ``steer`` draws only the layouts and
    hybrid-manager setting it names (a focus's engine paths).

    Raises:
        ValueError: ``max_workers`` is below one.
    """
    if max_workers < 1:
        raise ValueError(f"planning_problems(max_workers={max_workers}) needs at least one worker")
    strategy = models_strategy if models_strategy is not None else models()
    return _planning_problems(strategy, max_workers, max_memory_bytes, steer or Steer())


_planning_problems = st.composite(draw_planning_problem)
