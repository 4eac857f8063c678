"""Which top-level definitions of a vendor package a builder's code can call.

Reach over a vendor's builder counts the builder's own code.  A module of
the vendor's package often holds helpers for several builders (one for
GLM-5, one for DeepSeek-V4): a helper that none of this builder's code names
can never run for it, and counting it as unreached would say the run missed
code that is not the builder's.  This module follows names statically, from
the classes of the builder's MRO, to the module-level functions, classes and
assignments they name, and on through what those name, across the modules
of the package.

The rule is deliberately generous where Python is dynamic: a class counts
whole once it is named (its methods are dispatch targets, ``getattr(self,
...)`` included); an assignment counts what its value names (a registry
``dict`` of functions); a name a module takes from ``from m import *`` is
followed into ``m``.
Names that appear only in annotations do not count: a type named in a
signature is not code that runs.  What no code names (a function reached
only through ``globals()[...]``) is not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import attrs

__all__ = ["Callees", "callee_closure"]

#: A module-level definition: ``(module name, top-level name)``.
Key = tuple[str, str]
#: The whole module (a package's submodule imported as a name: ``from pkg import mod``).
WHOLE = "*"


@attrs.frozen
class Callees:
    """The closure's answer.

    Attributes:
        files: module name to its source file, for every module with a counted name.
        names: module name to the top-level names counted in it (``*``: all).
    """

    files: dict[str, Path]
    names: dict[str, frozenset[str]]


@attrs.define
class _Module:
    """One module's top-level names: what each refers to, and its import aliases."""

    name: str
    defs: dict[str, set[str]] = attrs.Factory(dict)
    #: Per definition, the ``alias.attr`` pairs it uses (module attributes).
    attrs_used: dict[str, set[tuple[str, str]]] = attrs.Factory(dict)
    #: Alias to ``(module, name)``; name ``None`` for ``import m as alias``.
    aliases: dict[str, tuple[str, str | None]] = attrs.Factory(dict)
    star: list[str] = attrs.Factory(list)


def _package_of(module_name: str, is_package: bool) -> str:
    return module_name if is_package else module_name.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")
    anchor = ".".join(parts[: len(parts) - node.level + 1])
    return f"{anchor}.{base}" if base else anchor


def _annotations(node: ast.AST) -> Iterator[ast.AST]:
    """The annotation subtrees directly under ``node`` (skipped: types never run)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.returns is not None:
            yield node.returns
    elif isinstance(node, ast.arg):
        if node.annotation is not None:
            yield node.annotation
    elif isinstance(node, ast.AnnAssign):
        yield node.annotation


def _uses(node: ast.AST) -> tuple[set[str], set[tuple[str, str]]]:
    """Names and ``name.attr`` pairs used in ``node``, annotations left out."""
    names: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        skip = {id(a) for a in _annotations(current)}
        if isinstance(current, ast.Name):
            names.add(current.id)
        elif isinstance(current, ast.Attribute) and isinstance(current.value, ast.Name):
            # ``mod.f`` names ``f`` of a module, not the whole module (see _Walker.targets).
            pairs.add((current.value.id, current.attr))
            skip.add(id(current.value))
        todo.extend(c for c in ast.iter_child_nodes(current) if id(c) not in skip)
    return names, pairs


def _top_statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, those under a top-level ``if``/``try`` included."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_statements([*stmt.body, *stmt.orelse])
        elif isinstance(stmt, ast.Try):
            handlers = [s for h in stmt.handlers for s in h.body]
            yield from _top_statements([*stmt.body, *handlers, *stmt.orelse, *stmt.finalbody])
        else:
            yield stmt


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        found = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        found = [stmt.target]
    else:
        return []
    names: list[str] = []
    for target in found:
        names.extend(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _parse(source: Path, module_name: str) -> _Module:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    package = _package_of(module_name, source.name == "__init__.py")
    module = _Module(module_name)
    for stmt in _top_statements(tree.body):
        if isinstance(stmt, ast.ImportFrom):
            base = _absolute(stmt, package)
            for alias in stmt.names:
                if alias.name == "*":
                    module.star.append(base)
                else:
                    module.aliases[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    module.aliases[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.partition(".")[0]
                    module.aliases[top] = (top, None)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names, pairs = _uses(stmt)
            module.defs[stmt.name] = names
            module.attrs_used[stmt.name] = pairs
        else:
            names, pairs = _uses(stmt)
            for target in _targets(stmt):
                module.defs.setdefault(target, set()).update(names)
                module.attrs_used.setdefault(target, set()).update(pairs)
    return module


@attrs.define
class _Walker:
    """The breadth-first walk over ``(module, name)`` keys inside one package."""

    top: str
    source_of: Callable[[str], Path | None]
    modules: dict[str, _Module | None] = attrs.Factory(dict)
    files: dict[str, Path] = attrs.Factory(dict)

    def module(self, name: str) -> _Module | None:
        if name not in self.modules:
            inside = name == self.top or name.startswith(f"{self.top}.")
            source = self.source_of(name) if inside else None
            self.modules[name] = None if source is None else _parse(source, name)
            if source is not None:
                self.files[name] = source
        return self.modules[name]

    def targets(self, key: Key) -> Iterator[Key]:
        """The keys a definition refers to."""
        module = self.module(key[0])
        if module is None:
            return
        if key[1] == WHOLE:
            yield from ((key[0], n) for n in module.defs)
            yield from ((key[0], a) for a in module.aliases)
            yield from ((s, WHOLE) for s in module.star)
            return
        if key[1] in module.aliases:
            # A re-export (``from .slots import pack`` in an ``__init__``) or a
            # name that is itself a submodule (``from . import slots``).
            base, name = module.aliases[key[1]]
            if name is None:
                return  # ``import m``: only its attributes used below count
            sub = f"{base}.{name}"
            yield (sub, WHOLE) if self.module(sub) is not None else (base, name)
            return
        for used in module.defs.get(key[1], ()):
            if used in module.defs or used in module.aliases:
                yield (key[0], used)
            else:
                # A name none of this module's statements define: from a star import.
                yield from ((s, used) for s in module.star)
        for base_name, attr in module.attrs_used.get(key[1], ()):
            yield from self._attribute(module, base_name, attr)

    def _attribute(self, module: _Module, base_name: str, attr: str) -> Iterator[Key]:
        """What ``base_name.attr`` in ``module`` names: ``attr`` of a module, else ``base_name``."""
        if base_name in module.aliases:
            base, name = module.aliases[base_name]
            target = base if name is None else f"{base}.{name}"
            if name is None or self.module(target) is not None:
                yield (target, attr)
                return
        if base_name in module.defs or base_name in module.aliases:
            yield (module.name, base_name)  # ``Plan.method``: the class (or an alias of one)
        else:
            yield from ((s, base_name) for s in module.star)


def callee_closure(
    roots: Sequence[Key], top: str, source_of: Callable[[str], Path | None]
) -> Callees:
    """The top-level definitions of package ``top`` that ``roots`` name, transitively.

    Args:
        roots: the builder's MRO classes inside the package, as ``(module, class)``.
        top: the vendor's top-level package; nothing outside it is followed.
        source_of: a module name's source file (``None``: not a source module).
    """
    walker = _Walker(top, source_of)
    seen: set[Key] = set()
    todo = list(roots)
    while todo:
        key = todo.pop()
        if key in seen or walker.module(key[0]) is None:
            continue
        seen.add(key)
        todo.extend(walker.targets(key))
    names: dict[str, set[str]] = {}
    for module_name, name in seen:
        module = walker.modules[module_name]
        # Aliases are bindings, not code of their own.
        if module is not None and (name == WHOLE or name in module.defs):
            names.setdefault(module_name, set()).add(name)
    return Callees(
        files={m: walker.files[m] for m in names},
        names={m: frozenset(n) for m, n in names.items()},
    )
