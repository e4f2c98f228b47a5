"""No torch on the login node (issue 30, item 3): `plan`, `submit`, `status`, `rerun`, `report` and `fit`
run with torch unimportable and still predict, from the model tables shipped with the package or left in
the sweep's folder by a point's rank 0 (ddlbench.analysis.analytic.table_cache); the shipped tables are
what the code builds now, and read back exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from ddlbench.analysis.analytic.table_cache import (
    REGENERATE,
    SHIPPED_DIR,
    SWEEP_TABLES,
    read_table,
    shipped_entries,
    table_key,
    table_text,
)
from ddlbench.catalog.model_table import ModelTable
from ddlbench.config import load_sweep_config
from ddlbench.launch.runner import rank_dir_for
from ddlbench.launch.worker import _keep_model_table, sweep_dir_of
from ddlbench.records import read_record, record_path
from ddlbench.sweep import expand_sweep
from tests.conftest import REPO, make_point, run_cli
from tests.test_aggregate import record_for, write

MACHINE = str(REPO / "workflow" / "machines" / "abci_v100.yaml")
BLOCKED = "torch blocked for this test"
# installed first on sys.meta_path: refuses torch and every torch.* module, in every Python process
BLOCKER = f"""\
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError({BLOCKED!r})
        return None


sys.meta_path.insert(0, NoTorch())
"""
# the tables that take a second or more to build on a 2-core machine; the quick tests check their siblings
# (same builders) and mobilenet_v2 on one dataset
SLOW_TABLES = {"resnet152", "resnet50", "wide_resnet50_2", "wide_resnet101_2", "gpt_small", "gpt_medium", "gpt_large"}


def _slow(model: str, dataset: str) -> bool:
    return model in SLOW_TABLES or (model == "mobilenet_v2" and dataset != "cifar10")


@pytest.fixture
def no_torch(tmp_path) -> dict[str, str]:
    """The environment of a process that cannot import torch: a sitecustomize first on PYTHONPATH."""
    folder = tmp_path / "no-torch"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def test_the_blocker_makes_torch_unimportable(no_torch):
    saved = {name: module for name, module in sys.modules.items() if name == "torch" or name.startswith("torch.")}
    namespace: dict = {}
    exec(BLOCKER, namespace)  # in this process too, torch's modules set aside meanwhile
    blocker = sys.meta_path[0]
    try:
        for name in saved:
            del sys.modules[name]
        with pytest.raises(ImportError, match=BLOCKED):
            import torch
        with pytest.raises(ImportError, match=BLOCKED):
            import torch.nn  # noqa: F401
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(saved)
    # and in a process with the environment the commands below run in
    result = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                            env={**os.environ, **no_torch})  # fmt: skip
    assert result.returncode != 0 and BLOCKED in result.stderr, result.stderr


def sweep_with_records(write_sweep, **extra):
    """ddp and zero2 over 1, 2 and 4 nodes on a datasheet machine, with records of all points but the last."""
    path = write_sweep(
        models=["resnet8"], datasets=["cifar10"], strategies=["ddp", "zero2"], nodes=[1, 2, 4], repetitions=2,
        steps=5, warmup_steps=1, oversubscribe=True, machine=MACHINE, **extra,
    )  # fmt: skip
    plan = expand_sweep(load_sweep_config(path))
    write(plan, [record_for(p, 100.0 * p.nodes * (1 + 0.01 * p.repetition)) for p in plan.points[:-1]])
    return path, plan


def run(no_torch, *args: str) -> str:
    result = run_cli(*args, env=no_torch, timeout=300)
    assert result.returncode == 0, f"ddlbench {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def test_login_commands_run_and_predict_without_torch(write_sweep, no_torch):
    path, plan = sweep_with_records(write_sweep)
    sweep, folder, last = ["--configfile", str(path)], plan.config.sweep_dir, plan.points[-1]
    count = len(plan.points)

    assert last.point_id in run(no_torch, "plan", *sweep, "--format", "ids")
    # packing: each point's time predicted on the machine file (a model table is needed for that)
    assert "expected times: predicted on" in run(no_torch, "plan", *sweep, "--pack", "auto")
    assert f"{count} points: {count - 1} ok, 1 not started" in run(no_torch, "status", *sweep)
    # progress: the time left predicted for the point not run (it would say "no predictions" else)
    watched = run(no_torch, "status", *sweep, "--watch", "--no-queue", "--interval", "0.05")
    assert "left (predicted)" in watched, watched

    run(no_torch, "report", *sweep)
    predictions = pd.read_csv(folder / "predictions.csv")
    assert len(predictions) == count and (predictions["step_time_s"] > 0).all()
    assert "Predicted beside measured" in (folder / "report.html").read_text()
    assert "over nodes" in run(no_torch, "fit", *sweep)

    # rerun, without a cluster: here. Its progress predicts; the point's ranks cannot import torch either
    rerun = run(no_torch, "rerun", *sweep, "--status", "missing", "--local")
    assert "left (predicted)" in rerun, rerun
    record = read_record(record_path(folder, last.point_id))
    assert record.status == "failed" and BLOCKED in record.reason

    # submit, without a cluster: every point has a record now, so it submits nothing and finishes the sweep
    (folder / "predictions.csv").unlink()
    assert "every point" in run(no_torch, "submit", *sweep)
    assert len(pd.read_csv(folder / "predictions.csv")) == count


def test_options_not_shipped_are_read_from_the_sweep_folder_a_point_left_them_in(write_sweep, no_torch):
    path, plan = sweep_with_records(write_sweep, model_options={"resnet8": {"norm": "group"}})
    sweep, folder = ["--configfile", str(path)], plan.config.sweep_dir
    # not shipped (norm=group is not resnet8's default) and not kept yet: no prediction, and why
    packed = run(no_torch, "plan", *sweep, "--pack", "auto")
    assert "not predicted (no model table of resnet8 on cifar10 with norm=group" in packed
    assert f"leaves the table in {folder / SWEEP_TABLES}" in packed
    reported = run(no_torch, "report", *sweep)
    assert "no predictions: no model table of resnet8 on cifar10 with norm=group" in reported
    assert not (folder / "predictions.csv").exists()

    # what rank 0 of a point does once it trained (with torch, as on a compute node)
    point = plan.points[0]
    _keep_model_table(point, rank_dir_for(record_path(folder, point.point_id)), rank=0)
    assert (folder / SWEEP_TABLES / "resnet8-cifar10-norm=group.json").is_file()
    assert "expected times: predicted on" in run(no_torch, "plan", *sweep, "--pack", "auto")
    watched = run(no_torch, "status", *sweep, "--watch", "--no-queue", "--interval", "0.05")
    assert "left (predicted)" in watched, watched


def test_rank_zero_keeps_only_tables_the_package_does_not_ship(tmp_path):
    sweep_dir = tmp_path / "results" / "tiny"
    shipped, other = make_point(), make_point(model_options=(("norm", "group"),))
    rank_dir = rank_dir_for(record_path(sweep_dir, other.point_id))
    assert sweep_dir_of(rank_dir) == sweep_dir
    assert sweep_dir_of(tmp_path / "elsewhere" / "record.json.ranks") is None
    kept = sweep_dir / SWEEP_TABLES

    _keep_model_table(other, rank_dir, rank=1)
    _keep_model_table(shipped, rank_dir_for(record_path(sweep_dir, shipped.point_id)), rank=0)
    _keep_model_table(other, tmp_path / "elsewhere" / "record.json.ranks", rank=0)
    assert not kept.exists()
    _keep_model_table(other, rank_dir, rank=0)
    (table,) = kept.iterdir()
    assert table.name == "resnet8-cifar10-norm=group.json"
    assert read_table(table, "resnet8", "cifar10", (("norm", "group"),)).options == (("norm", "group"),)


def test_without_torch_a_missing_table_is_an_error_naming_it_and_how_to_get_it(no_torch, tmp_path):
    code = (
        "from pathlib import Path\n"
        "from ddlbench.analysis.analytic.table_cache import find_table\n"
        "from ddlbench.errors import DdlbenchError\n"
        "assert find_table('resnet8', 'cifar10').model == 'resnet8'  # shipped\n"
        f"try:\n    find_table('resnet8', 'mnist', {{'norm': 'group'}}, sweep_dir=Path({str(tmp_path)!r}))\n"
        "except DdlbenchError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **no_torch})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no model table of resnet8 on mnist with norm=group" in result.stdout
    assert f"compute node: its rank 0 leaves the table in {tmp_path / SWEEP_TABLES}" in result.stdout


def test_the_shipped_tables_are_every_builtin_model_on_its_datasets_at_default_options():
    wanted = {f"{table_key(*entry)}.json" for entry in shipped_entries()}
    assert {path.name for path in SHIPPED_DIR.glob("*.json")} == wanted, f"run `{REGENERATE}`"


def test_the_shipped_tables_read_back_exactly():
    """JSON gives back every figure as written (ints stay ints); written again, a table is the same text."""
    for model, dataset, options in shipped_entries():
        path = SHIPPED_DIR / f"{table_key(model, dataset, options)}.json"
        table = read_table(path, model, dataset, options)
        assert table is not None, path
        assert table_text(table) == path.read_text(), path
        assert ModelTable.from_json(json.loads(table_text(table))) == table
        assert all(type(row.forward_flops) is int and type(row.saved_bytes) is int for row in table.layers)


@pytest.mark.parametrize(
    ("model", "dataset", "options"),
    [
        pytest.param(*entry, marks=pytest.mark.slow if _slow(*entry[:2]) else (), id=f"{entry[0]}-{entry[1]}")
        for entry in shipped_entries()
    ],
)
def test_a_shipped_table_is_what_the_code_builds_now(model, dataset, options):
    from ddlbench.train.introspect import build_model_table  # torch

    shipped = read_table(SHIPPED_DIR / f"{table_key(model, dataset, options)}.json", model, dataset, options)
    built = build_model_table(model, dataset, dict(options))
    assert shipped == built, (
        f"the shipped table of {model} on {dataset} (torch {shipped and shipped.torch_version}) is not what torch "
        f"{built.torch_version} builds now: run `{REGENERATE}`"
    )
