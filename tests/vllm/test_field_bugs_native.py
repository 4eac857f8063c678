"""Bug classes reported from the field, as vendors write them, met by the default run's generation.

Each broken builder (tests/vllm/native_builders/field_gates.py,
field_reports.py, config_writes.py) opens its gate on one model family or
engine path and calls ``super()`` elsewhere; the default run's deal over
the families (conformance/run/strata.py) must reach that gate and fail the
meant invariants as the builder's own finding, at every seed tried.  The
legal builder behind the same gate must pass the same invariants.  The runs
select only the invariants they prove and draw two examples per family (the
fewest at which every family draws a block-outermost example), so each
stays a fraction of a default run.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import Report, check_builder
from conformance.generate.families import DEFAULT_FAMILIES

pytestmark = pytest.mark.vllm

PKG = "tests.vllm.native_builders"
#: Two examples per family: one leans to block-outermost layouts (strata.py).
EXAMPLES = 2 * len(DEFAULT_FAMILIES)


@dataclass(frozen=True)
class Pair:
    """A broken builder, the legal one behind the same gate, and the invariants judged.

    Attributes:
        broken: ``module:Class`` (in :data:`PKG`) of the builder with the bug.
        legal: ``module:Class`` of the builder behind the same gate without it.
        meant: the invariants the run selects; the broken builder must fail
            at least one of them as its own finding, and nothing else.
    """

    broken: str
    legal: str
    meant: tuple[str, ...]

    @property
    def id(self) -> str:
        """The test id: the broken class's name."""
        return self.broken.partition(":")[2]


PAIRS = (
    # An isinstance gate that lets the hidden-state cache (an MLA subclass)
    # through: its page, sized as one latent head, runs into the next block
    # (past the backing at the last one) or over the next layer's page.
    Pair(
        "field_gates:LatentHeadPageBuilder",
        "field_gates:PacksLatentsBuilder",
        ("KV-PLACE-IN-BOUNDS", "KV-PLACE-NO-BLOCK-ALIAS", "KV-PLACE-NO-LAYER-OVERLAP"),
    ),
    # Uniform-type group specs re-created with cache_config.block_size: the
    # block table counts tokens in blocks the layers' pages do not hold.
    Pair(
        "field_gates:EngineBlockSizeGroupsBuilder",
        "field_gates:RebuildsUniformGroupsBuilder",
        ("KV-GROUP-ONE-BLOCK-SIZE",),
    ),
    # HiSparse: every layer of a multi-layer tensor at the tensor's base offset,
    # overwriting each other on the device and in the host pool.
    Pair(
        "field_reports:HiSparseBaseOffsetBuilder",
        "field_reports:HiSparseSplitLayersBuilder",
        ("KV-HOST-DEVICE-SAFE", "KV-HOST-NO-ALIAS", "KV-HOST-HISPARSE-RUNS"),
    ),
    # Mamba specs beside a drafter re-created without their speculative blocks.
    Pair(
        "field_reports:MambaDropsSpeculativeBlocksBuilder",
        "field_reports:MambaKeepsSpeculativeBlocksBuilder",
        ("KV-GROUP-SPEC-MEANING",),
    ),
    # Packed multi-layer tensors split by layer, each stepping blocks by its
    # page size instead of the packed block: block b of layer i is block
    # b + i of layer 0.
    Pair(
        "field_reports:PageStrideLayersBuilder",
        "field_reports:PackedStrideLayersBuilder",
        ("KV-PLACE-NO-BLOCK-ALIAS",),
    ),
    # A grouping hook that aligns cache_config.block_size to the model's.
    Pair(
        "config_writes:AlignsEngineBlockSize",
        "hydra:HydraPassThroughBuilder",
        ("KV-GROUP-INPUT-UNCHANGED",),
    ),
)


def run(qualname: str, pair: Pair, seed: int) -> Report:
    """The default run's generation of ``qualname``, judged on ``pair``'s invariants."""
    return check_builder(
        f"{PKG}.{qualname}",
        select=list(pair.meant),
        max_examples=EXAMPLES,
        seed=seed,
        shrink=False,
        reach=False,
        isolate=False,
        timeout=120,
    )


def failed(report: Report) -> dict[str, bool]:
    """Each invariant that failed or was inconclusive, and whether it was inherited."""
    return {r.id: bool(r.inherited) for r in report.results if r.status in ("fail", "inconclusive")}


# Seeds 2-5 are slow (`pytest -m slow`), to keep CI lean: seed 1 runs under
# each release on every submission.
@pytest.mark.parametrize(
    "seed", [1, *(pytest.param(seed, marks=pytest.mark.slow) for seed in (2, 3, 4, 5))]
)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.id)
def test_broken_builder_is_caught(pair: Pair, seed: int) -> None:
    """A meant invariant fails as the builder's own finding; nothing outside them fails."""
    report = run(pair.broken, pair, seed)
    found = failed(report)
    assert found, [(r.id, r.status, r.examples) for r in report.results]
    assert set(found) <= set(pair.meant), found
    assert not any(found.values()), found
    assert all(r.violations for r in report.failures)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.id)
def test_legal_builder_behind_the_gate_passes(pair: Pair) -> None:
    """The same gate without the bug: the selected invariants pass, on examples judged.

    Where the gate is shut the builder is vLLM's default, whose own defects
    (docs/vllm.md) it inherits: those may fail, reported as inherited.
    """
    report = run(pair.legal, pair, 1)
    own = [i for i, inherited in failed(report).items() if not inherited]
    assert not own, [(r.id, r.violations[:1]) for r in report.failures]
    assert all(r.examples > 0 for r in report.results if r.status == "pass")


def test_a_wrapper_off_its_layers_block_size_converts_as_declared() -> None:
    """A wrapper re-made with another block size keeps it, both ways, for the kit to judge.

    vLLM's own wrapper converts with no declared size (its layers' is its
    own); one re-made with ``block_size=16`` over 64-token pages converts to a
    kvref wrapper that declares 16, counts in 16 and converts back to 16.
    """
    import torch
    from vllm.v1.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs

    from kvref.interop import vllm as iv

    layers: dict[str, KVCacheSpec] = {
        f"model.layers.{i}.self_attn.attn": MLAAttentionSpec(
            block_size=64, num_kv_heads=heads, head_size=576, dtype=torch.bfloat16
        )
        for i, heads in enumerate((1, 3))
    }
    theirs = UniformTypeKVCacheSpecs.from_specs(layers)
    assert theirs is not None and theirs.block_size == 64
    ours = iv.spec_from_vllm(theirs)
    assert ours.block_size == 64 and ours.declared_block_size is None
    remade = iv.spec_from_vllm(UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=layers))
    assert remade.declared_block_size == 16 and remade.block_size == 16
    assert {s.block_size for s in remade.kv_cache_specs.values()} == {64}
    back = iv.spec_to_vllm(remade)
    assert type(back) is UniformTypeKVCacheSpecs and back.block_size == 16
