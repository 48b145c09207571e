"""Start-up: wall time and peak RSS of ``streetlamp --help`` and ``streetlamp explain --help``, this
tree against an older revision (default: the last commit before the command registry, whose CLI
imported torch and transformers to build its parser).

    python benchmarks/bench_startup.py [--old-rev REV | --old-src DIR] [--repeat 7]

Each measurement is a fresh interpreter (``os.wait4`` gives that child's own peak RSS); the median
over ``--repeat`` runs is printed with the 1-minute load average beside it (the machine is shared:
compare the two columns of one run, not runs of different days). Imports nothing heavy itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD_REV = "13163b7"  # before commands/: `streetlamp --help` imported torch and transformers
CASES = (["--help"], ["explain", "--help"])


def measure(src: Path, argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one ``streetlamp ARGV`` in a fresh interpreter on ``src``."""
    code = "import sys; from streetlamp.cli import main; sys.argv[0] = 'streetlamp'; main(sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"streetlamp {' '.join(argv)} on {src} exited {p.returncode}")
    return seconds, usage.ru_maxrss / 1024  # Linux: KiB


def old_tree(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` (git archive), without touching the work tree."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True).stdout
    tar = into / "old.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--old-src", default=None, help="an older tree's src/ folder instead of --old-rev")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(a.old_src) if a.old_src else old_tree(a.old_rev, Path(tmp))
        trees = {"now": ROOT / "src", f"old ({a.old_src or a.old_rev})": old}
        print(f"{'command':<24} {'tree':<18} {'wall s (median)':>16} {'peak RSS MiB':>13}  load avg (1 min)")
        for argv in CASES:
            for name, src in trees.items():
                measure(src, argv)  # warm the page cache
                runs = [measure(src, argv) for _ in range(a.repeat)]
                wall = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                load = os.getloadavg()[0]
                print(f"{'streetlamp ' + ' '.join(argv):<24} {name:<18} {wall:>16.3f} {rss:>13.0f}  {load:.2f}")


if __name__ == "__main__":
    main()
