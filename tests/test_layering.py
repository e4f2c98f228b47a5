"""The house's layers: each module imports only from its own layer and the ones below it; and torch stays
off the planning and report path (login nodes plan fast, and the report env has no torch).

The layers, from the bottom up (LAYERS below; a module's layer is that of its longest listed prefix):

 1. base: the package's version, errors, atomic writes, work over forked processes, statistics, the
    templates' environment;
 2. catalog: models, datasets, strategies by name, and their facts (a model's table of layers too);
 3. config: a sweep's schema and its validated, frozen form (the adaptive key included);
 4. plan: a point, why a combination cannot run, a sweep expanded into points;
 5. records: the versioned records a point, a launch and a rank write, and their provenance. They sit
    below train, not above it: the ranks write records.RankResult, so the record types are the contract
    between a rank and everything that reads what it measured;
 6. train: what runs on a rank: the kernel, strategies, models, data, the recorder of a step's inside
    (train.recording), a calibration point and its microbenchmarks (train.calibration);
 7. analysis: figures from records: a point's metrics (metrics.py, analysis.inside), the aggregated
    table, the analytical model and the machine file it reads (analysis.machine), empirical models,
    verdicts. Below launch: a launch computes the point's metrics as it writes its record, and packs
    points into allocations by the analytical model's predicted times;
 8. launch: local processes, srun inside an allocation, mpirun, submitit, packed allocations;
 9. report and history: the HTML report, and the results database with the named figures it keeps
    (history.figures, which certificates judge too);
10. orchestration: what runs the layers below for one purpose: a calibration (calibrate: its suite,
    runs and report), the adaptive sweep (sampling), certification (certify), finishing a sweep
    (finish), and the checks every workflow makes first (preflight);
11. cli: the `ddlbench` command.

Imports inside functions count: a deferred import is still an import of that layer. No module is exempt.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PACKAGE = Path(__file__).resolve().parents[1] / "ddlbench"
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "ddlbench",
            "ddlbench.errors",
            "ddlbench.atomic",
            "ddlbench.parallel",
            "ddlbench.statistics",
            "ddlbench.templating",
        ),
    ),
    ("catalog", ("ddlbench.catalog",)),
    ("config", ("ddlbench.config",)),
    ("plan", ("ddlbench.point", "ddlbench.validity", "ddlbench.sweep")),
    ("records", ("ddlbench.records", "ddlbench.launches", "ddlbench.provenance")),
    ("train", ("ddlbench.train",)),
    ("analysis", ("ddlbench.analysis", "ddlbench.metrics")),
    ("launch", ("ddlbench.launch",)),
    ("report", ("ddlbench.report", "ddlbench.history")),
    (
        "orchestration",
        ("ddlbench.calibrate", "ddlbench.sampling", "ddlbench.certify", "ddlbench.finish", "ddlbench.preflight"),
    ),
    ("cli", ("ddlbench.cli", "ddlbench.__main__")),
)

LIGHT_MODULES = [
    "ddlbench.cli",
    "ddlbench.config",
    "ddlbench.sweep",
    "ddlbench.records",
    "ddlbench.metrics",
    "ddlbench.analysis.aggregate",
    "ddlbench.report.render",
    "ddlbench.launch.runner",
    "ddlbench.launch.progress",  # the progress line of submit, rerun, certify, calibrate and status --watch
    "ddlbench.launch.disk_status",
    "ddlbench.finish",
    "ddlbench.analysis.inside.figures",
    "ddlbench.analysis.inside.timeline",
    "ddlbench.launch.calibration",
    "ddlbench.analysis.machine.machine_file",
    "ddlbench.analysis.machine.layer_timings",
    "ddlbench.train.calibration.point",  # the worker's spec, read where suites expand
    "ddlbench.train.calibration.records",
    "ddlbench.catalog.model_table",
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
    "ddlbench.history.figures",
    "ddlbench.certify.certificate",
    "ddlbench.certify.run",
    "ddlbench.certify.suite",
    "ddlbench.history.store",
    "ddlbench.history.compare",
]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _layer(module: str) -> int | None:
    """The index in LAYERS of the module's longest listed prefix (`ddlbench` itself: the package only)."""
    best, length = None, -1
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            matches = module == name or (name != "ddlbench" and module.startswith(name + "."))
            if matches and len(name) > length:
                best, length = index, len(name)
    return best


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every ddlbench module `module` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known)
    return {name for name in found if name == "ddlbench" or name.startswith("ddlbench.")}


def test_every_module_has_a_layer():
    missing = [module for module in _modules() if _layer(module) is None]
    assert not missing, f"give these modules a layer in LAYERS (tests/test_layering.py): {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    modules = _modules()
    upward = []
    for module, path in modules.items():
        own = _layer(module)
        for target in sorted(_imports(module, path, set(modules))):
            layer = _layer(target)
            if own is not None and layer is not None and layer > own:
                upward.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer][0]})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_does_not_import_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{module} imports torch"


def test_the_empirical_modules_do_not_import_torch():
    code = f"import sys, {', '.join(LIGHT_EMPIRICAL)}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "an empirical module imports torch"


def test_plan_and_report_commands_do_not_import_torch(tmp_path):
    html = tmp_path / "r.html"
    sweep = tmp_path / "sweep.yaml"
    default = yaml.safe_load((PACKAGE.parent / "workflow" / "config" / "default.yaml").read_text())
    sweep.write_text(yaml.safe_dump(default | {"results_dir": str(tmp_path / "results")}))  # the default, kept here
    code = (
        "import sys; from ddlbench.cli import main\n"
        f"assert main(['-q', 'plan', '--format', 'ids', '--configfile', '{sweep}']) == 0\n"
        f"assert main(['-q', 'report', '--configfile', '{sweep}', '--no-history', '--out', '{html}']) == 0\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or "the commands imported torch"
    assert "<svg" in html.read_text()
