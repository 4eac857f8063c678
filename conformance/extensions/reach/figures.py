"""Reach's figures: what a run's meter measured, summed up per module for the report.

The harness traces the lines (:class:`conformance.harness.reach.ReachMeter`,
here and in the builder's worker); this module turns them into the report's
``reach`` section: which statements of each counted function ran, which
functions were never entered, and the lines the text report prints.  The
merge of a sharded run (:mod:`conformance.ci.merge`) sums the shards'
figures with :func:`module_figures` and :func:`reach_summary` again.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from conformance.harness.reach import ReachMeter

__all__ = ["format_ranges", "module_figures", "reach_summary", "summary"]


def format_ranges(lines: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"``."""
    out: list[str] = []
    ordered = sorted(set(lines))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def _own_lines(node: ast.AST) -> set[int]:
    """The statement lines of a function's body, less those of functions and classes inside it."""
    lines: set[int] = set()
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, ast.stmt):
            lines.add(child.lineno)
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(child))
    # The signature's own lines (decorators, defaults) are not the body.
    lines.discard(getattr(node, "lineno", -1))
    return lines


def _functions(source: Path) -> list[tuple[str, set[int]]]:
    """``(qualified name, body lines)`` of every function in ``source``, nested ones apart."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found: list[tuple[str, set[int]]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, _own_lines(child)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _callees(meter: ReachMeter, executed: dict[str, set[int]], own: Sequence[Path]) -> list[Path]:
    """The platform's other modules whose functions ran (a platform builder's callees)."""
    if meter.platform is None:
        return []
    root, mine = meter.platform.resolve(), {p.resolve() for p in own}
    found = []
    for name, lines in executed.items():
        path = Path(name)
        if lines and path not in mine and path.suffix == ".py" and path.is_relative_to(root):
            found.append(path)
    return sorted(found)


def _module(
    meter: ReachMeter, path: Path, executed: set[int], whole: bool
) -> dict[str, Any] | None:
    """One module's figures; a callee (``whole=False``) over its entered functions only."""
    functions = [(i, n, body) for i, (n, body) in enumerate(_functions(path))]
    names = (meter.counted or {}).get(str(Path(path).resolve()))
    if whole and names is not None and "*" not in names:
        # Another builder's helpers in a shared module are not this builder's code.
        functions = [f for f in functions if f[1].partition(".")[0] in names]
    if not whole:
        # Only what the hooks entered is the builder's; the rest is the platform's.
        functions = [f for f in functions if f[2] & executed]
        if not functions:
            return None
    statements = meter.statements(path)
    counted = [(i, name, body & statements) for i, name, body in functions]
    return module_figures(str(path), whole, counted, executed)


def summary(meter: ReachMeter) -> dict[str, Any]:
    """What ``meter``'s run reached: per module and in total, with the lines for the report."""
    executed = meter.executed()
    own = list(meter.own if meter.own is not None else meter.files)
    listed = [(p, True) for p in own] + [(p, False) for p in _callees(meter, executed, own)]
    modules = []
    for path, whole in listed:
        module = _module(meter, path, executed.get(str(Path(path).resolve()), set()), whole)
        if module is not None:
            modules.append(module)
    return reach_summary(modules, meter.min_reach)


def module_figures(
    path: str, whole: bool, functions: Sequence[tuple[int, str, set[int]]], executed: set[int]
) -> dict[str, Any]:
    """One module's reach figures from its counted functions and the lines executed.

    ``functions``: ``(position in the source, qualified name, statement lines
    of its body)`` of every function that counts.  Module and class bodies ran
    at import, before the run: only the code inside functions says what the
    run reached.  ``functions`` and ``ran`` are in the figures too, so that the
    reports of a sharded run can be joined (:mod:`conformance.ci.merge`).
    """
    statements = set().union(*(body for _, _, body in functions)) if functions else set()
    ran = statements & executed
    missing = statements - ran
    unreached = [name for _, name, body in functions if body and not body & ran]
    count = len(statements)
    return {
        "path": path,
        "statements": count,
        "executed": len(ran),
        "percent": round(100.0 * len(ran) / count, 1) if count else 100.0,
        "missing": format_ranges(missing),
        "unreached_functions": unreached,
        "role": "own" if whole else "callee",
        "functions": [[i, name, sorted(body)] for i, name, body in functions],
        "ran": sorted(ran),
    }


def reach_summary(modules: list[dict[str, Any]], min_reach: float | None) -> dict[str, Any]:
    """The reach section of a report over ``modules`` (:func:`module_figures`'s)."""
    total = sum(m["statements"] for m in modules)
    hit = sum(m["executed"] for m in modules)
    percent = round(100.0 * hit / total, 1) if total else 100.0
    below = min_reach is not None and percent < min_reach
    data: dict[str, Any] = {
        "percent": percent,
        "statements": total,
        "executed": hit,
        "modules": modules,
        "min_reach": min_reach,
        "below_minimum": below,
    }
    data["lines"] = _lines(data)
    return data


def _lines(data: dict[str, Any]) -> list[str]:
    lines = ["Reach (the builder's own code the run executed):"]
    for m in data["modules"]:
        path = _short(m["path"])
        text = f"  reached {m['percent']:.0f}% of {path}"
        if m["missing"]:
            text += f" (not reached: {m['missing']})"
        lines.append(text)
    if len(data["modules"]) > 1:
        lines.append(f"  reached {data['percent']:.0f}% in all")
    unreached = [f for m in data["modules"] for f in m["unreached_functions"]]
    if unreached:
        shown = ", ".join(f"{f}()" for f in unreached[:8])
        more = f" and {len(unreached) - 8} more" if len(unreached) > 8 else ""
        lines.append(
            f"  WARNING: never entered: {shown}{more}. Verdicts say nothing about that code; "
            "give the kit your models with --models, or explore with --explore SECONDS, so it "
            "reaches it."
        )
    if data["below_minimum"]:
        lines.append(
            f"  FAILED: reach {data['percent']:.1f}% is below --min-reach {data['min_reach']:g}%"
        )
    return lines


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
