"""GPU path: NCCL and the CUDA allocator's figures. Skipped cleanly on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

from ddlbench.launch.runner import run_point
from tests.conftest import make_point

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_point_on_cuda_uses_nccl_and_records_allocator_peaks(tmp_path):
    ranks = min(torch.cuda.device_count(), 2)
    record = run_point(make_point(ranks_per_node=ranks, batch_size=64), out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    assert record.provenance.backend == "nccl"
    assert record.provenance.gpu_model
    assert record.metrics.cuda_peak_allocated_bytes > 0
    assert record.metrics.cuda_peak_reserved_bytes >= record.metrics.cuda_peak_allocated_bytes
