"""Bounded mutation testing with mutmut: mutate only the given modules, run only the given test files.

    make mutate                                   # the src/streetlamp modules changed vs main
    make mutate MODULES=src/streetlamp/stats.py TESTS="tests/test_stats.py tests/evaluation/test_boundaries.py"

mutmut reads its settings from the pyproject.toml of the folder it runs in and copies the sources into
``mutants/``; so this builds a scratch folder with a copy of src/, the named test files (and the tests
package's helpers), and a ``[tool.mutmut]`` naming exactly those modules and tests, runs ``mutmut run``
there (one worker: CPU is scarce) and prints the count per outcome and every surviving mutant. Not part of
CI: a full run of the core takes hours. docs/developing.md records what was run and what survived.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ["__init__.py", "conftest.py", "browser.py", "peers.py"]


def changed_modules() -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", "main", "--", "src/streetlamp"], cwd=ROOT, capture_output=True, text=True
    )
    return [p for p in out.stdout.split() if p.endswith(".py") and (ROOT / p).is_file()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="*", default=None, help="files under src/streetlamp (default: changed vs main)")
    ap.add_argument("--tests", nargs="+", required=True, help="test files that drive those modules")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (mutmut show/browse there)")
    args = ap.parse_args()
    modules = args.modules if args.modules else changed_modules()
    if not modules:
        print("mutate: no module to mutate (none changed vs main; give MODULES=...)")
        return 0
    mutmut = shutil.which("mutmut", path=str(ROOT / ".venv" / "bin")) or shutil.which("mutmut")
    if mutmut is None:
        print("mutate: mutmut is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="streetlamp-mutate-"))
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (work / "tests").mkdir()
    for f in HELPERS + [Path(t).name for t in args.tests]:
        if (ROOT / "tests" / f).is_file():
            shutil.copy2(ROOT / "tests" / f, work / "tests" / f)
    cfg = {
        "source_paths": ["src/streetlamp/"],
        "only_mutate": modules,
        "pytest_add_cli_args_test_selection": [f"tests/{Path(t).name}" for t in args.tests],
        "process_isolation": "forkserver",  # torch is not fork-safe
    }
    toml = "[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items())
    (work / "pyproject.toml").write_text(toml)
    subprocess.run(["git", "init", "-q", "."], cwd=work, check=True)
    print(f"mutate: {', '.join(modules)} against {' '.join(args.tests)} in {work}", flush=True)
    subprocess.run([mutmut, "run", "--max-children", "1"], cwd=work, stdout=subprocess.DEVNULL)
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True)
    rows = [ln.strip().rsplit(": ", 1) for ln in res.stdout.splitlines() if ": " in ln]
    counts = Counter(status for _, status in rows)
    print("mutate: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    for name, status in rows:
        if status == "survived":
            print(f"  survived: {name}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
