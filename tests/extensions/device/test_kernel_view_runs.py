"""KV-DEV-KERNEL-VIEWS' broadcast reading agrees with its general gather.

The device readback compares a dense page by broadcasting one tag per
kernel block over equal runs of the page (``_runs_order``) and falls back to
gathering through the page's slice map where the runs are not equal.  Both
readings must reach the same verdict, the same violation included, for every
layout: a correct kernel view passes both, a kernel view that steps kernel
blocks by half a kernel page fails both with the same message.
"""

from __future__ import annotations

import pytest
import torch
from kernel_builders import misstepped_geometries, reference_placement

import conformance.extensions.device.kernel as device_kernel
from conformance.check.observations import PlacementObservation
from conformance.check.violations import Violation
from kvref import PlanningConfig
from kvref.backends import AttentionBackend
from kvref.layout import KVCacheLayout
from kvref.specs import FullAttentionSpec, KVCacheSpec

_SPEC = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=8, dtype=torch.float16)
_BACKEND = AttentionBackend(name="k16", supported_kernel_block_sizes=(16,))


def _observation(layout: KVCacheLayout) -> PlacementObservation:
    specs: dict[str, KVCacheSpec] = {"l0": _SPEC, "l1": _SPEC, "l2": _SPEC}
    config = PlanningConfig(
        max_model_len=256, kv_cache_layout=layout, attention_backends=(_BACKEND,)
    )
    return reference_placement(config, specs, 5)


def _messages(outcome: object) -> list[str]:
    assert isinstance(outcome, list), outcome
    assert all(isinstance(v, Violation) for v in outcome)
    return [v.message for v in outcome]


# The layouts whose pages the worker splits (layer-outer, block-major pages):
# heads before tokens and tokens before heads.
@pytest.mark.parametrize(
    "layout", [KVCacheLayout.LBHNC, KVCacheLayout.LBNHC], ids=lambda lay: lay.value
)
@pytest.mark.parametrize("broken", [False, True], ids=["correct", "misstepped"])
def test_broadcast_and_gather_agree(
    layout: KVCacheLayout, broken: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same findings through the broadcast reading and through the gather alone."""
    if broken:
        monkeypatch.setattr(device_kernel, "kernel_tensor_geometries", misstepped_geometries)
    taken: list[bool] = []
    real_order = device_kernel._runs_order

    def spy(*args: object) -> tuple[int, ...] | None:
        order = real_order(*args)  # type: ignore[arg-type]
        taken.append(order is not None)
        return order

    monkeypatch.setattr(device_kernel, "_runs_order", spy)
    fast = _messages(device_kernel.kernel_view_findings(_observation(layout)))
    assert taken and all(taken), "a dense page is read by broadcasting"
    monkeypatch.setattr(device_kernel, "_runs_order", lambda *args: None)
    general = _messages(device_kernel.kernel_view_findings(_observation(layout)))
    assert fast == general
    if broken:
        assert fast and "reads back wrong" in fast[0]
    else:
        assert fast == []


def test_gaps_fall_back_to_the_gather() -> None:
    """A page with gaps in memory order has no run view: the gather reads it."""
    storage = torch.zeros(2 * 3 * 4 * 2 * 8, dtype=torch.int16)
    # (layers, blocks, H, S, C) with a gap after every head's states.
    gapped = storage.as_strided((2, 3, 4, 2, 6), (3 * 4 * 16, 4 * 16, 16, 6, 1))
    assert device_kernel._as_runs(gapped, (0, 1, 2), 2) is None
    dense = storage.as_strided((2, 3, 4, 2, 8), (3 * 64, 64, 16, 8, 1))
    runs = device_kernel._as_runs(dense, (0, 1, 2), 2)
    assert runs is not None and runs.shape == (2, 3, 2, 32)
    assert runs.data_ptr() == dense.data_ptr()
