"""The report viewer in headless Chromium: file size, time to first render, hover latency.

Two explain runs: a 128-token text on minilm-sentiment with the default methods, and a 1,024-token
text on smollm2-135m (30 layers x 9 heads) with attention and gradient x input (``--tiny-llama`` uses
a random-weight Llama of smollm2's shape instead, when the real model is too slow to run here).

    .venv/bin/python benchmarks/bench_viewer.py [--work runs/bench-viewer] [--skip-runs] [--tiny-llama]

Time to first render: navigation start to the page's ``data-ready`` mark (data decoded, every panel
drawn), median of 3 loads. Hover latency: from a synthetic mouseenter on a token to the end of the
next animation frame (the strip, raw numbers, head disagreement and matrix overlay all updated),
median over 20 tokens. Hover CPU: the renderer's main-thread CPU time per hover (Chrome's
Performance.getMetrics ``ThreadTime``, mean over the hovers), which a loaded machine inflates far less
than wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import text_of_length, threads  # noqa: E402

HOVER_JS = """async (n) => {
  const spans = Array.from(document.querySelectorAll('#tokens .tok'));
  const out = [];
  for (let k = 0; k < n; k++) {
    const s = spans[Math.floor((k + 0.5) * spans.length / n)];
    const t0 = performance.now();
    s.dispatchEvent(new MouseEvent('mouseenter'));
    await new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
    out.push(performance.now() - t0);
  }
  return out;
}"""


def make_runs(work: Path, tiny_llama: bool) -> dict[str, Path]:
    import streetlamp
    from streetlamp.commands.explain import ExplainSettings
    from streetlamp.commands.explain.run import default_methods, explain
    from streetlamp.store.run_folder import RunFolder

    out = {}
    threads()
    a = streetlamp.load("minilm-sentiment")
    out["minilm-128"] = work / "minilm-128"
    t0 = time.time()
    explain(
        a,
        ExplainSettings.from_values(text=text_of_length(a, 128), methods=default_methods()),
        RunFolder(out["minilm-128"], "explain", True),
    )
    print(f"explain minilm-sentiment, 128 tokens, {', '.join(default_methods())}: {time.time() - t0:.0f} s")
    if tiny_llama:
        from transformers import LlamaConfig, LlamaForCausalLM

        from streetlamp.models.adapter import ModelAdapter

        real = streetlamp.load("smollm2-135m")  # its tokenizer and config; small random weights
        cfg = LlamaConfig(
            **{
                **real.hf_model.config.to_dict(),
                "hidden_size": 72,
                "intermediate_size": 144,
                "num_key_value_heads": 3,
                "head_dim": 8,
            }
        )
        lm = ModelAdapter(LlamaForCausalLM(cfg).eval(), real.tokenizer, "tiny-llama-30x9")
        name = "tiny-llama-1024"
    else:
        lm, name = streetlamp.load("smollm2-135m"), "smollm2-1024"
    out[name] = work / name
    t0 = time.time()
    explain(
        lm,
        ExplainSettings.from_values(text=text_of_length(lm, 1024), methods=["attention", "gradient_x_input"]),
        RunFolder(out[name], "explain", True),
    )
    print(f"explain {lm.name}, 1024 tokens, attention + gradient_x_input: {time.time() - t0:.0f} s")
    return out


def measure(folder: Path, browser) -> dict[str, float]:
    from streetlamp.report.viewer import write_report

    t0 = time.time()
    path = write_report(folder)
    build = time.time() - t0
    loads, hovers, cpu = [], [], []
    for _ in range(3):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=300_000)
        loads.append(page.evaluate("performance.now()") / 1000)  # ms since navigation start, read at ready
        t0 = thread_time(cdp)
        hovers += page.evaluate(HOVER_JS, 20)
        cpu.append((thread_time(cdp) - t0) * 1000 / 20)
        page.close()
    return {
        "size_mb": path.stat().st_size / 1e6,
        "build_s": build,
        "first_render_s": statistics.median(loads),
        "hover_ms": statistics.median(hovers),
        "hover_p90_ms": sorted(hovers)[int(0.9 * len(hovers))],
        "hover_cpu_ms": statistics.median(cpu),
    }


def thread_time(cdp) -> float:
    """Seconds of CPU time the page's main thread has used."""
    return next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "ThreadTime")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="runs/bench-viewer")
    ap.add_argument("--skip-runs", action="store_true", help="reuse the run folders under --work")
    ap.add_argument("--tiny-llama", action="store_true", help="a random 30x9 Llama instead of smollm2-135m")
    args = ap.parse_args()
    work = Path(args.work)
    from tests.helpers.browser import ARGS, chromium_path, missing

    if missing():
        sys.exit(f"bench_viewer: {missing()}")
    runs = (
        {p.name: p for p in sorted(work.iterdir()) if (p / "manifest.json").exists()}
        if args.skip_runs
        else make_runs(work, args.tiny_llama)
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(
            f"{'run':<18}{'report.html':>12}{'build':>8}{'first render':>14}{'hover median':>14}{'hover p90':>11}{'hover CPU':>11}"
        )
        for name, folder in runs.items():
            r = measure(folder, b)
            print(
                f"{name:<18}{r['size_mb']:>10.2f}MB{r['build_s']:>7.1f}s{r['first_render_s']:>13.2f}s"
                f"{r['hover_ms']:>12.1f}ms{r['hover_p90_ms']:>9.1f}ms{r['hover_cpu_ms']:>9.1f}ms"
            )
        b.close()


if __name__ == "__main__":
    main()
