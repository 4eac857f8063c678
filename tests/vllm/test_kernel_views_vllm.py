"""KV-DEV-KERNEL-VIEWS on vLLM-native builders (tests/vllm/native_builders/kernel_views.py)."""

from __future__ import annotations

import pytest

# tests/vllm looks like a namespace package called "vllm" on a full run: ask for the real one.
pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder

pytestmark = pytest.mark.vllm

ID = "KV-DEV-KERNEL-VIEWS"
MODULE = "tests.vllm.native_builders.kernel_views"


def _result(builder: str, seed: int) -> tuple[str, list[str]]:
    report = check_builder(builder, select=[ID], seed=seed)
    (result,) = report.results
    return result.status, [v.message for v in result.violations]


def test_unpacked_one_layer_tensors_caught() -> None:
    """The layer stride set to the block stride makes the worker split packed blocks.

    Seed 6 draws a compressed MLA cache in BLNHC, which vLLM's worker
    re-strides in vLLM's own packed plan; a packed token cache it refuses in
    both plans (contract.md#kernel-views).
    """
    status, messages = _result(f"{MODULE}:UnpackedOneLayerTensorsBuilder", 6)
    assert status == "fail", messages
    assert any("does not store blocks as dense, unpadded pages" in m for m in messages), messages


def test_squeezed_one_layer_tensors_caught() -> None:
    """A layer stride below the block stride in LBNHC: the worker cannot bind the kernel blocks."""
    status, messages = _result(f"{MODULE}:SqueezedOneLayerTensorsBuilder", 1)
    assert status == "fail", messages
    assert any("cannot be split into" in m for m in messages), messages


def test_one_layer_tensors_pass() -> None:
    """The same split with vLLM's layer stride passes."""
    status, messages = _result(f"{MODULE}:OneLayerTensorsBuilder", 3)
    assert status == "pass", messages
