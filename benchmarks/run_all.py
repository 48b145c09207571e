"""Run every benchmark in turn (each prints ratios against its peer measured in the same process).

make bench        # or: .venv/bin/python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    ("bench_ig.py", ["--quick"]),
    ("bench_ig_nodes.py", ["--texts", "2"]),
    ("bench_ig_rules.py", ["--model", "minilm-sentiment"]),
    ("bench_occlusion.py", ["--repeat", "1"]),
    ("bench_flow.py", []),
    ("bench_decomposition.py", []),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for script, quick_args in BENCHES:
        print(f"\n=== {script} ===", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / script), *(quick_args if quick else [])])
        if rc:
            failed.append(script)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
