"""The HTML report: ``--html FILE``.

The page is parsed with :mod:`html.parser`; a headless Chromium, where one is
installed (Debian: ``apt-get install chromium``), renders it to a PNG and the
test checks the overlap of a known broken builder shows in the picture.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conformance.ci.html import format_html
from conformance.ci.memory_map import COLOURS, memory_map_svg
from conformance.cli import main

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

OVERLAP = "KV-PLACE-NO-LAYER-OVERLAP"
BROKEN = "broken_builders:OverlappingLayers"


class _Page(HTMLParser):
    """The elements of a page, as ``(tag, attributes)``, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def tags(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.elements
            if t == tag and (cls is None or cls in a.get("class", "").split())
        ]


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def broken_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The HTML page and JSON report of a run of a builder whose layers overlap."""
    out = tmp_path_factory.mktemp("html")
    html, report = out / "report.html", out / "report.json"
    code = main(
        [
            BROKEN,
            "--select",
            OVERLAP,
            "--max-examples",
            "20",
            "--seed",
            "1",
            "--replays",
            "0",
            "--no-database",
            "--json",
            str(report),
            "--html",
            str(html),
        ]
    )
    assert code == 1
    yield html, json.loads(report.read_text())


class TestPage:
    def test_parses_with_table_and_marked_svg(self, broken_page: tuple[Path, Any]) -> None:
        html, _ = broken_page
        page = _parse(html.read_text(encoding="utf-8"))
        assert page.tags("table", "verdicts")
        text = " ".join(page.text)
        assert OVERLAP in text and "FAIL" in text
        assert page.tags("svg", "memory-map")
        overlapping = page.tags("rect", "overlap")
        assert overlapping and all(r["fill"] == COLOURS["overlap"] for r in overlapping)
        # Both pages of an overlap are marked (the layer named and the one it overlaps),
        # and pages no violation names are not.
        grid = page.tags("rect", "page")
        assert 2 <= len([r for r in grid if "overlap" in r["class"].split()]) < len(grid)

    def test_self_contained(self, broken_page: tuple[Path, Any]) -> None:
        html, _ = broken_page
        text = html.read_text(encoding="utf-8")
        page = _parse(text)
        assert not page.tags("script") and not page.tags("link") and not page.tags("img")
        assert not [a for _, a in page.elements if "src" in a]
        assert not [a for _, a in page.elements if "://" in a.get("href", "")]
        # The one URL is the SVG namespace, which is a name, not a fetch.
        assert "://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")

    def test_reach_shows_unreached_lines(self, broken_page: tuple[Path, Any]) -> None:
        html, report = broken_page
        if report["reach"] is None:
            pytest.skip("reach was not measured (no coverage.py)")
        text = html.read_text(encoding="utf-8")
        assert "unreached lines of" in text and "broken_builders/placement.py" in text
        # A line the run never entered, shown with its source text.
        module = report["reach"]["modules"][0]
        first = int(module["missing"].split(",")[0].split("-")[0])
        line = Path(module["path"]).read_text().splitlines()[first - 1]
        assert f"{first:>5} </span>{escape(line)}" in text

    def test_made_from_the_json(self, broken_page: tuple[Path, Any]) -> None:
        """The page is the report's data: rendering the --json file gives the same page."""
        html, report = broken_page
        assert format_html(report) == html.read_text(encoding="utf-8")


class TestMemoryMap:
    def _result(self, **violation: Any) -> dict[str, Any]:
        base = {"invariant": "KV-PLACE-IN-BOUNDS", "message": "", "worker": None}
        return {"id": "KV-PLACE-IN-BOUNDS", "violations": [{**base, **violation}]}

    def test_out_of_bounds_marks_page_and_backing(self) -> None:
        svg = memory_map_svg(
            self._result(
                layer="l0",
                block=3,
                byte_range=[4096, 8192],
                message="at 4 blocks tensor 0's page ends past the backing of 6144 bytes",
            )
        )
        assert svg is not None
        page = _parse(svg)
        assert page.tags("rect", "out-of-bounds") and page.tags("line", "backing")

    def test_nothing_located_draws_nothing(self) -> None:
        assert memory_map_svg({"id": "KV-X", "violations": [{"message": "no place"}]}) is None

    def test_unreadable_data_still_draws_ranges(self) -> None:
        result = self._result(layer="l0", block=0, byte_range=[0, 16])
        result["counterexample_data"] = {"format": "something else"}
        svg = memory_map_svg(result)
        assert svg is not None and "counterexample data unreadable" in svg


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.skipif(
    _browser() is None,
    reason="no headless browser (chromium, chromium-browser or google-chrome) on PATH; "
    "on Debian: apt-get install chromium",
)
def test_renders_in_headless_chromium(broken_page: tuple[Path, Any], tmp_path: Path) -> None:
    """Chromium renders the page; the screenshot shows the memory map's overlap colour."""
    image = pytest.importorskip("PIL.Image")
    html, _ = broken_page
    shot = tmp_path / "report.png"
    browser = _browser()
    assert browser is not None
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace for the sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,4000",
            f"--screenshot={shot}",
            html.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    keep = os.environ.get("KVREF_SCREENSHOT_DIR")
    if keep:
        # For people: the picture the assertions read.
        shutil.copy(shot, Path(keep) / "html-report-overlapping-layers.png")
    with image.open(shot) as im:
        pixels = im.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 10, "the screenshot is blank"
    red = tuple(int(COLOURS["overlap"][i : i + 2], 16) for i in (1, 3, 5))
    # The overlap red is the memory map's alone (verdict badges use another red).
    assert sum(n for n, c in colours if c == red) > 200


@pytest.mark.parametrize("where", ["missing-dir/report.html", "."])
def test_unwritable_path_is_a_usage_error(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --html path that cannot be written is refused before the run (exit 2, named)."""
    assert main(["--html", str(tmp_path / where), "--max-examples", "1"]) == 2
    assert "--html" in capsys.readouterr().err
