"""Generate docs/invariants.md from the catalog (one source of truth).

Run: python docs/gen_invariants.py.
"""

from __future__ import annotations

from pathlib import Path

from conformance.check.catalog import catalog


def render() -> str:
    """The catalog as a Markdown table."""
    lines = [
        "# Invariant catalog",
        "",
        "Generated from the kit's catalog (`conformance/check/`, and the check modules",
        "of the extensions that add invariants: `conformance/extensions/contributions.py`) by",
        "`python docs/gen_invariants.py`; do not edit by hand. Ids are stable: use them",
        "in `--select` and xfail files. Each links to the section of the",
        "[contract](contract.md) that states the promise.",
        "",
        "| id | scenarios | contract | requires | title |",
        "|---|---|---|---|---|",
    ]
    for inv in catalog():
        requires = ", ".join(sorted(inv.requires)) or "-"
        scenarios = "every scenario" if inv.everywhere else ", ".join(inv.scenarios)
        anchor = f"[{inv.anchor}](contract.md#{inv.anchor})"
        lines.append(f"| `{inv.id}` | {scenarios} | {anchor} | {requires} | {inv.title} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("invariants.md").write_text(render())
