"""Power meta-tests: each class of once-invisible bug is caught, legal variants pass.

A class's broken builder must be caught at the default example count (50)
by the invariant meant for it; the legal builders of the same area must pass
the same run.  Seed 1 runs by default; ``KVREF_POWER_SEEDS=1,2,3,4,5`` runs
the full sweep the issue asks for (minutes on two cores).
"""

from __future__ import annotations

import os

import broken_builders
import legal_builders
import pytest
from specs import compressed_mla

from conformance.check.catalog import catalog
from conformance.check.need import layer_blocks, request_need_from_layers
from conformance.check.pitch import pitch_findings
from conformance.report.model import Report
from conformance.run.runner import check_builder
from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    PlanningConfig,
    SlidingWindowSpec,
)
from kvref.placement import get_kv_cache_config_from_groups

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]
_SEEDS = [int(s) for s in os.environ.get("KVREF_POWER_SEEDS", "1").split(",")]

#: Invariants a broken builder may fail besides its own, because its one bug
#: also breaks them (the memory checks of device pages beside host groups).
_ALSO: dict[str, frozenset[str]] = {}


def _report(builder: type, seed: int) -> Report:
    # Reach is not what these runs prove (tests/extensions/test_reach.py does): not measured.
    return check_builder(
        builder, select=_PAPER, max_examples=50, seed=seed, shrink=False, reach=False
    )


def _run(builder: type, seed: int) -> set[str]:
    return set(_report(builder, seed).failed_ids)


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize("builder", broken_builders.POWER, ids=lambda b: b.__name__)
def test_broken_builder_caught_at_default_count(builder: type, seed: int) -> None:
    """The class's broken builder fails the invariant meant for it, and only that one."""
    also = _ALSO.get(builder.__name__, frozenset()) | getattr(builder, "ALSO", frozenset())
    broken_builders.assert_caught(_report(builder, seed), builder.CAUGHT_BY, also)


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize(
    "builder", (*legal_builders.ALL, *legal_builders.FIELD_REGIMES), ids=lambda b: b.__name__
)
def test_legal_builder_passes(builder: type, seed: int) -> None:
    """A legal builder that differs from the reference fails nothing, and wastes nothing.

    The same run carries the efficiency comparison (tests/extensions/test_waste.py): a
    legal builder of tests/ that does not waste draws no warning (one that
    may, ``WASTES``, is only held to failing nothing).
    """
    report = _report(builder, seed)
    assert set(report.failed_ids) == set()
    waste = report.waste
    assert waste is not None and waste.compared > 0
    if not getattr(builder, "WASTES", False):
        assert waste.warned == 0, [w.message for w in waste.worst]


def test_new_invariants_are_in_the_catalog() -> None:
    """Every invariant the class builders are meant for is declared."""
    ids = {inv.id for inv in catalog()}
    assert {b.CAUGHT_BY for b in broken_builders.POWER} <= ids


# -- class 3: admission from the layers' own specs --------------------------------------


def _sliding(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=window
    )


def test_admission_need_comes_from_the_layers_not_the_group_spec() -> None:
    """A group spec that understates its layers' window does not lower the need."""
    config = PlanningConfig(max_model_len=32768, max_num_batched_tokens=256)
    layers = {"s0": _sliding(8192), "s1": _sliding(8192)}
    understated = KVCacheGroupSpec(layer_names=["s0", "s1"], kv_cache_spec=_sliding(16))
    bpb = 2 * layers["s0"].page_size_bytes
    need = request_need_from_layers(config, [understated], layers, bpb, {"s0", "s1"})
    # (8192 - 1 + 2 * 256 in flight) tokens / 16 per block + 1, at bpb each.
    assert need == ((8191 + config.max_in_flight_tokens + 15) // 16 + 1) * bpb
    assert need > (16 - 1 + config.max_in_flight_tokens + 15) // 16 * bpb


def test_layer_blocks_follow_lookahead_and_group_block_size() -> None:
    """Speculative lookahead adds tokens a window keeps; a larger group block needs fewer."""
    spec = _sliding(1024)
    base = PlanningConfig(max_model_len=65536, max_num_batched_tokens=64)
    ahead = PlanningConfig(
        max_model_len=65536, max_num_batched_tokens=64, num_prefill_lookahead_tokens=33
    )
    blocks = layer_blocks(spec, 16, base)
    assert blocks is not None and layer_blocks(spec, 16, ahead) == blocks + 2
    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
    assert layer_blocks(full, 32, base) == 65536 // 32


# -- class 5: an MLA page's own alignment padding ------------------------------------------


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_pitch_catches_mla_padding_ignored(layout: str) -> None:
    """Placing an aligned MLA page at its unpadded size is caught; the contract's is not."""
    # A 584-byte state a token (not four), its page still padded to a multiple of 576.
    mla = compressed_mla(block_size=64, head_size=73, tokens_per_state=1)
    assert mla.page_size_bytes > mla.real_page_size_bytes
    config = PlanningConfig(kv_cache_layout=layout)
    groups = [KVCacheGroupSpec(layer_names=["m0", "m1"], kv_cache_spec=mla)]
    placed = get_kv_cache_config_from_groups(config, groups, 3)
    assert pitch_findings(placed, layout) == []
    which = "block_stride" if layout == "LBNHC" else "layer_stride"
    tensor = placed.kv_cache_tensors[0]
    import attrs

    dense = attrs.evolve(tensor, **{which: mla.real_page_size_bytes})
    if which == "block_stride":
        dense = attrs.evolve(dense, layer_stride=mla.real_page_size_bytes * 3)
    broken = attrs.evolve(placed, kv_cache_tensors=[dense])
    assert pitch_findings(broken, layout)


# -- class 7: legal padding is not absurd ---------------------------------------------------


def test_size_bound_allows_4kib_padding_of_small_layers() -> None:
    """A 4 KiB-padded block of one 64-byte layer passes; 2**60 bytes stay absurd."""
    from conformance.check.bounds import absurd_size, size_bound

    small = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=16, dtype="float16")
    assert small.page_size_bytes == 64
    groups = [KVCacheGroupSpec(layer_names=["f0"], kv_cache_spec=small)]
    placed = legal_builders.Padded4KiB().get_kv_cache_config_from_groups(
        PlanningConfig(kv_cache_layout="BLHNC"), groups, 4096
    )
    size = placed.kv_cache_tensors[0].size
    bound = size_bound(groups)
    assert size == 4096 * 4096
    assert size > 2 * bound * 4096 + 2**20  # the bound before the power work called this absurd
    assert not absurd_size(size, 4096, bound)
    assert absurd_size(2**60, 4096, bound)
