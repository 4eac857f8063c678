"""The ``VllmConfig`` copies handed to vLLM hooks, and the cheap proof that a hook left one alone.

``to_vllm_config`` unpickles a cached template where the template pickles,
and deep-copies it otherwise; ``is_pristine`` says a copy still pickles as
handed out.  The vLLM adapter skips its field-by-field comparison only on
that proof, so a ``True`` after any change would hide a hook's write
(tests/vllm/test_config_writes.py shows the writes reach the verdict).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance.harness import native_input_changes
from kvref.config import PlanningConfig
from kvref.interop import vllm_config as vc

pytestmark = pytest.mark.vllm


def _no_groups(config: PlanningConfig, specs: dict[str, Any]) -> list[Any]:
    return []


#: Plain, a class swapped to pin planning figures, and a model that declares
#: its grouping through a module-level hook (all pickled).
PICKLED = [
    PlanningConfig(),
    PlanningConfig(eagle_block_drop=True, max_model_len=8192),
    PlanningConfig(
        speculative_method="eagle", num_speculative_tokens=2, num_prefill_lookahead_tokens=1
    ),
    PlanningConfig(model_kv_cache_grouping=_no_groups),
]


@pytest.mark.parametrize("config", PICKLED, ids=["plain", "pinned", "eagle", "declared"])
def test_a_pickled_copy_is_the_deep_copy(config: PlanningConfig) -> None:
    """Same class, same state as the deep copy it replaces, fresh each time, and pristine."""
    template = vc._template(config)
    first, second = vc.to_vllm_config(config), vc.to_vllm_config(config)
    assert vc._FROZEN[config] is not None
    assert type(first) is type(template)
    assert type(first.model_config) is type(template.model_config)
    expected = native_input_changes.object_state(copy.deepcopy(template), "v")
    assert native_input_changes.object_state(first, "v") == expected
    assert first is not second and first.model_config is not second.model_config
    assert vc.is_pristine(config, first)


@pytest.mark.parametrize(
    "write",
    [
        lambda v: setattr(v.model_config, "max_model_len", v.model_config.max_model_len - 1),
        lambda v: setattr(v.cache_config, "num_gpu_blocks_override", 7),
        lambda v: setattr(v.model_config.hf_config, "num_hidden_layers", 99),
        # Deeper than the adapter's walk reaches, and where it never looks.
        lambda v: v.model_config.hf_config.__dict__.setdefault("_private", {}).update(x=1),
        lambda v: setattr(v.model_config, "hf_config", object()),
    ],
    ids=["model-len", "override", "hf-layers", "private-deep", "unpicklable"],
)
def test_any_write_loses_the_proof(write: Any) -> None:
    """A changed copy is never called pristine (the adapter then compares field by field)."""
    config = PlanningConfig()
    vcfg = vc.to_vllm_config(config)
    assert vc.is_pristine(config, vcfg)
    write(vcfg)
    assert not vc.is_pristine(config, vcfg)
    # The next copy is untouched by the write.
    assert vc.is_pristine(config, vc.to_vllm_config(config))


def test_an_unpicklable_hook_is_deep_copied() -> None:
    """A lambda the user's config holds cannot pickle: the deep copy, never the proof."""
    config = PlanningConfig(model_kv_cache_grouping=lambda c, s: [])
    vcfg = vc.to_vllm_config(config)
    assert vc._FROZEN[config] is None
    assert type(vcfg.model_config).__name__ == "KVRefDeclaringModelConfig"
    assert not vc.is_pristine(config, vcfg)
