"""Entry point of one rank: join the process group, train the point (or run a calibration point's
microbenchmarks, ddlbench.train.calibration), write what it measured, exit cleanly.

Run as `python -m ddlbench.launch.worker --spec JSON --rank-dir DIR` by a launcher, never by hand. With
`--group FILE` the ranks run several points of one layout one after another in this launch, each writing
into its own rank folder (ddlbench.launch.group); `--spec` is then the first of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

from ddlbench.launch.cores import pin_from_environment
from ddlbench.launch.rendezvous import RankEnv, rank_env
from ddlbench.point import Point
from ddlbench.records import POINTS_DIR, RECORD_FILE, RankFailure, write_json_atomic
from ddlbench.train.calibration.point import KIND as CALIBRATION
from ddlbench.train.calibration.point import CalibrationPoint

log = logging.getLogger("ddlbench.worker")

_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")
# what _join did to place the rank (ddlbench.launch.devices): its CPUs' move onto the GPU's NUMA node, the
# local ranks on its GPU; recorded in the rank's `gpu`
_PLACEMENT: dict[str, object] = {}


def rank_file(rank_dir: Path, rank: int) -> Path:
    return rank_dir / f"rank-{rank}.json"


def failure_file(rank_dir: Path, rank: int) -> Path:
    return rank_dir / f"rank-{rank}.failure.json"


def span_file(rank_dir: Path) -> Path:
    """Where rank 0 of a group launch writes when one point's part of the launch began and ended."""
    return rank_dir / "span.json"


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc).lower() for marker in _OOM_MARKERS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ddlbench.launch.worker")
    parser.add_argument("--spec", required=True, help="the point, as the JSON of Point.to_json()")
    parser.add_argument("--rank-dir", required=True, type=Path, help="where each rank writes its result")
    parser.add_argument("--dump-params", type=Path, help="rank 0 saves the final full state dict here")
    parser.add_argument("--group", type=Path, help="a group launch's file: the points to run one after another")
    args = parser.parse_args(argv)
    # SLURM warns a job of its time limit or preemption with SIGUSR2 to every step (submitit's signal);
    # the point's launcher decides what to do, so a rank must not die of it
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    binding = pin_from_environment(os.environ)  # before torch sizes its thread pools
    spec = json.loads(args.spec)
    calibration = spec.get("kind") == CALIBRATION
    if spec.get("replay_steps"):  # deterministic cuBLAS for the replay: set before CUDA makes its handles
        from ddlbench.train.replay import CUBLAS_WORKSPACE_CONFIG

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    # a calibration point that measures through MPI keeps the MPI that mpirun started (else: bootstrap only)
    env = rank_env(os.environ, keep_mpi=calibration and spec.get("backend") == "mpi")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {env.rank}/{env.world_size} %(levelname)s %(message)s"
    )
    # a group's failure is written into the folder of the point that was running when it happened
    current = {"rank_dir": args.rank_dir}
    try:
        if calibration:
            _calibrate(CalibrationPoint.from_dict(spec), env, args.rank_dir, binding)
        elif args.group is not None:
            _run_group(json.loads(args.group.read_text())["points"], env, binding, current)
        else:
            _run(Point.from_dict(spec), env, args.rank_dir, args.dump_params, binding)
    except BaseException as exc:  # a rank's failure is data: write it down, then leave without a barrier
        failure = RankFailure(
            rank=env.rank,
            hostname=socket.gethostname(),
            error_type=type(exc).__name__,
            message=str(exc).strip().splitlines()[0][:2000] if str(exc).strip() else "",
            traceback=traceback.format_exc()[-20000:],
            out_of_memory=is_out_of_memory(exc),
            time=time.time(),
        )
        log.error("failed: %s: %s", failure.error_type, failure.message)
        write_json_atomic(failure_file(current["rank_dir"], env.rank), asdict(failure))
        _exit(1)
    _exit(0)


def _join(point: Point | CalibrationPoint, env: RankEnv):
    """Check torch, take the rank's device and join the process group; the rank's RankContext."""
    import torch

    from ddlbench.launch.devices import init_process_group, place_on_gpu_numa_node, rank_device
    from ddlbench.train.strategies import RankContext
    from ddlbench.train.torch_floor import check_torch_floor

    check_torch_floor(torch.__version__)  # before any figure: every rank fails alike, and says why

    # local launches run every rank on this host (LOCAL_WORLD_SIZE); under srun a node has ranks_per_node
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", point.ranks_per_node))
    share_gpus = bool(getattr(point, "share_gpus", False))  # calibration points never share
    device, backend = rank_device(env.local_rank, local_ranks, os.environ, share_gpus=share_gpus)
    # onto the GPU's NUMA node before the process group's and the thread pools' threads exist
    _PLACEMENT["cpu_alignment"] = place_on_gpu_numa_node(device, point.cores_per_rank)
    backend, shared_with = init_process_group(
        device,
        backend,
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        local_ranks=local_ranks,
        timeout=timedelta(seconds=point.timeout_s),
        environ=os.environ,
        share_gpus=share_gpus,
    )
    if device.type == "cuda":
        _PLACEMENT["shared_with"] = shared_with
    if device.type == "cuda" and backend == "gloo":  # ranks sharing a GPU (ddlbench.train.shared_gpu)
        from ddlbench.train.shared_gpu import stage_point_to_point

        stage_point_to_point()
    return RankContext(
        rank=env.rank, world_size=env.world_size, local_rank=env.local_rank, device=device, backend=backend
    )


def _run(point: Point, env: RankEnv, rank_dir: Path, dump_params: Path | None, binding: str) -> None:
    import torch
    import torch.distributed as dist

    ctx = _join(point, env)
    state = _train(point, ctx, rank_dir, binding, keep_state=dump_params is not None)
    _keep_model_table(point, rank_dir, ctx.rank)
    if state is not None and dump_params is not None:
        dump_params.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, dump_params)
    # gloo workers may abort in their destructors at interpreter exit; meet, tear down, and leave at once
    dist.barrier()
    dist.destroy_process_group()


def _train(point: Point, ctx, rank_dir: Path, binding: str, *, keep_state: bool = False):
    """Train `point` on this rank and write its result; the final state dict when `keep_state`."""
    from ddlbench.launch.devices import gpu_identity
    from ddlbench.launch.placement import network_env_seen
    from ddlbench.provenance import allocator_env_seen
    from ddlbench.train.kernel import train_point

    watch = _health_watch(ctx.device)  # the GPU's health around the point (ddlbench.train.health)
    result, state = train_point(point, ctx, keep_state=keep_state)
    result = replace(result, health=_health(watch, ctx.device))
    if point.replay_steps:  # the silent-data-corruption check, after the window (ddlbench.train.replay)
        from ddlbench.train.faults import planned_corruption
        from ddlbench.train.replay import replay_point

        corrupt = ctx.rank == ctx.world_size - 1 and planned_corruption(point.point_id)
        result = replace(result, replay=replay_point(point, ctx.device, corrupt=corrupt))
    placed = replace(
        result,
        cpu_binding=binding,
        slurm_node=os.environ.get("SLURMD_NODENAME", ""),
        gpu=gpu_identity(ctx.device, os.environ, **{key: value for key, value in _PLACEMENT.items() if value != ""}),
        network_env=network_env_seen(os.environ),
        allocator_env=allocator_env_seen(os.environ),
    )
    write_json_atomic(rank_file(rank_dir, ctx.rank), asdict(placed))
    return state


def _health_watch(device):
    from ddlbench.train.energy import cuda_identity
    from ddlbench.train.health import HealthWatch

    return HealthWatch([(str(device), *cuda_identity(device))] if device.type == "cuda" else [])


def _health(watch, device) -> dict:
    """The rank's GPU health over its point (GpuHealth.to_dict), or why there is none: {"why_not": …}."""
    from ddlbench.train.health import NOT_MEASURABLE

    healths = watch.finish()
    if healths:
        return healths[0].to_dict()
    return {"why_not": watch.why_not or f"{NOT_MEASURABLE}: the rank ran on the {device.type.upper()}"}


def sweep_dir_of(rank_dir: Path) -> Path | None:
    """The sweep folder of a point whose ranks write into `rank_dir` (<sweep>/points/<id>/record.json.ranks,
    ddlbench.records.record_path and ddlbench.launch.runner.rank_dir_for), or None for a record elsewhere."""
    if rank_dir.name == f"{RECORD_FILE}.ranks" and rank_dir.parent.parent.name == POINTS_DIR:
        return rank_dir.parent.parent.parent
    return None


def _keep_model_table(point: Point, rank_dir: Path, rank: int) -> None:
    """Rank 0, once its point trained: leave the point's model table in the sweep's folder where the package
    does not ship it, so the login node predicts these options without torch (ddlbench.analysis.analytic.
    table_cache). After the measurement, and never the point's failure."""
    sweep_dir = sweep_dir_of(rank_dir)
    if rank != 0 or sweep_dir is None:
        return
    from ddlbench.analysis.analytic.table_cache import keep_sweep_table

    try:
        written = keep_sweep_table(sweep_dir, point.model, point.dataset, point.model_options)
    except Exception as exc:  # a table not kept costs a prediction, not the point
        log.warning("model table of %s on %s not kept: %s: %s", point.model, point.dataset, type(exc).__name__, exc)
        return
    if written is not None:
        log.info("model table kept at %s", written)


def _run_group(entries: list[dict], env: RankEnv, binding: str, current: dict) -> None:
    """Each point of a group launch in turn, in one process group (joined once: the launch's overhead is
    paid once); rank 0 writes each point's span (its part of the launch, wall clock) once every rank is
    done with it. The process group's timeout is the longest of the points'."""
    import gc

    import torch
    import torch.distributed as dist

    from ddlbench.provenance import utc_now

    points = [Point.from_dict(entry["spec"]) for entry in entries]
    ctx = _join(replace(points[0], timeout_s=max(p.timeout_s for p in points)), env)
    for point, entry in zip(points, entries, strict=True):
        rank_dir = Path(entry["rank_dir"])
        current["rank_dir"] = rank_dir
        start = utc_now()
        _train(point, ctx, rank_dir, binding)
        _keep_model_table(point, rank_dir, ctx.rank)
        gc.collect()  # the last point's model and batches go before the next is built and its memory probed
        if ctx.device.type == "cuda":
            # what a fresh process would not hold either: cuBLAS's workspaces (made at a process's first
            # matmul, kept for its life: a point alone counts them in its peak, so the next must too) and
            # the cached blocks the last point left, which the next would count as reserved
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                clear()
            torch.cuda.empty_cache()
            log.info("between points: %d bytes still allocated on %s", torch.cuda.memory_allocated(), ctx.device)
        dist.barrier()
        if ctx.rank == 0:
            write_json_atomic(span_file(rank_dir), {"start_time": start, "end_time": utc_now()})
    dist.barrier()
    dist.destroy_process_group()


def _calibrate(point: CalibrationPoint, env: RankEnv, rank_dir: Path, binding: str) -> None:
    import torch.distributed as dist

    from ddlbench.train.calibration.ranks import measure

    ctx = _join(point, env)
    result = measure(point, ctx)
    write_json_atomic(rank_file(rank_dir, env.rank), asdict(replace(result, cpu_binding=binding)))
    dist.barrier()
    dist.destroy_process_group()
    if point.backend == "mpi":  # kept initialised for the measurements (rank_env's keep_mpi): finalise it
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
