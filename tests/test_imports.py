"""Import structure: no circle among kvref's modules (imports inside functions included),
the kit's circles pinned, each kvref module imports on its own, ``import kvref``
stays light (no torch), and the lazy public surface is consistent."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

import conformance
import kvref

ROOT = Path(kvref.__file__).parent
KIT = Path(conformance.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
KIT_MODULES = {_module_name(p): p for p in sorted(KIT.rglob("*.py"))}


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


def _all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import, those inside function bodies included (a circle through one is a circle)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph(
    modules: Mapping[str, Path], *, function_level: bool = False
) -> dict[str, set[str]]:
    """Module -> the given modules it imports (parsed, not executed).

    Module-level imports only, unless ``function_level``.
    """
    graph: dict[str, set[str]] = {}
    found = _all_imports if function_level else _module_level_imports
    for name, path in modules.items():
        targets: set[str] = set()
        for node in found(ast.parse(path.read_text())):
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


def test_import_graph_counts_function_bodies_when_asked(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from pkg.c import Y\n")
    assert import_graph({"pkg.a": a, "pkg.c": a}, function_level=True)["pkg.a"] == {"pkg.c"}


def circles(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """The graph's import circles: its strongly connected components of two modules or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # Tarjan's algorithm, iterative: (node, its remaining successors).
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_circles_are_the_strongly_connected_parts() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert sorted(map(sorted, circles(graph))) == [["a", "b"], ["c", "d"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("function_level", [False, True])
def test_no_import_circle_among_kvref_modules(function_level: bool) -> None:
    graph = import_graph(MODULES, function_level=function_level)
    assert "kvref.specs" in graph and "kvref.config" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_the_kit_has_no_import_circle() -> None:
    graph = import_graph(KIT_MODULES, function_level=True)
    assert "conformance.check.catalog" in graph
    assert circles(graph) == []


#: The kit's layers, lowest first: a module imports only from its own layer or
#: below (imports inside functions included).  The checks read observations,
#: never the code that makes them; the harness is all that calls a builder;
#: a scenario composes harness calls; the run deals scenarios' examples; the
#: front ends drive runs.
KIT_LAYERS = (
    (
        "conformance.errors",
        "conformance.contract",
        "conformance.upstream",
        "conformance.flags",
        # What the extensions add to the catalog and the scenarios: names, no imports.
        "conformance.extensions.contributions",
    ),
    ("conformance.check",),
    ("conformance.generate",),
    ("conformance.report",),
    ("conformance.harness",),
    ("conformance.scenarios",),
    ("conformance.run",),
    # The run's optional mechanisms, told of its phases by hooks (extensions/base.py).
    ("conformance.extensions",),
    # The run's driver and its text report: call the extensions' hooks, through
    # their registry alone.
    (
        "conformance.run.judging",
        "conformance.run.findings",
        "conformance.run.runner",
        "conformance.report.render",
    ),
    (
        # The CI post-processors, and the documented paths kept for two of them.
        "conformance.ci",
        "conformance.expectations",
        "conformance.report.html",
        "conformance.plugin_xdist",
    ),
    ("conformance.cli_parser", "conformance.cli", "conformance.plugin"),
    ("conformance", "conformance.test_conformance"),
)


def layer_of(module: str, layers: Sequence[Sequence[str]] = KIT_LAYERS) -> int:
    """The rank of ``module``'s layer: its longest matching package or module name."""
    best, rank = -1, -1
    for i, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    if rank < 0:
        raise LookupError(f"{module} is in no layer of KIT_LAYERS")
    return rank


def upward_imports(
    graph: Mapping[str, set[str]], layers: Sequence[Sequence[str]] = KIT_LAYERS
) -> list[str]:
    """Every import of a module from a layer above its own, as ``a -> b``."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target, layers) > layer_of(module, layers)
    )


def test_upward_imports_are_seen() -> None:
    layers = (("pkg.low",), ("pkg.high",), ("pkg",))
    graph = {"pkg.low.a": {"pkg.high.b"}, "pkg.high.b": {"pkg.low.c"}, "pkg.low.c": set()}
    assert upward_imports(graph, layers) == ["pkg.low.a -> pkg.high.b"]
    assert layer_of("pkg.other", layers) == 2


def test_no_kit_module_imports_from_a_layer_above_its_own() -> None:
    graph = import_graph(KIT_MODULES, function_level=True)
    assert upward_imports(graph) == []


#: What the run's core may import of the extensions: their protocol and their lists.
EXTENSION_PROTOCOL = frozenset(
    {
        "conformance.extensions",
        "conformance.extensions.base",
        "conformance.extensions.contributions",
        "conformance.extensions.registry",
    }
)


def extensions_named(
    graph: Mapping[str, set[str]], layers: Sequence[Sequence[str]] = KIT_LAYERS
) -> list[str]:
    """Every import of an extension by name from the run's core, as ``a -> b``.

    The core is every module outside ``conformance.extensions`` up to the
    run's driver (``conformance.run.runner``'s layer); the front ends above
    it may name an extension (a flag's parser, a merge of its fields).
    """
    driver = layer_of("conformance.run.runner", layers)
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith("conformance.extensions") and layer_of(module, layers) <= driver
        for target in targets
        if target.startswith("conformance.extensions.") and target not in EXTENSION_PROTOCOL
    )


def test_an_extension_named_by_the_core_is_seen() -> None:
    graph = {
        "conformance.run.runner": {"conformance.extensions.registry"},
        "conformance.run.judging": {"conformance.extensions.waste", "conformance.check.core"},
        "conformance.extensions.registry": {"conformance.extensions.waste"},
        "conformance.cli": {"conformance.extensions.waste.meter"},
    }
    assert extensions_named(graph) == ["conformance.run.judging -> conformance.extensions.waste"]


def test_the_core_never_imports_an_extension_by_name() -> None:
    graph = import_graph(KIT_MODULES, function_level=True)
    assert "conformance.extensions.registry" in graph
    assert extensions_named(graph) == []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [a.name for a in node.names]


def test_kvref_never_imports_the_kit() -> None:
    found = sorted(
        f"{name}: {target}"
        for name, path in MODULES.items()
        for node in _all_imports(ast.parse(path.read_text()))
        for target in _imported(node)
        if target.split(".")[0] == "conformance"
    )
    assert found == []


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


def test_a_name_listed_under_two_homes_fails_the_import() -> None:
    source = (ROOT / "__init__.py").read_text()
    twice = source.replace(
        '"kvref.hisparse": ("resolve_hisparse_specs",)',
        '"kvref.hisparse": ("resolve_hisparse_specs", "plan_kv_cache")',
    )
    assert twice != source
    exec(compile(source, "kvref/__init__.py", "exec"), {"__name__": "kvref_copy"})
    with pytest.raises(ImportError, match="listed under two modules"):
        exec(compile(twice, "kvref/__init__.py", "exec"), {"__name__": "kvref_copy"})


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = kvref.no_such_name


def _public_names(module: str) -> set[str] | None:
    """A kvref module's ``__all__``; ``None`` for a module that declares none."""
    names = getattr(importlib.import_module(module), "__all__", None)
    return None if names is None else set(names)


def _is_public_module(module: str) -> bool:
    if any(part.startswith("_") for part in module.split(".")):
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def private_kvref_uses(source: str) -> list[str]:
    """The kvref names ``source`` uses that are not public.

    Public: a name in its module's ``__all__``, or a module none of whose
    dotted parts starts with ``_``.  Read are ``from kvref.x import name`` and
    attributes of a kvref module bound by ``import`` or ``from ... import``.
    """
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the kvref module it is
    used: list[tuple[int, str, str]] = []  # (line, module, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvref":
            base = node.module or ""
            if not _is_public_module(base):
                parent, _, last = base.rpartition(".")
                used.append((node.lineno, parent, last))
                continue
            for alias in node.names:
                if _is_public_module(f"{base}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
                else:
                    used.append((node.lineno, base, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvref":
                    if not _is_public_module(alias.name):
                        parent, _, last = alias.name.rpartition(".")
                        used.append((node.lineno, parent, last))
                    elif alias.asname or alias.name == "kvref":
                        modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            if module is not None and not _is_public_module(f"{module}.{node.attr}"):
                used.append((node.lineno, module, node.attr))
    return [
        f"line {line}: {module}.{name}"
        for line, module, name in used
        if name not in (_public_names(module) or set())
    ]


def test_private_kvref_uses_are_seen() -> None:
    source = (
        "import kvref.planning as planning\n"
        "from kvref import PlanningConfig, planning as p2\n"
        "from kvref.planning import plan_kv_cache, _merge_workers\n"
        "from kvref.interop import vllm as iv\n"
        "from kvref._config_fields import FIELDS\n"
        "planning.plan_kv_cache, planning._admit, iv.quiet_vllm, iv._hidden, p2.WorkerPlan\n"
    )
    assert private_kvref_uses(source) == [
        "line 3: kvref.planning._merge_workers",
        "line 5: kvref._config_fields",
        "line 6: kvref.planning._admit",
        "line 6: kvref.interop.vllm._hidden",
    ]


def test_the_kit_uses_only_kvrefs_public_names() -> None:
    found = [
        f"{path.relative_to(KIT.parent)}: {use}"
        for path in KIT_MODULES.values()
        for use in private_kvref_uses(path.read_text())
    ]
    assert found == []
