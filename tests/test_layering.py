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
]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_does_not_import_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{module} imports torch"


def test_plan_and_report_commands_do_not_import_torch(tmp_path):
    code = (
        "import sys; from ddlbench.cli import main; main(['-q', 'plan', '--format', 'ids']); "
        "sys.exit('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, "planning imported torch"
