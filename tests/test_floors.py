"""The package's floors (docs/developing.md, /work/shared/DESIGN.md "Floors"): every import, function-level
and ``if TYPE_CHECKING:`` ones included, goes to the same floor or a lower one, and the whole import graph,
lazy imports counted, has no circle. Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so
each import also counts as an import of the packages above its target (not those above the importer: they
are already being imported when it runs), and a circle through a package's ``__init__`` shows. A lazy import
is for start-up time (the CLI's ``--help`` never imports torch), never to dodge a cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.test_imports import modules  # the package's modules by dotted name, one reader for both tests

# The written floor list: a top-level module or package of streetlamp -> its floor.
FLOORS: dict[str, int] = {
    **dict.fromkeys(["errors", "version", "stats", "results", "batching", "progress", "specs"], 1),
    **dict.fromkeys(["extras", "readings"], 1),
    # settings: parses without a model, but its checks name ModelAdapter (validate(adapter)): level with models
    **dict.fromkeys(["models", "store", "settings"], 2),
    **dict.fromkeys(["methods", "data"], 3),
    **dict.fromkeys(["evaluation", "interventions", "cot", "features"], 4),
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


def imports(name: str, path: Path, known: set[str], type_checking: bool = False) -> dict[str, int]:
    """streetlamp modules imported anywhere in ``name`` (outside ``if TYPE_CHECKING:``, or also there with
    ``type_checking``) -> a line number. ``from . import x`` names the module ``x`` when it is one, else the
    package. Each import also names the packages above its target (their ``__init__`` runs first), except
    the root package and the packages above ``name`` itself (see :func:`implicit`)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_checking:
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
    for target, line in list(found.items()):
        for parent in implicit(name, target, known):
            found.setdefault(parent, line)
    return found


ROOT = "streetlamp"


def implicit(importer: str, target: str, known: set[str]) -> list[str]:
    """The packages whose ``__init__`` an import of ``target`` runs besides ``target``: every package above
    it, less those above ``importer`` (already imported before ``importer`` runs) and the root package,
    whose ``__init__`` imports only floor-1 modules when it runs (its other names are looked up lazily on
    a user's attribute access, never by an import; checked by
    :func:`test_the_root_package_imports_only_floor_1_when_it_runs`)."""
    parts = target.split(".")
    above_importer = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    return [
        p
        for p in (".".join(parts[:i]) for i in range(2, len(parts)))
        if p in known and p not in above_importer and p != ROOT
    ]


def floor(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    if top not in FLOORS:
        raise AssertionError(f"{module} is on no floor: add its top-level name to FLOORS (and docs/developing.md)")
    return FLOORS[top]


def graph(type_checking: bool = False) -> dict[str, dict[str, int]]:
    mods = modules()
    return {m: imports(m, p, set(mods), type_checking) for m, p in mods.items()}


def test_every_import_goes_down_or_level() -> None:
    """``if TYPE_CHECKING:`` imports included: an annotation naming a higher floor's type is an upward
    dependency too."""
    bad = [
        f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)}) at line {line}"
        for m, targets in graph(type_checking=True).items()
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


def test_the_root_package_imports_only_floor_1_when_it_runs() -> None:
    """What :func:`implicit` leaves out: the root ``__init__``'s module-level imports are floor 1 (its other
    imports sit in ``__getattr__``), so running it as the parent of any module imports nothing above that."""
    mods = modules()
    tree = ast.parse(mods[ROOT].read_text())
    run = {m for m, _ in imports(ROOT, mods[ROOT], set(mods)).items()}
    top = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            top.add(f"{ROOT}.{node.module}" if node.module else ROOT)
    assert top and top <= run and all(floor(m) == 1 for m in top), top


def test_the_import_reader_counts_the_packages_above_a_target(tmp_path: Path) -> None:
    """``from .commands.serve import x`` in a module of ``serve``: also an import of ``commands`` (its
    ``__init__`` runs), but not of ``serve`` nor of the root package."""
    p = tmp_path / "m.py"
    p.write_text("from ..commands.circuit.run import x\n")
    known = {
        "streetlamp",
        "streetlamp.commands",
        "streetlamp.commands.circuit",
        "streetlamp.commands.circuit.run",
        "streetlamp.serve",
        "streetlamp.serve.app",
    }
    found = imports("streetlamp.serve.app", p, known)
    assert set(found) == {"streetlamp.commands.circuit.run", "streetlamp.commands.circuit", "streetlamp.commands"}
    g = {m: set() for m in known} | {"streetlamp.serve.app": set(found), "streetlamp.commands": {"streetlamp.serve"}}
    g["streetlamp.serve"] = {"streetlamp.serve.app"}
    assert cycles(g) == [["streetlamp.commands", "streetlamp.serve", "streetlamp.serve.app"]]
    # the same import from a module inside commands/circuit does not count its own packages
    found = imports("streetlamp.commands.circuit.view", p, known | {"streetlamp.commands.circuit.view"})
    assert "streetlamp.commands" not in found and "streetlamp.commands.circuit" not in found


def test_the_import_reader_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The checks above can fail: a function-level import is read, a TYPE_CHECKING one is not."""
    p = tmp_path / "m.py"
    p.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runners import explain\n"
        "def f():\n    from .cli import main\n    return main\n"
    )
    known = {"streetlamp.cli", "streetlamp.runners.explain", "streetlamp.runners", "streetlamp.stats"}
    found = imports("streetlamp.stats", p, known)
    assert set(found) == {"streetlamp.cli"} and floor("streetlamp.cli") > floor("streetlamp.stats")
    # the floor check reads the TYPE_CHECKING block too (with the package above its target)
    found = imports("streetlamp.stats", p, known, type_checking=True)
    assert set(found) == {"streetlamp.cli", "streetlamp.runners.explain", "streetlamp.runners"}
