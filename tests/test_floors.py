"""The package's floors (docs/developing.md, /work/shared/DESIGN.md "Floors"): every import, function-level
ones included (only ``if TYPE_CHECKING:`` blocks are exempt), goes to the same floor or a lower one, and the
whole import graph, lazy imports counted, has no circle. A lazy import is for start-up time (the CLI's
``--help`` never imports torch), never to dodge a cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.test_imports import modules  # the package's modules by dotted name, one reader for both tests

# The written floor list: a top-level module or package of streetlamp -> its floor.
FLOORS: dict[str, int] = {
    **dict.fromkeys(["errors", "version", "stats", "results", "batching", "progress", "specs", "settings"], 1),
    **dict.fromkeys(["extras", "readings"], 1),
    **dict.fromkeys(["models", "store"], 2),
    **dict.fromkeys(["methods", "data"], 3),
    **dict.fromkeys(["evaluation", "interventions", "cot"], 4),
    **dict.fromkeys(["groundtruth", "report"], 5),
    "probing": 6,
    "commands": 7,  # one package per command (commands/<x>/), serve among them
    **dict.fromkeys(["cli", "api", "__main__", ""], 8),  # "": the package itself (its lazy front door)
}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """streetlamp modules imported anywhere in ``name`` (outside ``if TYPE_CHECKING:``) -> a line number.
    ``from . import x`` names the module ``x`` when it is one, else the package."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    visit_one(c)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.name != name:
                    found.setdefault(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                target = f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                if target in known and target != name:
                    found.setdefault(target, node.lineno)
        visit(node)

    visit(tree)
    return found


def floor(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    if top not in FLOORS:
        raise AssertionError(f"{module} is on no floor: add its top-level name to FLOORS (and docs/developing.md)")
    return FLOORS[top]


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_import_goes_down_or_level() -> None:
    bad = [
        f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
        for m, targets in graph().items()
        for t, line in sorted(targets.items())
        if floor(t) > floor(m)
    ]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g[v]:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(g)))
    try:
        for v in sorted(g):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_import_circle_counting_lazy_imports() -> None:
    g = {m: set(t) for m, t in graph().items()}
    assert not cycles(g), f"import circles (lazy imports counted): {cycles(g)}"


@pytest.mark.parametrize(
    "edges, want",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"a"}}, [["a"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_the_circle_finder_finds_circles(edges: dict[str, set[str]], want: list[list[str]]) -> None:
    assert sorted(cycles(edges)) == want


def test_the_import_reader_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The checks above can fail: a function-level import is read, a TYPE_CHECKING one is not."""
    p = tmp_path / "m.py"
    p.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runners import explain\n"
        "def f():\n    from .cli import main\n    return main\n"
    )
    known = {"streetlamp.cli", "streetlamp.commands.explain.run", "streetlamp.runners", "streetlamp.stats"}
    found = imports("streetlamp.stats", p, known)
    assert set(found) == {"streetlamp.cli"} and floor("streetlamp.cli") > floor("streetlamp.stats")
