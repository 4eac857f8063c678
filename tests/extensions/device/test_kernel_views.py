"""KV-DEV-KERNEL-VIEWS: the worker's kernel views read each block where the plan puts it.

The four builders of tests/kernel_builders.py are caught with check_builder
in its default (isolated) mode; the reference and the legal builders pass;
the default generation draws backends whose kernel blocks split the cache
block; and the device readback itself catches a kernel view that steps
kernel blocks differently from the plan (contract.md#kernel-views).
"""

from __future__ import annotations

import kernel_builders
import legal_builders
import pytest
import torch

import conformance.extensions.device.kernel as device_kernel
from conformance import check_builder
from conformance.check.catalog import Unjudged, by_id
from conformance.check.observations import PlacementObservation
from conformance.check.violations import Violation
from kvref import (
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.backends import AttentionBackend
from kvref.layout import KVCacheLayout
from kvref.specs import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

ID = device_kernel.KV_DEV_KERNEL_VIEWS


def _status(builder: object, seed: int) -> tuple[str, list[str]]:
    report = check_builder(builder, select=[ID], seed=seed)  # type: ignore[arg-type]
    (result,) = report.results
    return result.status, [v.message for v in result.violations]


class TestCatalog:
    """The invariant is a device invariant citing its own contract section."""

    def test_registered(self) -> None:
        """Declared in the catalog with the kernel-views anchor and the device scenario."""
        inv = by_id()[ID]
        assert inv.anchor == "kernel-views"
        assert inv.scenarios == ("device",)


@pytest.mark.parametrize(
    ("builder", "seed", "expected"),
    [
        (kernel_builders.PaddedDenseRead, 2, "does not store blocks as dense, unpadded pages"),
        (kernel_builders.KernelSizeMisfit, 2, "cannot choose a kernel block size"),
        # Seed 6 draws a compressed MLA cache in BLNHC, whose packed blocks vLLM
        # re-strides at bind time: the reference's plan reads, the builder's does not
        # (a token cache's packed blocks are refused for both, contract.md#kernel-views).
        (kernel_builders.UnpackedSingleLayers, 6, "does not store blocks as dense, unpadded pages"),
        # Its mirror: the worker takes layer-compact one-layer tensors as packed and
        # cannot bind the backend's smaller kernel blocks in them.
        (kernel_builders.PackedSingleLayers, 1, "cannot be split into"),
    ],
)
def test_caught(builder: type[ReferenceKVCacheConfigBuilder], seed: int, expected: str) -> None:
    """Each kernel-view builder fails KV-DEV-KERNEL-VIEWS in the default isolated run."""
    status, messages = _status(f"kernel_builders:{builder.__name__}", seed)
    assert status == "fail", messages
    assert any(expected in m for m in messages), messages


def test_reference_passes() -> None:
    """The reference passes where the worker splits blocks, with examples judged."""
    report = check_builder(ReferenceKVCacheConfigBuilder, select=[ID], seed=1, isolate=False)
    (result,) = report.results
    assert result.status == "pass", [v.message for v in result.violations]
    assert result.examples >= 1


#: What a violation says when the worker cannot read a plan at all (no tag was compared).
_REFUSALS = (
    "the worker cannot view this plan through its kernels",
    "the worker cannot choose a kernel block size",
)


def _assert_legal(builder: type[ReferenceKVCacheConfigBuilder], seed: int) -> int:
    """``builder`` passes, or fails only as the run's release's worker refuses it.

    A legal builder whose ``WORKER_REFUSED`` names this invariant for the
    release (the worker cannot bind some of its plans) may fail with refusals;
    a tag that reads back wrong is never legal.  Returns the examples judged.
    """
    report = check_builder(builder, select=[ID], seed=seed, isolate=False)
    (result,) = report.results
    messages = [v.message for v in result.violations]
    release = report.contract.removeprefix("vLLM ")
    refused = getattr(builder, "WORKER_REFUSED", {}).get(release, frozenset())
    if ID in refused and result.status == "fail":
        assert all(m.startswith(_REFUSALS) for m in messages), messages
    else:
        assert result.status == "pass", messages
    return result.examples


@pytest.mark.slow
@pytest.mark.parametrize(
    "builder",
    [*legal_builders.ALL, *legal_builders.FIELD_REGIMES],
    ids=lambda b: b.__name__,
)
def test_legal_pass(builder: type[ReferenceKVCacheConfigBuilder]) -> None:
    """The legal builders pass where the worker splits blocks (or fail as it refuses them)."""
    assert _assert_legal(builder, 1) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize(
    "builder",
    [ReferenceKVCacheConfigBuilder, legal_builders.PadsTwice, *legal_builders.ALL],
    ids=lambda b: b.__name__,
)
def test_legal_pass_more_seeds(builder: type[ReferenceKVCacheConfigBuilder], seed: int) -> None:
    """More seeds for the legal builders, PadsTwice included."""
    _assert_legal(builder, seed)


def test_unpacked_passes_the_rest() -> None:
    """UnpackedSingleLayers breaks only in the kernel view: the paper and device checks pass."""
    report = check_builder(
        kernel_builders.UnpackedSingleLayers,
        select=["KV-GROUP", "KV-PLACE", "KV-DEV-VIEWS", "KV-DEV-TAGS"],
        seed=3,
        max_examples=25,
        isolate=False,
    )
    assert report.ok, [(r.id, [v.message for v in r.violations]) for r in report.failures]


# -- the check on hand-made observations --------------------------------------------


_SPEC = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=8, dtype=torch.float16)
_PAGE = _SPEC.page_size_bytes


def _observation(
    backends: tuple[AttentionBackend, ...], num_blocks: int = 4
) -> PlacementObservation:
    specs: dict[str, KVCacheSpec] = {"l0": _SPEC, "l1": _SPEC}
    config = PlanningConfig(
        max_model_len=256, kv_cache_layout=KVCacheLayout.LBNHC, attention_backends=backends
    )
    return kernel_builders.reference_placement(config, specs, num_blocks)


class TestFindings:
    """kernel_view_findings on observations built by hand."""

    def test_not_applicable_without_split(self) -> None:
        """No backend, or one taking the cache block: N/A with the reason, never a failure."""
        for backends in ((), (AttentionBackend(name="any"),)):
            outcome = device_kernel.kernel_view_findings(_observation(backends))
            assert isinstance(outcome, Unjudged)
            assert not outcome.applicable
            assert "no kernel split applies" in outcome.reason

    def test_split_reference_holds(self) -> None:
        """A 32-token block read as two 16-token kernel blocks: the tags read back."""
        backend = AttentionBackend(name="k16", supported_kernel_block_sizes=(16,))
        assert device_kernel.kernel_view_findings(_observation((backend,))) == []

    def test_packed_token_cache_of_the_reference_is_unjudged(self) -> None:
        """Two layers packed per BLHNC block, 16-token kernels: the worker refuses the reference."""
        backend = AttentionBackend(name="k16", supported_kernel_block_sizes=(16,))
        config = PlanningConfig(
            max_model_len=256, kv_cache_layout=KVCacheLayout.BLHNC, attention_backends=(backend,)
        )
        obs = kernel_builders.reference_placement(config, {"l0": _SPEC, "l1": _SPEC}, 4)
        outcome = device_kernel.kernel_view_findings(obs)
        assert isinstance(outcome, Unjudged) and outcome.applicable
        assert "cannot read the reference's plan either" in outcome.reason
        assert "cannot be split into" in outcome.reason

    def test_restrided_compressed_cache_holds(self) -> None:
        """A packed cache of 4 tokens a state re-strided into 16-token kernel blocks reads back.

        Misstepped by half a kernel page, the same reading is caught.
        """
        compressed = MLAAttentionSpec(
            block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float16, tokens_per_state=4
        )
        backend = AttentionBackend(name="k16", supported_kernel_block_sizes=(16,))
        config = PlanningConfig(
            max_model_len=256, kv_cache_layout=KVCacheLayout.BLHNC, attention_backends=(backend,)
        )
        obs = kernel_builders.reference_placement(config, {"l0": compressed, "l1": compressed}, 4)
        assert device_kernel.kernel_view_findings(obs) == []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                device_kernel, "kernel_tensor_geometries", kernel_builders.misstepped_geometries
            )
            outcome = device_kernel.kernel_view_findings(obs)
        assert isinstance(outcome, list) and outcome
        assert "reads back wrong" in outcome[0].message

    def test_readback_catches_a_misstepped_kernel_view(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A kernel view stepping kernel blocks by half a kernel page is caught on the device."""
        monkeypatch.setattr(
            device_kernel, "kernel_tensor_geometries", kernel_builders.misstepped_geometries
        )
        backend = AttentionBackend(name="k16", supported_kernel_block_sizes=(16,))
        outcome = device_kernel.kernel_view_findings(_observation((backend,)))
        assert isinstance(outcome, list) and outcome
        assert all(isinstance(v, Violation) for v in outcome)
        assert "reads back wrong" in outcome[0].message
        assert "the plan gives that slice bytes" in outcome[0].message
