"""Screenshots of report views for the docs, taken in headless Chromium (Debian's, via Playwright).

    .venv/bin/python scripts/viewer_screenshots.py RUN_FOLDER NAME [--token I] [--element CSS] [--click CSS]
        [--out docs/figures]

writes OUT/viewer_NAME.png (the top of the page, after clicking token I in an explain view, or the
panel holding the element ``--element`` after clicking ``--click``) and, for an explain run,
OUT/viewer_NAME_compare.png (the "light versus use" panel).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("name")
    ap.add_argument("--token", type=int, default=None)
    ap.add_argument("--fragment", default="")
    ap.add_argument("--element", default=None, help="CSS selector: screenshot the panel that holds it")
    ap.add_argument("--click", default=None, help="CSS selector clicked first (e.g. an example row)")
    ap.add_argument("--out", default="docs/figures")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from streetlamp.report.viewer import write_report
    from tests.helpers.browser import ARGS, chromium_path

    path = write_report(Path(args.folder))
    out = Path(args.out)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=ARGS)
        page = b.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(path.resolve().as_uri() + args.fragment)
        page.wait_for_selector("body[data-ready='1']", timeout=300_000)
        if args.token is not None:
            page.click(f"#tokens .tok[data-i='{args.token}']")
        if args.click:
            page.click(args.click)
        if args.element:
            panel = page.locator(args.element).first.locator("xpath=ancestor-or-self::div[contains(@class,'panel')][1]")
            panel.screenshot(path=str(out / f"viewer_{args.name}.png"))
        else:
            page.screenshot(path=str(out / f"viewer_{args.name}.png"))
        if page.locator("#compare").count():
            page.locator("#compare").locator("xpath=..").screenshot(path=str(out / f"viewer_{args.name}_compare.png"))
        b.close()
    print(f"wrote {out}/viewer_{args.name}*.png")


if __name__ == "__main__":
    main()
