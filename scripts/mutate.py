"""Bounded mutation testing with mutmut: mutate only the given modules, run only the given test files.

    make mutate MODULES=src/streetlamp/stats.py TESTS="tests/test_stats.py tests/evaluation/test_boundaries.py"
    make mutate                                   # the src/streetlamp modules changed vs main (none on main)

mutmut reads its settings from the pyproject.toml of the folder it runs in and copies the sources into
``mutants/``; so this builds a scratch folder with a copy of src/ and of tests/ whole (test files import
helpers from sub-packages and conftest.py files at every level), the project's pyproject.toml with a
``[tool.mutmut]`` naming exactly those modules and test files appended, runs ``mutmut run`` there (one
worker: CPU is scarce) and prints the count per outcome and every surviving mutant.

Exit status: 0 when mutmut ran and checked every mutant (survivors are reported, not an error), 2 for a
wrong argument (no module, a module or test file that does not exist), 1 when mutmut failed or left mutants
unchecked (its log's tail is printed and the scratch folder kept). Not part of CI: a full run of the core
takes hours. docs/developing.md records what was run and what survived.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DONE = {"killed", "survived", "no tests", "timeout", "suspicious", "segfault", "skipped", "caught by type check"}


def changed_modules() -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", "main", "--", "src/streetlamp"], cwd=ROOT, capture_output=True, text=True
    )
    return [p for p in out.stdout.split() if p.endswith(".py") and (ROOT / p).is_file()]


def check_args(modules: list[str], tests: list[str]) -> str | None:
    """The one-line complaint about the arguments, or None."""
    if not modules:
        return "no module to mutate (none changed vs main): name one, e.g. make mutate MODULES=src/streetlamp/stats.py"
    for m in modules:
        p = Path(m)
        if p.parts[:2] != ("src", "streetlamp") or p.suffix != ".py" or not (ROOT / p).is_file():
            return f"MODULES: {m} is not a .py file under src/streetlamp"
    for t in tests:
        p = Path(t)
        if p.parts[:1] != ("tests",) or not (ROOT / p).exists():
            return f"TESTS: {t} is not a test file or folder under tests/"
    return None


def scratch(modules: list[str], tests: list[str]) -> Path:
    """A folder holding src/, tests/ and a pyproject.toml whose [tool.mutmut] names ``modules`` and ``tests``."""
    work = Path(tempfile.mkdtemp(prefix="streetlamp-mutate-"))
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    shutil.copytree(ROOT / "src", work / "src", ignore=skip)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=skip)
    cfg = {
        "source_paths": ["src/streetlamp/"],
        "only_mutate": modules,
        "pytest_add_cli_args_test_selection": tests,
        "process_isolation": "forkserver",  # torch is not fork-safe
    }
    toml = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    toml += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items())
    (work / "pyproject.toml").write_text(toml, encoding="utf-8")
    subprocess.run(["git", "init", "-q", "."], cwd=work, check=True)
    return work


def tail(path: Path, n: int = 30) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r", "\n")  # progress lines end in \r
    spinner = tuple(chr(c) for c in range(0x2800, 0x2900))  # mutmut's progress spinner (braille)
    return "\n".join([ln for ln in text.splitlines() if ln.strip() and not ln.startswith(spinner)][-n:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="*", default=None, help="files under src/streetlamp (default: changed vs main)")
    ap.add_argument("--tests", nargs="+", required=True, help="test files (paths under tests/) that drive them")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (mutmut show/browse there)")
    args = ap.parse_args(argv)
    modules = args.modules if args.modules else changed_modules()
    bad = check_args(modules, args.tests)
    if bad:
        print(f"mutate: {bad}", file=sys.stderr)
        return 2
    mutmut = shutil.which("mutmut", path=str(ROOT / ".venv" / "bin")) or shutil.which("mutmut")
    if mutmut is None:
        print("mutate: mutmut is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 2
    work = scratch(modules, args.tests)
    log = work / "mutmut-run.log"
    print(f"mutate: {', '.join(modules)} against {' '.join(args.tests)} in {work}", flush=True)
    t0 = time.time()
    with log.open("w") as f:
        run = subprocess.run([mutmut, "run", "--max-children", "1"], cwd=work, stdout=f, stderr=subprocess.STDOUT)
    res = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, capture_output=True, text=True)
    rows = [ln.strip().rsplit(": ", 1) for ln in res.stdout.splitlines() if ": " in ln]
    counts = Counter(status for _, status in rows)
    print(
        f"mutate: {len(rows)} mutants in {time.time() - t0:.0f} s: "
        + ", ".join(f"{n} {s}" for s, n in counts.most_common())
    )
    for name, status in rows:
        if status == "survived":
            print(f"  survived: {name}")
    unchecked = sum(n for s, n in counts.items() if s not in DONE)
    failed = run.returncode != 0 or res.returncode != 0 or not rows or unchecked
    if failed:
        why = f"mutmut run exited {run.returncode}" if run.returncode else ""
        why = why or ("no mutant was made" if not rows else f"{unchecked} mutants not checked")
        print(f"mutate: FAILED ({why}); the last lines of {log}:\n{tail(log)}", file=sys.stderr)
        print(f"mutate: the scratch folder is kept: {work}", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
