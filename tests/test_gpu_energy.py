"""On a GPU with NVML: a point's record holds its GPU's energy over the measured window, labelled with the
rank's GPU, and the versions of the software and the facts of the card. Skipped without CUDA or pynvml
(tests/test_energy.py tests the same code with a fake pynvml on any host)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from ddlbench.launch.runner import run_point
from tests.conftest import make_point

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="needs pynvml (nvidia-ml-py)"),
]


def test_a_point_on_cuda_records_its_gpu_energy_and_the_software_and_card(tmp_path):
    # resnet18 at batch 256: 300 steps took 11.0 s on an H200 (565 W, 12.4 samples/J, 2026-11-28); 100 steps
    # are a window of seconds, which the 0.1 s counter reads to a few per cent
    point = make_point(model="resnet18", batch_size=256, warmup_steps=3, steps=100)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    (rank,) = record.ranks
    (reading,) = [r for r in rank.energy if r.boundary == "gpu"]
    assert reading.device == rank.gpu["uuid"] == rank.gpu_facts.uuid
    assert reading.method == "nvml total energy counter"
    assert reading.energy_j > 0 and reading.window_s > 1.0 and not reading.too_short
    assert reading.uncertainty_j == pytest.approx(reading.energy_j * 0.2 / reading.window_s)
    metrics = record.metrics
    assert metrics.energy_gpus == 1 and metrics.energy_j == pytest.approx(reading.energy_j)
    assert metrics.samples_per_j == pytest.approx(point.global_batch_size * point.steps / reading.energy_j)
    # a GPU under load draws tens to hundreds of watts over the window
    assert 10 < metrics.energy_j / reading.window_s < 2000, (metrics.energy_j, reading.window_s)
    provenance = record.provenance
    assert provenance.nvml == "nvml" and provenance.driver_version
    assert provenance.cuda_runtime_version == torch.version.cuda
    assert provenance.cudnn_version == str(torch.backends.cudnn.version())
    assert provenance.nccl_version and provenance.nccl_version.count(".") == 2
    (gpu,) = provenance.gpus
    assert gpu.uuid == rank.gpu["uuid"] and gpu.pci_bus_id and gpu.name
    assert gpu.power_limit_w and gpu.power_limit_w > 50 and gpu.sm_clock_max_mhz and gpu.sm_clock_max_mhz > 500
    watts = metrics.energy_j / reading.window_s
    print(f"energy {metrics.energy_j:.1f} J over {reading.window_s:.2f} s ({watts:.0f} W), {metrics.samples_per_j:.1f} "
          f"samples/J; {provenance.driver_version} {provenance.cuda_runtime_version} {provenance.cudnn_version} "
          f"{provenance.nccl_version}; {gpu}")  # fmt: skip
