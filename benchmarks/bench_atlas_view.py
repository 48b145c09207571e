"""The atlas view's budget on a finished run (issue 25 item 5: the whole atlas of SmolLM2 over 2,000 sequences
under 50 MB, a head's panel decoded in under 100 ms in headless Chromium).

Prints the sizes of ``report.html``, ``atlas.parquet``, ``heads.csv`` and ``arrays.safetensors``, the time
from opening ``report.html`` (file://) to the page being ready, and the panel time the page itself
measures (``window.streetlamp.atlasPanelMs``: from the click to the panel drawn, the head's patterns
inflated and decoded included) for ``--heads`` heads of the finder; writes a screenshot of the scatter
and of one head's panel to ``--shots`` when given.

    /work/bin/cpu .venv/bin/python benchmarks/bench_atlas_view.py RUN [--heads 20] [--shots DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--shots", default=None)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from streetlamp.report.viewer import write_report
    from tests.helpers.browser import ARGS, chromium_path

    run = Path(args.run)
    report = write_report(run)
    for f in ("report.html", "atlas.parquet", "heads.csv", "arrays.safetensors"):
        print(f"{f}: {(run / f).stat().st_size / 1e6:.2f} MB")
    total = sum(p.stat().st_size for p in run.rglob("*") if p.is_file() and "parts" not in p.parts)
    print(f"run folder without parts/: {total / 1e6:.1f} MB")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        page = b.new_page(viewport={"width": 1300, "height": 1000})
        t0 = time.perf_counter()
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=300_000)
        page.wait_for_selector("#atlas-scatter[data-points]", timeout=300_000)
        print(f"page ready: {time.perf_counter() - t0:.2f} s")
        if args.shots:
            page.locator("#atlas-scatter").locator(
                "xpath=ancestor-or-self::div[contains(@class,'panel')][1]"
            ).screenshot(path=str(Path(args.shots) / "atlas_scatter.png"))
        rows = page.locator("#atlas-heads tbody tr")
        ms = []
        for k in range(min(args.heads, rows.count())):
            page.evaluate(
                "document.getElementById('atlas-panel') && document.getElementById('atlas-panel').removeAttribute('data-ms')"
            )
            rows.nth(k).click()
            page.wait_for_selector("#atlas-panel[data-ms]")
            ms.append(float(page.evaluate("window.streetlamp.atlasPanelMs")))
        print(
            f"panel decode + draw over {len(ms)} heads: median {np.median(ms):.1f} ms, max {max(ms):.1f} ms "
            f"(first {ms[0]:.1f} ms)"
        )
        if args.shots:
            page.locator("#atlas-panel").screenshot(path=str(Path(args.shots) / "atlas_panel.png"))
        b.close()


if __name__ == "__main__":
    main()
