"""A seed draws the same examples whatever else the process has imported."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from conformance.generate.determinism import seed_only_draws
from conformance.run.strata import run_strata, sample

providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
if not hasattr(providers, "_get_local_constants"):  # pragma: no cover - older Hypothesis
    pytest.skip("this Hypothesis draws no local constants", allow_module_level=True)


def _draws(stratum_name: str) -> list[str]:
    stratum = next(s for s in run_strata(None, only=False) if s.name == stratum_name)
    return [repr((ex.config, ex.workers)) for ex in sample("placement", stratum, 12, 3, "ci", "p")]


def test_the_kits_draws_never_read_the_local_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis is never asked for the pool while the kit draws (it would ask often)."""
    asked: list[int] = []
    original = providers._get_local_constants

    def counting() -> object:
        asked.append(1)
        return original()

    monkeypatch.setattr(providers, "_get_local_constants", counting)
    _draws("hybrid")
    assert asked == []
    # The same draws outside the kit's guard do ask: the check above can fail.
    stratum = next(s for s in run_strata(None, only=False) if s.name == "hybrid")
    strategy = stratum.examples("placement", "ci", None)
    from hypothesis import HealthCheck, given, seed, settings

    @settings(max_examples=12, database=None, suppress_health_check=list(HealthCheck))
    @seed(3)
    @given(strategy)
    def unguarded(_example: object) -> None:
        pass

    unguarded()
    assert asked


def test_an_imported_module_does_not_change_the_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Literals of a module loaded mid-session (a vendor's, a notebook's) are not drawn."""
    before = {name: _draws(name) for name in ("hybrid", "mixed_pages")}
    # Hypothesis parses modules outside site-packages and outside test folders.
    home = tmp_path / "vendor_code"
    home.mkdir()
    literals = ", ".join(str(n) for n in range(2, 3000, 7))
    (home / "kv_literals.py").write_text(f"VALUES = ({literals},)\n")
    monkeypatch.syspath_prepend(str(home))
    importlib.import_module("kv_literals")
    try:
        after = {name: _draws(name) for name in before}
    finally:
        sys.modules.pop("kv_literals", None)
    assert after == before


def test_the_callers_pool_is_restored() -> None:
    """A user's own Hypothesis tests in the same process keep their local constants."""
    original = providers._get_local_constants
    with seed_only_draws():
        assert providers._get_local_constants is not original
        assert len(providers._get_local_constants()) == 0
        with seed_only_draws():
            assert len(providers._get_local_constants()) == 0
        assert providers._get_local_constants is not original
    assert providers._get_local_constants is original
