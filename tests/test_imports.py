"""kvref's import structure: no circle among its modules, each module imports on its own,
``import kvref`` stays light (no torch), and the lazy public surface is consistent."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import kvref

ROOT = Path(kvref.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports outside function bodies (``if TYPE_CHECKING:`` blocks included)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the kvref modules it imports at module level (parsed, not executed)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                # ``from kvref.interop import vllm`` imports a module, not a name.
                candidates = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                candidates = [a.name for a in node.names]
            targets.update(c for c in candidates if c in modules and c != name)
        graph[name] = targets
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` (iterative DFS, white/grey/black)."""
    state = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done
    for start in sorted(graph):
        if state[start]:
            continue
        path = [start]
        todo = [iter(sorted(graph[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt, 2) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif state.get(nxt, 2) == 0:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_find_cycle_sees_a_circle_and_its_absence() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_counts_type_checking_imports_but_not_function_bodies(
    tmp_path: Path,
) -> None:
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n"
        "def f():\n    from pkg.c import Y\n"
    )
    graph = import_graph({"pkg.a": a, "pkg.b": a, "pkg.c": a})
    assert graph["pkg.a"] == {"pkg.b"}


def test_no_import_circle_among_kvref_modules() -> None:
    graph = import_graph(MODULES)
    assert "kvref.specs" in graph and "kvref.config" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


_ISOLATED = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "kvref" or m.startswith("kvref.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_kvref_module_imports_on_its_own() -> None:
    # One interpreter (torch loads once), kvref purged before each module, so
    # each import starts from an empty kvref and sees only its own dependencies.
    names = [n for n in MODULES if n != "kvref.__main__"]
    done = subprocess.run(
        [sys.executable, "-c", _ISOLATED, *names], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _modules_after(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(done.stdout.split())


def test_import_kvref_does_not_import_torch() -> None:
    assert "torch" not in _modules_after("import kvref")


def test_planning_on_dtype_objects_does_not_import_torch_but_names_do() -> None:
    # Planning itself never needs torch; a dtype *name* must be resolved by it.
    plan = (
        "from kvref import plan_kv_cache, PlanningConfig, ReferenceKVCacheConfigBuilder\n"
        "from kvref import FullAttentionSpec, MambaSpec, SlidingWindowSpec, KVCacheLayout\n"
    )
    assert "torch" not in _modules_after(plan)
    assert "torch" in _modules_after(
        "from kvref import FullAttentionSpec\n"
        "FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype='bf16')"
    )


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse((ROOT / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module
                found.update((a.name, stmt.module) for a in stmt.names)
    return found


def test_public_surface_is_declared_once_consistently() -> None:
    homes = {name: module for module, names in kvref._HOMES.items() for name in names}
    assert _type_checking_imports() == homes
    assert set(kvref.__all__) == {*homes, "__version__"}
    assert len(kvref.__all__) == len(set(kvref.__all__))
    for name, module in homes.items():
        assert getattr(kvref, name) is getattr(sys.modules[module], name), name
    assert set(kvref.__all__) <= set(dir(kvref))


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = kvref.no_such_name
