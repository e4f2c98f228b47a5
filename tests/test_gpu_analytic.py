"""benchmarks/gpu_analytic.py and the CUDA memory terms it fits (ddlbench.analysis.analytic.memory, "On CUDA").

- the terms change predictions on a CUDA machine only: a CPU machine predicts exactly as before with them;
- the fit recovers known terms and leaves each model out in turn;
- the script's CPU smoke run (`--device cpu --quick`) calibrates, runs its points and scores them, and
  `--rescore` reproduces the same accuracies from the saved files (folder and .tar.gz);
- a layer_timings entry's `ranks` makes a one-rank point (a host with one GPU);
- on a GPU (marked `gpu`, skipped without CUDA), the smoke run's points ran on CUDA, the operators' batch norms
  included, and the held-out predictions carry the CUDA terms.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.memory import (
    CudaMemoryTerms,
    fit_cuda_terms,
    largest_call_bytes,
    parameter_rounding_bytes,
)
from ddlbench.analysis.analytic.predict import introspected_table, predict, resolved_options

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_analytic.py"
TERMS = CudaMemoryTerms(fixed_bytes=64 * 2**20, per_call_byte=1.5)


def machine(kind: str, terms: CudaMemoryTerms | None) -> MachineModel:
    """A small measured-looking machine (rates only) of device `kind`, with `terms`."""
    data = {
        "name": "test",
        "source": "measured",
        "device": {"kind": kind, "per_node": 1, "memory_bytes": 80 * 2**30},
        "compute": {
            "matmul_flop_per_s": {"fp32": {"value": 5e13}},
            "memory_bandwidth_bytes_per_s": {"value": 2e12},
        },
        "hosts": ["h"],
    }
    if terms is not None:
        data["cuda_memory"] = terms.to_dict()
    return MachineModel.from_dict(data)


def setting(model: str, batch: int, strategy: str = "ddp", **extra) -> Setting:
    return Setting(
        model=model, dataset="cifar10", strategy=strategy, nodes=1, ranks_per_node=1, batch_size=batch, **extra
    )


@pytest.mark.parametrize("model,batch", [("resnet20", 32), ("vgg11", 64)])
def test_cuda_terms_change_cuda_predictions_only(model, batch):
    s = setting(model, batch)
    table = introspected_table(s.model, s.dataset, resolved_options(s))
    cpu_plain = predict(s, machine("cpu", None), search_batch=False)
    cpu_terms = predict(s, machine("cpu", TERMS), search_batch=False)
    assert cpu_terms == cpu_plain  # every figure, memory detail included
    cuda_plain = predict(s, machine("cuda", None), search_batch=False)
    cuda_terms = predict(s, machine("cuda", TERMS), search_batch=False)
    assert cuda_plain.peak_memory_bytes == cpu_plain.peak_memory_bytes  # no terms in the file: nothing added
    rounding = 3 * parameter_rounding_bytes(table)  # ddp: parameters, gradients, momentum
    transient = TERMS.per_call_byte * largest_call_bytes(table, batch)
    assert cuda_terms.peak_memory_bytes == pytest.approx(
        cuda_plain.peak_memory_bytes + TERMS.fixed_bytes + rounding + transient, abs=2
    )
    assert cuda_terms.resident_memory_bytes == pytest.approx(
        cuda_plain.resident_memory_bytes + TERMS.fixed_bytes + rounding, abs=2
    )
    assert "CUDA allocator" in cuda_terms.memory_detail
    assert cuda_terms.step_time_s == cuda_plain.step_time_s


def test_host_floor_holds_a_cuda_step_at_its_layers_issue_time_and_leaves_the_cpu_alone():
    """cuda_host: each block's forward at least n·h and backward 2n·h (n its layers); a fast GPU's small step
    then costs the host's issue time; CPU machines never change."""
    from ddlbench.analysis.analytic.compute import BACKWARD_ISSUES, block_times
    from ddlbench.analysis.analytic.machine_model import CudaHostTerms
    from ddlbench.analysis.analytic.operators import FREE_TYPES

    s = setting("resnet20", 32)
    table = introspected_table(s.model, s.dataset, resolved_options(s))
    h = 50e-6
    layers = [
        sum(1 for layer in table.layers if layer.block == block and layer.type not in FREE_TYPES)
        for block in range(len(table.blocks))
    ]

    def with_host(kind: str) -> MachineModel:
        return replace(machine(kind, None), cuda_host=CudaHostTerms(per_layer_s=h))

    def times(model: MachineModel):
        return block_times(table, model, batch=32, precision="fp32", threads=1)

    plain, floored = times(machine("cuda", None)), times(with_host("cuda"))
    for n, before, after in zip(layers, plain.forward_s, floored.forward_s, strict=True):
        assert after == pytest.approx(max(before, n * h))
    for n, before, after in zip(layers, plain.backward_s, floored.backward_s, strict=True):
        assert after == pytest.approx(max(before, BACKWARD_ISSUES * n * h))
    assert sum(floored.forward_s) > sum(plain.forward_s) and "host floor" in floored.notes[-1]
    assert times(with_host("cpu")) == times(machine("cpu", None))
    cuda_step = predict(s, with_host("cuda"), search_batch=False).step_time_s
    assert cuda_step > predict(s, machine("cuda", None), search_batch=False).step_time_s
    assert predict(s, with_host("cpu"), search_batch=False) == predict(s, machine("cpu", None), search_batch=False)


def test_rounding_and_largest_call_follow_the_layers():
    table = introspected_table("resnet20", "cifar10", resolved_options(setting("resnet20", 1)))
    waste = parameter_rounding_bytes(table)
    tensors = sum((1 if layer.params else 0) + (1 if layer.params > _weight(layer) else 0) for layer in table.layers)
    assert 0 < waste < 512 * tensors
    # the largest call scales with the batch in its activations, not in its weights
    one, two = largest_call_bytes(table, 1), largest_call_bytes(table, 2)
    assert 0 < one < two <= 2 * one


def _weight(layer) -> int:
    import math

    return min(layer.params, math.prod(layer.weight_shape) if layer.weight_shape else layer.params)


def test_fit_recovers_terms_and_leaves_each_model_out():
    rows = []
    for model, base, call in (("a", 100e6, 10e6), ("a", 300e6, 40e6), ("b", 50e6, 80e6), ("c", 500e6, 5e6)):
        measured = base + 70e6 + 0.5 * call
        rows.append({"group": model, "base_bytes": base, "call_bytes": call, "measured_bytes": measured})
    unmeasured = {"group": "d", "base_bytes": 1.0, "call_bytes": 1.0, "measured_bytes": None}
    terms, fitted = fit_cuda_terms([*rows, unmeasured])
    assert terms.fixed_bytes == pytest.approx(70e6, rel=1e-6)
    assert terms.per_call_byte == pytest.approx(0.5, rel=1e-6)
    assert len(fitted) == 4  # the unmeasured row is left out
    assert all(row["accuracy"] == pytest.approx(1.0) for row in fitted)
    assert all(row["loo_accuracy"] == pytest.approx(1.0, abs=1e-6) for row in fitted)
    # a model that holds less than predicted cannot make a term negative
    terms, _ = fit_cuda_terms([{"group": "a", "base_bytes": 100.0, "call_bytes": 10.0, "measured_bytes": 90.0}])
    assert terms.fixed_bytes == 0.0 and terms.per_call_byte == 0.0


def test_layer_timings_ranks_make_a_one_rank_point():
    from ddlbench.calibrate.suite import load_suite

    raw = {
        "name": "t",
        "collectives": [],
        "matmul_sizes": [],
        "conv_shapes": [],
        "memory_bytes": 0,
        "layer_timings": [{"model": "resnet8", "dataset": "cifar10", "batch_sizes": [2, 4]}],
    }
    default = load_suite(raw=raw).points[0]
    assert default.ranks_per_node == 2
    raw["layer_timings"][0]["ranks"] = 1
    alone = load_suite(raw=raw).points[0]
    assert (alone.benchmark, alone.ranks_per_node, alone.world_size) == ("layer_timings", 1, 1)
    raw["layer_timings"][0]["ranks"] = 2
    assert load_suite(raw=raw).points[0].point_id == default.point_id  # the default's id is unchanged


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_analytic", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow
def test_quick_cpu_run_scores_its_points_and_rescores_the_same(tmp_path):
    out = tmp_path / "run"
    output = _run("--device", "cpu", "--quick", "--out", str(out))
    assert "figures below say nothing of a GPU" in output
    summary = json.loads((out / "summary.json").read_text())
    script = _load_script()
    assert summary["n_time"] == summary["n_memory"] == len(script.QUICK_HELD_OUT)
    assert summary["run"]["meaningless"] is True
    assert summary["device"]["kind"] == "cpu"
    assert all(row["status"] == "ok" for row in summary["held_out"])
    # on the CPU the fitted terms are kept in the machine file but never applied
    machine_file = MachineModel.from_file(out / "machine.yaml")
    assert machine_file.cuda_memory is not None
    for row in summary["held_out"]:
        assert row["predicted_peak_bytes"] == row["predicted_peak_without_cuda_terms_bytes"]
    assert [r["label"].split()[0] for r in summary["calibration"]["memory"]["rows"]] == [
        m for m, _ in script.QUICK_MEMORY_CALIBRATION
    ]
    for line in ("time:   mean accuracy", "memory: mean accuracy", "held out (never run by the calibration)"):
        assert line in output
    # rescoring the folder and its archive reproduces the run's accuracies from the saved files alone
    for source in (out, _archive(out, tmp_path / "run.tar.gz")):
        rescored = json.loads(_run("--rescore", str(source)).strip().splitlines()[-1])
        assert rescored["time_accuracy_mean"] == pytest.approx(summary["time_accuracy_mean"], rel=1e-12)
        assert rescored["memory_accuracy_mean"] == pytest.approx(summary["memory_accuracy_mean"], rel=1e-12)
    # and the scoring reads the saved machine file: the same predictions again in-process
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = script.score(copy)
    assert again["held_out"] == summary["held_out"]


def _archive(folder: Path, target: Path) -> Path:
    with tarfile.open(target, "w:gz") as tar:
        tar.add(folder, arcname="gpu-analytic")
    return target


@pytest.mark.gpu
@pytest.mark.slow
def test_quick_cuda_run_calibrates_and_predicts_on_the_gpu(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "run"
    _run("--device", "cuda", "--quick", "--out", str(out), timeout=600)
    measured = MachineModel.from_file(out / "machine-measured.yaml")
    assert measured.device_kind == "cuda"
    kinds = {sample["kind"] for entry in measured.operator_timings for sample in entry["samples"]}
    assert {"conv2d", "batch_norm2d", "linear"} <= kinds  # batch norms' running statistics on the GPU too
    summary = json.loads((out / "summary.json").read_text())
    assert all(row["status"] == "ok" and row["measured_peak_bytes"] for row in summary["held_out"])
    machine_file = MachineModel.from_file(out / "machine.yaml")
    for row in summary["held_out"]:
        assert "CUDA allocator" in row["memory_detail"]
        plain = predict(
            Setting.of_point(_record(out, row["point_id"]).point),
            replace(machine_file, cuda_memory=None),
            search_batch=False,
        )
        assert row["predicted_peak_without_cuda_terms_bytes"] == plain.peak_memory_bytes


def _record(out: Path, point_id: str):
    from ddlbench.records import read_record

    return read_record(out / "held-out" / "points" / point_id / "record.json")
