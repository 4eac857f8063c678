"""The documentation site builds strictly and the contract has every anchor the code cites.

``mkdocs build --strict`` fails on a broken link or anchor (including the
generated catalog's links to contract sections); it runs when mkdocs and
the Material theme are importable (the ``test`` extra installs them).  The
anchor checks need neither: they read the headings of ``docs/contract.md``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
from subprocesses import run_captured

from conformance.check.catalog import catalog

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"

#: Where a reference to a section of the contract may appear.
_SOURCES = ("kvref", "conformance", "tests", "docs", "benchmarks", "scripts")
_CITATION = re.compile(r"contract\.md#([a-z0-9-]+)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")
_EXPLICIT = re.compile(r"""<a\s+id=["']([a-z0-9-]+)["']|\{#([a-z0-9-]+)\}""")


def _slug(title: str) -> str:
    # The toc extension's rule (which GitHub's matches for these titles): drop what is
    # not a word character, a space or a hyphen, lower-case, spaces to hyphens.
    text = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def contract_anchors() -> set[str]:
    """Every anchor docs/contract.md defines: heading slugs and explicit ids."""
    anchors: set[str] = set()
    fenced = False
    for line in CONTRACT.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        anchors.update(a or b for a, b in _EXPLICIT.findall(line))
        heading = _HEADING.match(line)
        if heading:
            anchors.add(_slug(_EXPLICIT.sub("", heading.group(1))))
    return anchors


#: Files at the top of the repository that are checked too.
_TOP_FILES = ("README.md", "pyproject.toml", "tox.ini", "mkdocs.yml")


def _files(suffixes: tuple[str, ...]) -> list[Path]:
    this = Path(__file__).resolve()
    found = [ROOT / name for name in _TOP_FILES if (ROOT / name).suffix in suffixes]
    for top in _SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in suffixes and ".hypothesis" not in path.parts and path != this:
                found.append(path)
    return found


def _cited() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for path in _files((".py", ".md")):
        for anchor in _CITATION.findall(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(anchor, set()).add(str(path.relative_to(ROOT)))
    return cited


class TestAnchors:
    """The contract defines every anchor that is cited."""

    def test_slug_rule(self) -> None:
        """Headings slug as mkdocs renders them."""
        assert _slug("Grouping: partition") == "grouping-partition"
        assert _slug("Placement: attention-free") == "placement-attention-free"

    def test_catalog_anchors_exist(self) -> None:
        """Every invariant's anchor is a section of the contract."""
        missing = {inv.id: inv.anchor for inv in catalog() if inv.anchor not in contract_anchors()}
        assert not missing, missing

    def test_cited_anchors_exist(self) -> None:
        """Every contract.md#anchor in the code, tests and docs is a section of the contract."""
        anchors = contract_anchors()
        missing = {a: sorted(p) for a, p in _cited().items() if a not in anchors}
        assert not missing, missing

    def test_no_outside_documents(self) -> None:
        """Nothing cites documents that are not in the repository."""
        outside = re.compile(r"SPEC\.md|DESIGN\.md|\.\./shared/")
        found = [
            str(path.relative_to(ROOT))
            for path in _files((".py", ".md", ".sh", ".toml", ".ini", ".yml"))
            if outside.search(path.read_text(encoding="utf-8", errors="replace"))
        ]
        assert not found, found


_HAS_MKDOCS = all(importlib.util.find_spec(m) is not None for m in ("mkdocs", "material"))


@pytest.mark.skipif(not _HAS_MKDOCS, reason="mkdocs and mkdocs-material are not installed")
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes: no broken link, anchor or nav entry."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    done = run_captured(build, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "contract" / "index.html").is_file()
