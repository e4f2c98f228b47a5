"""Torch stays off the planning and report path: login nodes plan fast, and the report env has no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIGHT_MODULES = [
    "ddlbench.cli",
    "ddlbench.config",
    "ddlbench.sweep",
    "ddlbench.records",
    "ddlbench.metrics",
    "ddlbench.analysis.aggregate",
    "ddlbench.report.render",
    "ddlbench.launch.runner",
    "ddlbench.anatomy.figures",
    "ddlbench.anatomy.timeline",
    "ddlbench.calibrate.runner",
    "ddlbench.calibrate.machine",
    "ddlbench.calibrate.report",
    "ddlbench.calibrate.suite",  # the workflow's common.smk reads suites on the login node
    "ddlbench.analysis.analytic.predict",  # the model table is built (with torch) only when one is needed
    "ddlbench.analysis.analytic.oracle",
    "ddlbench.analysis.analytic.render",
    "ddlbench.report.predicted",
]
# empirical models and sampling: numpy only (checked in one interpreter: each import is a second or so)
LIGHT_EMPIRICAL = [
    "ddlbench.analysis.empirical.modelling",
    "ddlbench.analysis.empirical.extrapolation",
    "ddlbench.analysis.empirical.cheapest",
    "ddlbench.analysis.empirical.holdout",
    "ddlbench.sampling.plan",
    "ddlbench.sampling.summary",
    "ddlbench.report.scaling",
    "ddlbench.cli.scaling",
    "ddlbench.cli.internal",
    # certification and history: pandas and the standard library (sqlite3)
    "ddlbench.cli.certify",
    "ddlbench.cli.history",
    "ddlbench.certify.figures",
    "ddlbench.certify.certificate",
    "ddlbench.certify.run",
    "ddlbench.certify.suite",
    "ddlbench.history.store",
    "ddlbench.history.compare",
]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_does_not_import_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{module} imports torch"


def test_the_empirical_modules_do_not_import_torch():
    code = f"import sys, {', '.join(LIGHT_EMPIRICAL)}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "an empirical module imports torch"


def test_plan_aggregate_and_report_commands_do_not_import_torch(tmp_path):
    table, csv, html = tmp_path / "t.parquet", tmp_path / "t.csv", tmp_path / "r.html"
    code = (
        "import sys; from ddlbench.cli import main\n"
        "assert main(['-q', 'plan', '--format', 'ids']) == 0\n"
        f"assert main(['-q', 'aggregate', '--parquet', '{table}', '--csv', '{csv}']) == 0\n"
        f"assert main(['-q', 'report', '--table', '{table}', '--out', '{html}']) == 0\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or "the commands imported torch"
    assert "<svg" in html.read_text()
