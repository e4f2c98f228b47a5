"""The report in a real browser: a headless Chromium (tests/browser.py) opens a report rendered from a small
synthetic sweep and finds no error, no request beyond the page's own file, charts that are drawn and fit the
page, and tables that sort by a figure's value when a heading is clicked.

Skipped without Chromium (Debian: `apt-get install chromium-headless-shell`) unless
DDLBENCH_REQUIRE_CHROMIUM=1, which makes a missing Chromium a failure.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest

from ddlbench.analysis.aggregate import build_table
from ddlbench.records import write_record
from ddlbench.report.render import render_report
from tests.browser import Browser, colour_census, find_chromium, png_pixels
from tests.test_aggregate import plan_of, record_for, write

WIDTH, HEIGHT = 1280, 900
# throughputs whose text order differs from their numeric order (1000 < 150 < 90 as text)
SPEEDS = {("ddp", 1): 90.0, ("ddp", 2): 150.0, ("ddp", 4): 1000.0, ("zero2", 1): 80.0, ("zero2", 2): 140.0}
SPEEDS |= {("zero2", 4): 250.0}


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("DDLBENCH_REQUIRE_CHROMIUM") == "1":
            pytest.fail("DDLBENCH_REQUIRE_CHROMIUM=1 but no Chromium: apt-get install chromium-headless-shell")
        pytest.skip("no Chromium installed (apt-get install chromium-headless-shell)")
    return binary


@pytest.fixture
def report(tmp_path):
    """A report of ddp and zero2 on 1, 2 and 4 nodes, two repetitions each, one repetition failed."""
    plan = plan_of(tmp_path, strategies=["ddp", "zero2"], nodes=[1, 2, 4], repetitions=2)
    records = [record_for(p, SPEEDS[(p.strategy, p.nodes)] * (1 + 0.01 * p.repetition)) for p in plan.points]
    records = [replace(r, metrics=replace(r.metrics, tensor_peak_bytes=(40 + r.point.nodes) * 2**20)) for r in records]
    failed = next(i for i, p in enumerate(plan.points) if p.strategy == "zero2" and p.nodes == 4 and p.repetition)
    records[failed] = record_for(plan.points[failed], status="failed")
    write(plan, records)
    path = tmp_path / "report.html"
    path.write_text(render_report(plan.config, build_table(plan), report_dir=tmp_path))
    return path


def _column(browser: Browser, table: str, heading: str) -> list[str]:
    """The texts of a column of a table (a CSS selector), found by its heading's text."""
    return browser.evaluate(
        f"""(() => {{
          const table = document.querySelector({table!r});
          const headings = [...table.tHead.rows[0].cells].map(th => th.textContent);
          const index = headings.findIndex(text => text === {heading!r});
          if (index < 0) throw new Error('no heading ' + {heading!r});
          return [...table.tBodies[0].rows].map(row => row.cells[index].textContent);
        }})()"""
    )


def _click(browser: Browser, table: str, heading: str) -> None:
    browser.evaluate(
        f"""[...document.querySelector({table!r}).tHead.rows[0].cells]
              .find(th => th.textContent === {heading!r}).click()"""
    )


def _leading_number(text: str) -> float:
    return float(re.match(r"[\d.]+", text).group())


def test_the_report_draws_its_charts_and_sorts_its_tables_in_a_real_browser(chromium, report, tmp_path):
    url = report.as_uri()
    with Browser(chromium, width=WIDTH, height=HEIGHT) as browser:
        browser.open(url)

        # the charts exist, are drawn with a size, and lie within the page's width
        boxes = browser.evaluate(
            "[...document.querySelectorAll('svg.chart')].map(svg => { const r = svg.getBoundingClientRect();"
            " return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height,"
            " marks: svg.querySelectorAll('circle').length}; })"
        )
        assert len(boxes) == 4, boxes  # throughput, speedup, efficiency, memory
        for box in boxes:
            assert box["width"] > 200 and box["height"] > 100 and box["x"] >= 0, box
            assert box["x"] + box["width"] <= WIDTH, box
        assert boxes[0]["marks"] == 6  # two strategies at three node counts
        assert browser.evaluate("document.documentElement.scrollWidth") <= WIDTH  # nothing overflows the page

        # a screenshot of the first chart is not blank: lines, marks, text and grid in several colours
        first = boxes[0]
        png = browser.screenshot({k: first[k] for k in ("x", "y", "width", "height")})
        width, height, _ = png_pixels(png)
        assert (width, height) == (round(first["width"]), round(first["height"]))
        colours, inked = colour_census(png)
        assert colours >= 20 and inked > 0.03, (colours, inked)
        assert len(png_pixels(browser.screenshot())[2]) == HEIGHT  # the first screen, at the fixed size

        # the configurations' table (drawn by the page's script) sorts by a figure's value, not its text
        table = "#pair-1 table.data"
        _click(browser, table, "Throughput (samples/s)")
        ascending = [_leading_number(text) for text in _column(browser, table, "Throughput (samples/s)")]
        assert ascending == sorted(ascending) and ascending[-1] == pytest.approx(1005, rel=0.01), ascending
        _click(browser, table, "Throughput (samples/s)")
        descending = [_leading_number(text) for text in _column(browser, table, "Throughput (samples/s)")]
        assert descending == sorted(ascending, reverse=True)
        _click(browser, table, "Nodes")
        assert _column(browser, table, "Nodes") == ["1", "1", "2", "2", "4", "4"]

        # a table written into the page (the best strategy per scale) sorts too, by its cells' values
        _click(browser, "#best", "Throughput (samples/s)")
        best = [_leading_number(text) for text in _column(browser, "#best", "Throughput (samples/s)")]
        assert best == sorted(best) and len(best) == 3, best

        # filtering the points' table keeps the matching rows
        browser.evaluate(
            "(() => { const input = document.querySelector('#points input[type=search]');"
            " input.value = 'failed'; input.dispatchEvent(new Event('input')); })()"
        )
        statuses = _column(browser, "#points table.data", "Status")
        assert statuses == ["failed"], statuses

        # at 1200 px the summary table is read without scrolling: it fits its box, its figures wrap
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1200, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        fit = browser.evaluate(
            "(() => { const t = document.querySelector('#best');"
            " return {table: t.scrollWidth, box: t.parentElement.clientWidth}; })()"
        )
        assert fit["table"] <= fit["box"], fit

        # at a narrow width the page still fits: tables scroll inside their own boxes
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 700, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        assert browser.evaluate("document.documentElement.scrollWidth") <= 700

        assert browser.problems(url) == []  # no console error or warning, exception, or request elsewhere


def test_a_missing_chromium_is_named(monkeypatch):
    """find_chromium looks on PATH, headless shell first; with none, the module's fixture skips or fails."""
    monkeypatch.setenv("PATH", "/nonexistent")
    import tests.browser as browser_module

    monkeypatch.setattr(browser_module, "DEBIAN_SHELL", browser_module.Path("/nonexistent/chromium"))
    assert find_chromium() is None


def test_a_record_written_by_hand_reaches_the_browser_escaped(chromium, tmp_path):
    """A reason carrying markup shows as text in the page's tables, and runs nothing."""
    from ddlbench.records import record_path
    from tests.test_records import sample_record

    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1, 2])
    ok, failed = plan.points
    write(plan, [record_for(ok)])
    evil = "</script><script>document.title='owned'</script><img src=x onerror=\"document.title='owned'\">"
    record = replace(sample_record("failed"), point=failed, point_id=failed.point_id, reason=evil)
    write_record(record_path(plan.config.sweep_dir, failed.point_id), record)
    path = tmp_path / "report.html"
    path.write_text(render_report(plan.config, build_table(plan)))
    with Browser(chromium, width=WIDTH, height=HEIGHT) as browser:
        browser.open(path.as_uri())
        assert browser.evaluate("document.title") == "ddlbench report: agg"
        reasons = _column(browser, "#points table.data", "Reason")
        assert evil in reasons
        assert browser.evaluate("document.querySelectorAll('img').length") == 0
        assert browser.problems(path.as_uri()) == []
