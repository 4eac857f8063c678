"""A vendor's own vLLM spec class, from a ``--models module:attr`` evaluated in a child.

The module never reaches the judging process (docs/trust.md): its models
cross as data, the vendor's class by name; the builder's worker gets the
vendor's class itself.  The builder: tests/vllm/native_builders/vendor_models.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder

pytestmark = pytest.mark.vllm

MODULE = "tests.vllm.native_builders.vendor_models"


def test_the_vendors_class_reaches_the_builder_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("KVREF_SEEN_SPECS", str(seen))
    sys.modules.pop(MODULE, None)
    report = check_builder(
        f"{MODULE}:GatesOnItsClass",
        models=f"{MODULE}:MODELS",
        models_only=True,
        select=["KV-CALL-RAISES", "KV-GROUP-PARTITION"],
        max_examples=3,
        seed=1,
        reach=False,
    )
    assert report.result("KV-CALL-RAISES").status == "pass", report.result("KV-CALL-RAISES")
    assert "AcmeSlotSpec 5" in seen.read_text()
    assert MODULE not in sys.modules  # neither the models nor the builder came here
