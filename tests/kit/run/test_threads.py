"""A run uses one torch intra-op thread and gives the caller's count back."""

from __future__ import annotations

import pytest
import torch

from conformance.run.threads import one_torch_thread


def test_one_thread_inside_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the block torch has one thread; after it, the caller's count, even on error."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="boom"), one_torch_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_users_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """With OMP_NUM_THREADS set, the run leaves torch's thread count alone."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_torch_thread():
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
