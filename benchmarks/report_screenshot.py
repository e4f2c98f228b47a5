"""Take the README's screenshot of a sweep's report in a headless Chromium (tests/browser.py).

Opens the report (default: results/default/report.html, what `make run` writes) at a fixed window
width, and saves a PNG of the page from its top down to the end of its first model × dataset's charts
(at most --max-height pixels), or of --height pixels when given. Prints the PNG's size: the README's
copy should stay under 300 kB. Fails when the page logs an error or asks for anything but its own file.

    make run && .venv/bin/python benchmarks/report_screenshot.py                # → docs/report-screenshot.png
    .venv/bin/python benchmarks/report_screenshot.py results/seeds/report.html --out /tmp/seeds.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/browser.py: the CDP client lives with the tests, not in the package

from tests.browser import Browser, find_chromium  # noqa: E402

# the bottom of the first section's legend (or of its first charts), else of the summary
BOTTOM = """(() => {
  const mark = document.querySelector('#pair-1 .legend') || document.querySelector('#pair-1 .charts')
    || document.querySelector('#summary');
  return Math.ceil(mark.getBoundingClientRect().bottom + scrollY + 16);
})()"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, default=REPO / "results" / "default" / "report.html")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "report-screenshot.png")
    parser.add_argument("--width", type=int, default=1200, help="window width in CSS pixels (default 1200)")
    parser.add_argument("--height", type=int, help="height of the shot (default: down to the first charts)")
    parser.add_argument("--max-height", type=int, default=2000, help="the longest shot taken (default 2000)")
    args = parser.parse_args()
    binary = find_chromium()
    if binary is None:
        sys.exit("report_screenshot: no Chromium found (apt-get install chromium-headless-shell)")
    if not args.report.exists():
        sys.exit(f"report_screenshot: no report at {args.report} (run `make run` first)")
    url = args.report.resolve().as_uri()
    with Browser(binary, width=args.width, height=900) as browser:
        browser.open(url)
        height = args.height or min(browser.evaluate(BOTTOM), args.max_height)
        png = browser.screenshot({"x": 0, "y": 0, "width": args.width, "height": height})
        problems = browser.problems(url)
    if problems:
        sys.exit("report_screenshot: the page reported problems:\n" + "\n".join(problems))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png)
    print(f"{args.out}: {args.width}×{height} px, {len(png) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
