"""Re-introduce the bugs of issue 29 one at a time and check that a test fails for each.

Each mutant is a small, realistic bug in the numbers a user reads (a wrong layer, a missing final norm,
a neighbour's credit, the wrong labels, an off-by-one at a boundary), written as an exact text edit of
one file under src/streetlamp. For each, the script copies src/ to a temporary folder, applies the edit
(refusing if the text to replace is not found exactly ``count`` times: the code moved and the mutant needs
updating), runs the named test files against the copy (PYTHONPATH first, checked), and reports
``killed`` (pytest exit status 1: a test failed) or ``SURVIVED``. A first run without any edit must pass.

    /work/bin/cpu .venv/bin/python scripts/mutants_issue29.py            # all of them
    .venv/bin/python scripts/mutants_issue29.py --only lens_final_norm_last_row_only
    .venv/bin/python scripts/mutants_issue29.py --list

Exit status 0 when every mutant is killed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    issue_item: str  # the bug of issue 29 it stands for
    file: str  # relative to src/streetlamp
    old: str
    new: str
    tests: tuple[str, ...]
    count: int = 1  # how many occurrences of ``old`` are replaced (all must exist)


MUTANTS = [
    Mutant(
        "attention_wrong_layer",
        "the attention method reads the wrong layer",
        "methods/attention.py",
        "        l = self.layer % a.shape[0]\n        return {",
        "        l = (self.layer - 1) % a.shape[0]\n        return {",
        ("tests/methods/test_attention_views.py",),
    ),
    Mutant(
        "attention_head_max_is_a_mean",
        "head_max view",
        "methods/attention.py",
        '"head_max": lambda: a[l].max(0),',
        '"head_max": lambda: a[l].mean(0),',
        ("tests/methods/test_attention_views.py",),
    ),
    Mutant(
        "attention_layer_mean_is_one_layer",
        "layer_mean view",
        "methods/attention.py",
        '"layer_mean": lambda: a.mean((0, 1)),',
        '"layer_mean": lambda: a[l].mean(0),',
        ("tests/methods/test_attention_views.py",),
    ),
    Mutant(
        "explain_printed_tau_signed",
        "the printed Kendall tau",
        "commands/explain/run.py",
        "tau = kendall_tau(row, np.abs(delta), special)",
        "tau = kendall_tau(row, delta, special)",
        ("tests/commands/test_explain_numbers.py",),
    ),
    Mutant(
        "explain_special_share_mean",
        "the special-token share",
        "commands/explain/run.py",
        "{row[[j for j in range(len(row)) if j not in words]].sum():.0%}",
        "{row[[j for j in range(len(row)) if j not in words]].mean():.0%}",
        ("tests/commands/test_explain_numbers.py",),
    ),
    Mutant(
        "kendall_csv_keeps_special_tokens",
        "kendall_tau.csv",
        "report/compare.py",
        "names, tau = kendall_matrix(scores, exclude)",
        "names, tau = kendall_matrix(scores)",
        ("tests/commands/test_explain_numbers.py",),
    ),
    Mutant(
        "report_ranks_ascending",
        "the report's rank columns",
        "report/viewer/static/viewer.js",
        "const idx = v.map((x, i) => i).sort((a, b) => v[b] - v[a])",
        "const idx = v.map((x, i) => i).sort((a, b) => v[a] - v[b])",
        ("tests/report/test_report_stats_js.py", "tests/report/test_report_ranks_browser.py"),
    ),
    Mutant(
        "report_ranks_ties_not_shared",
        "the report's rank columns (ties)",
        "report/viewer/static/viewer.js",
        "for (let k = s; k <= e; k++) r[idx[k]] = (s + e) / 2 + 1;",
        "for (let k = s; k <= e; k++) r[idx[k]] = k + 1;",
        ("tests/report/test_report_stats_js.py", "tests/report/test_report_ranks_browser.py"),
    ),
    Mutant(
        "lens_final_norm_last_row_only",
        "the final norm applied only to the last lens row",
        "interventions/lens.py",
        "lg = readout(adapter, lens, r, fwd.cache[s][0])  # [pos, vocab]",
        "lg = readout(adapter, lens, r, fwd.cache[s][0]) if r == L else "
        "capped(adapter, fwd.cache[s][0].double() @ unembedding(adapter)[0].double().t())",
        ("tests/interventions/test_lens_rows.py",),
    ),
    Mutant(
        "dla_credited_to_neighbour_head",
        "each head's DLA credited to its neighbour",
        "interventions/lens.py",
        "            source[l] = direct(write(per_key)).cpu().numpy()\n",
        "            source[l] = direct(write(per_key)).cpu().numpy()\n"
        "            heads[l], source[l] = np.roll(heads[l], 1), np.roll(source[l], 1, 0)\n",
        ("tests/interventions/test_lens_rows.py",),
    ),
    Mutant(
        "adversarial_js_summed_over_heads",
        "adversarial attention's JS",
        "evaluation/counterfactual.py",
        "js = js_divergence_t(new, orig).mean(-1)",
        "js = js_divergence_t(new, orig).sum(-1)",
        ("tests/evaluation/test_adversarial_numbers.py",),
    ),
    Mutant(
        "adversarial_tvd_softmax_over_batch",
        "adversarial attention's TVD",
        "evaluation/counterfactual.py",
        "y = proj(torch.softmax(at_least_float32(logits), -1))",
        "y = proj(torch.softmax(at_least_float32(logits), 0))",
        ("tests/evaluation/test_adversarial_numbers.py",),
    ),
    Mutant(
        "evaluate_agreement_keeps_special_tokens",
        "evaluate's agreement tau",
        "evaluation/pipeline.py",
        "pairwise_taus({n: scores[n][b] for n in s.methods}, specials[b])",
        "pairwise_taus({n: scores[n][b] for n in s.methods}, np.zeros_like(specials[b]))",
        ("tests/evaluation/test_evaluate_agreement.py",),
    ),
    Mutant(
        "probe_control_scored_against_task_labels",
        "the probe's control accuracy (one function for the results and the sweep since issue 35)",
        "probing/control.py",
        "acc_t, acc_c = pt.accuracy(X[te], y[te]), pc.accuracy(X[te], yc[te])",
        "acc_t, acc_c = pt.accuracy(X[te], y[te]), pc.accuracy(X[te], y[te])",
        ("tests/probing/test_probe_control.py",),
    ),
    Mutant(
        "kendall_tau_needs_three_items",
        "boundary: Kendall tau at n = 2",
        "stats.py",
        "if a.size < 2 or np.all(a == a[0])",
        "if a.size < 3 or np.all(a == a[0])",
        ("tests/evaluation/test_boundaries.py",),
    ),
    Mutant(
        "iou_half_is_not_a_match",
        "boundary: IOU of exactly 0.5",
        "evaluation/plausibility.py",
        ">= 0.5 for",
        "> 0.5 for",
        ("tests/evaluation/test_boundaries.py",),
        count=2,
    ),
]


def run_tests(src: Path, tests: tuple[str, ...], timeout: int) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
    py = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
    where = subprocess.run(
        [py, "-c", "import streetlamp; print(streetlamp.__file__)"], env=env, capture_output=True, text=True
    )
    if not where.stdout.strip().startswith(str(src)):
        raise SystemExit(f"the copy is not imported first: streetlamp is {where.stdout.strip()} ({where.stderr})")
    cmd = [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timeout"
    tail = [ln for ln in p.stdout.splitlines() if ln.strip()][-1:] or [""]
    return p.returncode, tail[0]


def apply(src: Path, m: Mutant) -> None:
    path = src / "streetlamp" / m.file
    text = path.read_text(encoding="utf-8")
    found = text.count(m.old)
    if found != m.count:
        raise SystemExit(f"{m.name}: {m.old!r} occurs {found} times in {m.file}, expected {m.count}: update the mutant")
    path.write_text(text.replace(m.old, m.new), encoding="utf-8")


def main(mutants: list[Mutant] | None = None, doc: str | None = None) -> int:
    """Run ``mutants`` (default: this issue's); ``doc``: the calling script's docstring, for ``--help``."""
    mutants = MUTANTS if mutants is None else mutants
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    args = ap.parse_args()
    chosen = [m for m in mutants if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:<42} {m.file:<32} {m.issue_item}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        clean = Path(tmp) / "clean"
        shutil.copytree(ROOT / "src", clean, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        tests = tuple(sorted({t for m in chosen for t in m.tests}))
        rc, tail = run_tests(clean, tests, args.timeout)
        if rc != 0:
            print(f"baseline: the tests fail without any mutant (exit {rc}: {tail})")
            return 1
        print(f"baseline: {tail}")
        survived = []
        for m in chosen:
            src = Path(tmp) / m.name
            shutil.copytree(clean, src)
            apply(src, m)
            t0 = time.time()
            rc, tail = run_tests(src, m.tests, args.timeout)
            verdict = "killed" if rc == 1 else "SURVIVED" if rc == 0 else f"error (exit {rc})"
            if rc != 1:
                survived.append(m.name)
            print(f"{verdict:<10} {m.name:<42} {time.time() - t0:6.1f}s  {tail}", flush=True)
            shutil.rmtree(src)
        print(
            f"{len(chosen) - len(survived)} of {len(chosen)} mutants killed"
            + (f"; not: {survived}" if survived else "")
        )
        return 0 if not survived else 1


if __name__ == "__main__":
    raise SystemExit(main())
