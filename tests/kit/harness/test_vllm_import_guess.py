"""The guess of whether a named builder imports vLLM reads source text and imports nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.harness.vllm_import_guess import imports_vllm


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package on sys.path whose ``__init__`` must never run here."""
    root = tmp_path / "vendor_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("raise RuntimeError('imported by the guess')\n")
    (root / "native.py").write_text(
        "import os\nfrom vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder\n"
    )
    (root / "plain.py").write_text(
        "from kvref import ReferenceKVCacheConfigBuilder\nvllm_hint = 'import vllm'\n"
    )
    (root / "aliased.py").write_text("def f():\n    import vllm as v\n    return v\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return root


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder", True),
        ("vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder", True),
        ("vendor_pkg.native:Builder", True),
        ("vendor_pkg.aliased:Builder", True),
        ("vendor_pkg.plain:Builder", False),
        ("vendor_pkg.missing:Builder", False),
        ("kvref:ReferenceKVCacheConfigBuilder", False),
        ("Builder", False),
    ],
)
def test_guess(pkg: Path, name: str, expected: bool) -> None:
    """vLLM's own modules and sources with an import line of vllm; nothing else."""
    assert imports_vllm(name) is expected
    assert "vendor_pkg" not in sys.modules


def test_file_form(pkg: Path) -> None:
    """``path/to/file.py:Class`` reads that file."""
    assert imports_vllm(f"{pkg / 'native.py'}:Builder")
    assert not imports_vllm(f"{pkg / 'plain.py'}:Builder")
    assert not imports_vllm(f"{pkg / 'absent.py'}:Builder")
