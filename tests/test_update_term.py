"""The analytic model's update term: the calibration times the optimizer's step as training runs it
(ddlbench.train.calibration.kernels, `update`), the machine file keeps its seconds per parameter element
(`update_s_per_param`), and a prediction takes it, falling back to 24 B per element at the memory bandwidth
only for a machine file without it. The calibrated figure is checked against a real model's optimizer step
timed beside it."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from ddlbench.analysis.analytic.compute import UPDATE_BYTES_PER_PARAM, update_per_param_s
from ddlbench.analysis.analytic.predict import introspected_table, predict
from ddlbench.train.calibration.kernels import UPDATE_TENSORS, run_compute
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.kernel import build_model, make_optimizer_for
from tests.conftest import make_point
from tests.test_analytic_model import cpu_machine, cpu_machine_compute, setting


def _with_update(per_param: float | None):
    compute = cpu_machine_compute()
    if per_param is not None:
        compute["update_s_per_param"] = {"value": per_param, "elements": 1 << 24, "tensors": UPDATE_TENSORS}
    return cpu_machine(compute=compute)


def test_a_prediction_takes_the_calibrated_update_and_falls_back_to_bandwidth_without_it():
    bandwidth = cpu_machine_compute()["memory_bandwidth_bytes_per_s"]["value"]
    assert update_per_param_s(_with_update(None)) == UPDATE_BYTES_PER_PARAM / bandwidth
    assert update_per_param_s(_with_update(1.6e-9)) == 1.6e-9
    # on one rank nothing overlaps the update: the step grows by the difference × the parameters, exactly
    one = setting("ddp", ranks_per_node=1, model="vgg11")
    params = introspected_table("vgg11", "cifar10", (("norm", "batch"),)).params
    fast, slow = (predict(one, _with_update(x), search_batch=False).step_time_s for x in (1e-9, 4e-9))
    assert slow - fast == pytest.approx(3e-9 * params, rel=1e-9)


def _point(memory_bytes: int, iterations: int) -> CalibrationPoint:
    return CalibrationPoint(
        suite="t", benchmark="compute", backend="", nodes=1, ranks_per_node=1, threads=1, warmup=1,
        iterations=iterations, timeout_s=60, memory_bytes=memory_bytes,
    )  # fmt: skip


def test_ranks_updating_at_once_pay_the_ratio_the_operators_point_timed_between_its_turns():
    """The operators point times the step by one rank alone and by two at once (their memory bandwidth shared):
    a rank of two updating at once pays the compute point's figure × that ratio; one alone, or a file without
    the turns' figures, the figure itself."""
    from dataclasses import replace

    machine = _with_update(1.6e-9)
    timed = replace(machine, update_at_once={1: 0.9e-9, 2: 1.35e-9})
    assert update_per_param_s(timed, 2) == pytest.approx(1.6e-9 * 1.5)
    assert update_per_param_s(timed, 1) == update_per_param_s(timed) == 1.6e-9
    assert update_per_param_s(replace(machine, update_at_once={2: 1.35e-9}), 2) == 1.6e-9  # no one-rank turn
    assert update_per_param_s(machine, 2) == 1.6e-9
    # read from the machine file's operator entries, one per count of ranks at once (threads 1)
    entries = [
        {"precision": "fp32", "threads": 1, "ranks_per_node": k, "samples": [], "update_s_per_param": {"value": v}}
        for k, v in ((1, 0.9e-9), (2, 1.35e-9))
    ]
    assert cpu_machine(operator_timings=entries).update_at_once == {1: 0.9e-9, 2: 1.35e-9}


def test_the_compute_point_times_the_optimizers_step_over_its_bytes_in_tensors():
    entries = run_compute(_point(1 << 20, 3), torch.device("cpu"))
    (update,) = [entry for entry in entries if entry["kind"] == "update"]
    assert update["elements"] == (1 << 20) // 4 and update["tensors"] == UPDATE_TENSORS
    assert len(update["times_s"]) == 3 and min(update["times_s"]) > 0


@pytest.mark.serial  # timed against each other: alone on the machine
def test_the_calibrated_update_predicts_a_real_models_optimizer_step():
    # vgg11 on CIFAR-10 (9.2 M parameters in 30 tensors, 37 MB: beyond the caches, as the 64 MiB probe is):
    # its real optimizer (the training kernel's SGD with momentum) timed in rounds alternating with the
    # calibration's compute point, so a spell of the host's load weighs on both; each side's median over
    # the rounds. Predicted = the calibrated seconds per element × the model's parameters. Both sides are
    # the same passes over memory, so they agree within the host's spread over seconds (±15 % here); a
    # 1.5× error is not noise. (24 B per element at the copy probe's bandwidth was 1.3-2.3× the step here.)
    torch.manual_seed(0)
    point = make_point(model="vgg11", dataset="cifar10")
    model = build_model(point)
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.grad = torch.ones_like(parameter)
    optimizer = make_optimizer_for(point)(parameters)
    optimizer.step()  # the momentum buffers, as after a training step
    elements = sum(p.numel() for p in parameters)
    calibrated, real = [], []
    for _ in range(3):
        entries = run_compute(_point(64 << 20, 5), torch.device("cpu"))
        (update,) = [entry for entry in entries if entry["kind"] == "update"]
        calibrated += [t / update["elements"] for t in update["times_s"]]
        for _ in range(5):
            start = time.perf_counter()
            optimizer.step()
            real.append(time.perf_counter() - start)
    predicted = statistics.median(calibrated) * elements
    measured = statistics.median(real)
    assert 1 / 1.5 < predicted / measured < 1.5, (predicted, measured, elements)
