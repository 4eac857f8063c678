"""Hypothesis strategies for KV cache planning problems: the kit's inputs (the public facade).

Everything here generates *valid* inputs: specs that construct, models that
vLLM 0.33.0 could report, layouts that its ``resolve_kv_cache_layout`` would
pick for the model (contract.md#memory-safety, contract.md#layouts), pipeline splits cut
between decoder layers with no empty worker, and memory budgets on both
sides of the admission boundary.  Inputs that only exist to show a vLLM
defect live in explicitly named strategies (:func:`vllm_p3_alias_models`),
never in the general ones.

Shrinking goes towards small, readable examples: few layers, one KV head,
head size 64, block 16, bf16, no opaque backend fields, LBNHC, one worker,
a budget that fits.

The building blocks, from small to large (each in its own module of
:mod:`conformance.generate`, re-exported here):

- :func:`dtypes`, :func:`block_sizes` and the per-layer specs
  (:mod:`~conformance.generate.specs`);
- whole models (:class:`Model`): :func:`models` and its families
  (:mod:`~conformance.generate.families`), vendor models
  (:func:`~conformance.extensions.vendor.models.load_models`);
- :func:`layouts_for` (and the pure rule :func:`allowed_layouts`);
- :func:`planning_configs`, :func:`pp_splits` / :func:`pipeline_splits`,
  :func:`memory_budgets`, :func:`num_blocks`, :func:`num_blocks_for`;
- :func:`planning_problems`, giving a :class:`PlanningProblem`.
"""

from __future__ import annotations

from conformance.generate.families import DEFAULT_FAMILIES, FAMILIES, models
from conformance.generate.families.alias import vllm_p3_alias_models, vllm_p3_alias_problems
from conformance.generate.families.classic import (
    attention_free_models,
    circular_buffer_models,
    cross_attention_models,
    hybrid_models,
    mamba_hybrid_models,
    mixed_page_models,
    mla_models,
    uniform_models,
)
from conformance.generate.families.drafts import draft_models
from conformance.generate.families.linear import (
    jamba_models,
    nemotron_h_models,
    qwen3_next_models,
)
from conformance.generate.families.presets import realistic_models
from conformance.generate.families.sparse_mla import (
    deepseek_v4_models,
    deepseek_v32_models,
    glm5_models,
)
from conformance.generate.layouts import allowed_layouts, layouts_for
from conformance.generate.pipeline import (
    PipelineSplit,
    decoder_layers,
    pipeline_splits,
    pp_splits,
    vllm_partition,
)
from conformance.generate.problems import (
    DEFAULT_MAX_MEMORY_BYTES,
    memory_budgets,
    num_blocks,
    num_blocks_for,
    planning_configs,
    planning_problems,
    problem_num_blocks,
)
from conformance.generate.records import Model, PlanningProblem
from conformance.generate.specs import (
    MAX_PAGE_BYTES,
    block_sizes,
    chunked_local_specs,
    circular_buffer_specs,
    cross_attention_specs,
    dtypes,
    full_attention_specs,
    mamba_specs,
    mla_specs,
    sliding_window_mla_specs,
    sliding_window_specs,
)

__all__ = [
    # records
    "Model",
    "PlanningProblem",
    "PipelineSplit",
    # scalars
    "dtypes",
    "block_sizes",
    # per-layer specs
    "full_attention_specs",
    "mla_specs",
    "sliding_window_specs",
    "sliding_window_mla_specs",
    "chunked_local_specs",
    "circular_buffer_specs",
    "mamba_specs",
    "cross_attention_specs",
    # models
    "models",
    "FAMILIES",
    "DEFAULT_FAMILIES",
    "uniform_models",
    "hybrid_models",
    "mla_models",
    "mamba_hybrid_models",
    "cross_attention_models",
    "attention_free_models",
    "mixed_page_models",
    "circular_buffer_models",
    "deepseek_v4_models",
    "deepseek_v32_models",
    "glm5_models",
    "qwen3_next_models",
    "nemotron_h_models",
    "jamba_models",
    "draft_models",
    "realistic_models",
    "vllm_p3_alias_models",
    "vllm_p3_alias_problems",
    # layouts, configs, splits, budgets
    "allowed_layouts",
    "layouts_for",
    "planning_configs",
    "decoder_layers",
    "pipeline_splits",
    "pp_splits",
    "vllm_partition",
    "memory_budgets",
    "num_blocks",
    "num_blocks_for",
    "problem_num_blocks",
    "planning_problems",
    "MAX_PAGE_BYTES",
    "DEFAULT_MAX_MEMORY_BYTES",
]
