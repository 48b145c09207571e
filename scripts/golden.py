"""Golden outputs: run explain, evaluate, heads, patch, lens, circuit and atlas on tiny models with fixed seeds and
store every number their run folders hold, or compare two such stores (issue 36: the command-packages move must
leave every output unchanged).

    python scripts/golden.py record DIR     # run the commands with the source tree on sys.path, keep the numbers
    python scripts/golden.py compare A B    # every array and table of A equals B's (bit for bit; exit 1 if not)

The numbers kept: every tensor of every ``*.safetensors``, every column of every ``*.parquet`` / ``*.csv``, and the
manifest's parameters (timestamps, versions and paths removed). Same machine, same threads (OMP_NUM_THREADS=1):
the comparison is exact, because the move changes no arithmetic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = "the movie was not good but the acting was great and the plot was fun to watch today".split()


def setup(t: Path) -> dict[str, Path]:
    from streetlamp.models.tiny import save_tiny

    t.mkdir(parents=True, exist_ok=True)
    data = t / "d.csv"
    data.write_text(
        "text,label\n"
        + "\n".join(f"{WORDS[i]} {WORDS[i + 1]} {WORDS[i + 2]},{['neg', 'neu', 'pos'][i % 3]}" for i in range(8))
        + "\n"
    )
    pairs = t / "pairs.csv"
    pairs.write_text(
        "clean,corrupt,answer,wrong\nthe movie was good,the film was bad, good, bad\n"
        "when mary and john went,when john and mary went, mary, john\n"
    )
    return {
        "bert": save_tiny("bert", t / "bert", seed=1),
        "gpt2": save_tiny("gpt2", t / "gpt2", seed=1),
        "llama": save_tiny("llama", t / "llama", seed=1),
        "data": data,
        "pairs": pairs,
    }


def commands(s: dict[str, Path]) -> dict[str, list[str]]:
    m = lambda k: ["--model", str(s[k])]  # noqa: E731
    return {
        "explain": [
            "explain",
            "the movie was not good",
            *m("bert"),
            "--methods",
            "attention,rollout,occlusion,gradient_x_input,integrated_gradients,alti",
        ],
        "explain-llama": [
            "explain",
            "the movie was not",
            *m("llama"),
            "--methods",
            "attention,occlusion,gradient_x_input,attnlrp",
        ],
        "heads": ["heads", "--data", str(s["data"]), *m("bert")],
        "patch": ["patch", *m("gpt2"), "--clean", "when mary and john went", "--corrupt", "when john and mary went"],
        "evaluate": ["evaluate", *m("bert"), "--data", str(s["data"]), "--methods", "attention,gradient_x_input"]
        + ["--adv-steps", "2", "--permutations", "2", "--limit", "3", "--seed", "2"],
        "lens": ["lens", "when mary and john went", *m("llama"), "--head", "1.0", "--types-length", "4"]
        + ["--types-seqs", "1"],
        "circuit": ["circuit", *m("llama"), "--task", str(s["pairs"]), "--methods", "eap,exact"]
        + ["--sizes", "0.1,0.5,1", "--bootstrap", "5", "--seed", "3"],
        "atlas": ["atlas", *m("llama"), "--data", str(s["data"]), "--limit", "3", "--top-k", "1", "--seed", "1"],
    }


def numbers(folder: Path, root: Path | None = None) -> dict[str, object]:
    import numpy as np
    import pandas as pd
    from safetensors.numpy import load_file

    out: dict[str, object] = {}
    for f in sorted(folder.rglob("*")):
        rel = str(f.relative_to(folder))
        if f.suffix == ".safetensors":
            for k, v in load_file(f).items():
                out[f"{rel}:{k}"] = np.asarray(v)
        elif f.suffix in (".parquet", ".csv"):
            t = pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f)
            for c in t.columns:
                out[f"{rel}:{c}"] = t[c].to_numpy()
        elif f.name == "manifest.json":
            m = json.loads(f.read_text())
            p = json.dumps(m.get("parameters", m.get("settings")), sort_keys=True, default=str)
            out[f"{rel}:parameters"] = p.replace(str(root), "<root>") if root else p
    return out


def record(root: Path) -> None:
    import contextlib
    import io
    import shutil

    from streetlamp.cli import main

    s = setup(root / "inputs")
    for name, argv in commands(s).items():
        out = root / "runs" / name
        shutil.rmtree(out, ignore_errors=True)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main([*argv, "--out", str(out)])
        if rc != 0:
            raise SystemExit(f"{name}: exit {rc}")
        (root / f"{name}.txt").write_text(buf.getvalue())
        print(f"{name}: {len(numbers(out))} arrays/columns", flush=True)


def compare(a: Path, b: Path) -> int:
    import numpy as np

    bad = 0
    for name in sorted(p.name for p in (a / "runs").iterdir()):
        na, nb = numbers(a / "runs" / name, a), numbers(b / "runs" / name, b)
        if set(na) != set(nb):
            print(
                f"{name}: different contents: only in A {sorted(set(na) - set(nb))}, only in B {sorted(set(nb) - set(na))}"
            )
            bad += 1
        for k in sorted(set(na) & set(nb)):
            x, y = na[k], nb[k]
            same = x == y if isinstance(x, str) else (np.shape(x) == np.shape(y) and _eq(x, y))
            if not same:
                print(f"{name}: {k} differs")
                bad += 1
        print(f"{name}: {len(na)} compared")
    print("golden outputs identical" if bad == 0 else f"{bad} difference(s)")
    return 1 if bad else 0


def _eq(x: object, y: object) -> bool:
    import numpy as np

    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind in "fc":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x.astype(str), y.astype(str)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        raise SystemExit(__doc__)
