"""The package's import graph: no cycle among module-level imports, report/ never imports commands/,
and every module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import streetlamp

SRC = Path(streetlamp.__file__).parent


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = ("streetlamp",) + p.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: set[str], top_level_only: bool) -> set[str]:
    """streetlamp modules imported by ``name`` (module level only, or anywhere)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # `if TYPE_CHECKING:` imports are not run
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_import_cycle() -> None:
    mods = modules()
    graph = {m: imports(m, p, set(mods), top_level_only=True) for m, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n) :] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert (
        "streetlamp.commands.explain.run" in graph and graph["streetlamp.commands.explain.run"]
    )  # the parser sees imports


def test_report_does_not_import_commands() -> None:
    mods = modules()
    for m, p in mods.items():
        if m.startswith("streetlamp.report"):
            bad = {i for i in imports(m, p, set(mods), top_level_only=False) if i.startswith("streetlamp.commands")}
            assert not bad, f"{m} imports {bad}"


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """Leaves first (reverse order), so a module that only works after another imported it fails here."""
    mods = sorted((m for m in modules() if not m.endswith("__main__")), reverse=True)
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    r = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_no_import_cycle_in_models_counting_function_level_imports() -> None:
    """models/ (and store/, which reads its recordings) import in one direction even counting the imports
    inside functions: a lazy import there is for start-up time, never to close a circle. Only imports under
    ``if TYPE_CHECKING:`` are left out (they never run)."""
    mods = {m: p for m, p in modules().items() if m.startswith(("streetlamp.models", "streetlamp.store"))}
    graph = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        hidden = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)
        }
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if id(node) in hidden or not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            found |= {t for t in targets if t in mods and t != m}
        graph[m] = found
    assert graph["streetlamp.models.chunked"] and graph["streetlamp.models.adapter"]  # the parser sees imports
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        for n in sorted(graph[m]):
            if n in path:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n) :] + [n]))
            if n not in done:
                visit(n, path + [n])
        done.add(m)

    for m in sorted(graph):
        visit(m, [m])
