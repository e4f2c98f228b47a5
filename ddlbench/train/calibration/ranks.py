"""One rank of a calibration point: run its microbenchmarks and say where it ran (imported by the worker)."""

from __future__ import annotations

import os
import socket

import torch

from ddlbench.provenance import host_memory_bytes
from ddlbench.train.calibration.kernels import run_collectives_mpi, run_collectives_torch, run_compute
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import CalibrationRankResult
from ddlbench.train.host_probe import probe_in_turn
from ddlbench.train.strategies import RankContext


def measure(point: CalibrationPoint, ctx: RankContext) -> CalibrationRankResult:
    torch.set_num_threads(point.threads)
    on_cuda = ctx.device.type == "cuda"
    library = ctx.backend
    probes = probe_in_turn(ctx.device, "start")  # the host's speed, as every training point probes it
    if point.benchmark == "compute":
        measurements = run_compute(point, ctx.device)
    elif point.benchmark == "layer_timings":
        from ddlbench.train.calibration.layer_timing_kernel import run_layer_timings  # builds models: only when needed

        measurements = run_layer_timings(point, ctx.device)
    elif point.benchmark == "fsdp_units":
        from ddlbench.train.calibration.fsdp_unit_kernel import run_fsdp_units  # imports FSDP2: only when needed

        measurements = run_fsdp_units(point, ctx.device)
    elif point.benchmark == "spatial_layers":
        from ddlbench.train.calibration.spatial_layer_kernel import run_spatial_layers  # the strategy's own layers

        measurements = run_spatial_layers(point, ctx.device)
    elif point.benchmark == "operators":
        from ddlbench.train.calibration.operator_kernel import run_operators

        measurements = run_operators(point, ctx.device, probes)  # and its probes between shapes
    elif point.backend == "mpi":
        measurements, library = run_collectives_mpi(point)
    else:
        measurements = run_collectives_torch(point, ctx.device)
    probes += probe_in_turn(ctx.device, "end")
    return CalibrationRankResult(
        rank=ctx.rank,
        hostname=socket.gethostname(),
        device=ctx.device.type,
        device_name=torch.cuda.get_device_name(ctx.device) if on_cuda else "",
        backend=ctx.backend,
        library=library,
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        cpus=tuple(sorted(os.sched_getaffinity(0))),
        measurements=tuple(measurements),
        slurm_node=os.environ.get("SLURMD_NODENAME", ""),
        memory_bytes=torch.cuda.get_device_properties(ctx.device).total_memory if on_cuda else host_memory_bytes(),
        host_probe=tuple(probes),
    )
