"""What a GPU host offers ddlbench, read in about a minute: versions, NVML's readings, NUMA placement,
the host cost of CUDA event stamps, and which gloo collectives take CUDA tensors when ranks share one GPU.

    python3 benchmarks/gpu_probe.py [--json OUT.json]

Printed as `name: value` lines (and written as JSON with --json). Nothing here is asserted: it is
what the decisions of docs/gpu.md rest on, to be read again on a new card or a new torch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FACTS: dict[str, object] = {}


def fact(name: str, value: object) -> None:
    FACTS[name] = value
    print(f"{name}: {value}", flush=True)


def versions() -> None:
    fact("torch", torch.__version__)
    fact("cuda_runtime", torch.version.cuda)
    fact("cudnn", torch.backends.cudnn.version())
    try:
        fact("nccl", ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as error:
        fact("nccl", f"unreadable: {error}")
    properties = torch.cuda.get_device_properties(0)
    fact("device", f"{properties.name}, cc {properties.major}.{properties.minor}, {properties.total_memory} B")
    fact("pci", [getattr(properties, f"pci_{p}_id", None) for p in ("domain", "bus", "device")])


def nvml() -> None:
    try:
        import pynvml
    except ImportError as error:
        fact("nvml", f"no binding: {error}")
        return
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def read(name, call, *args):
        try:
            value = call(*args)
            fact(f"nvml.{name}", value.decode() if isinstance(value, bytes) else value)
        except Exception as error:
            fact(f"nvml.{name}", f"error: {error!r}")

    read("driver", pynvml.nvmlSystemGetDriverVersion)
    read("cuda_driver", pynvml.nvmlSystemGetCudaDriverVersion_v2)
    read("nvml_version", pynvml.nvmlSystemGetNVMLVersion)
    read("uuid", pynvml.nvmlDeviceGetUUID, handle)
    read("serial", pynvml.nvmlDeviceGetSerial, handle)
    read("vbios", pynvml.nvmlDeviceGetVbiosVersion, handle)
    read("pci_bus_id", lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle)
    for clock, name in ((pynvml.NVML_CLOCK_SM, "sm"), (pynvml.NVML_CLOCK_MEM, "mem")):
        read(f"clock_app_{name}_mhz", pynvml.nvmlDeviceGetApplicationsClock, handle, clock)
        read(f"clock_max_{name}_mhz", pynvml.nvmlDeviceGetMaxClockInfo, handle, clock)
        read(f"clock_now_{name}_mhz", pynvml.nvmlDeviceGetClockInfo, handle, clock)
    read("power_limit_mw", pynvml.nvmlDeviceGetPowerManagementLimit, handle)
    read("enforced_power_limit_mw", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    read("ecc_mode", pynvml.nvmlDeviceGetEccMode, handle)
    read("mig_mode", pynvml.nvmlDeviceGetMigMode, handle)
    read("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode, handle)
    read("numa_node", getattr(pynvml, "nvmlDeviceGetNumaNodeId", lambda h: "no call"), handle)
    read("energy_mj", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    read("power_mw", pynvml.nvmlDeviceGetPowerUsage, handle)
    # how often the energy counter moves: poll it for 2 s, with the GPU busy
    x = torch.randn(4096, 4096, device="cuda")
    changes, last, began = [], None, time.perf_counter()
    calls = 0
    while time.perf_counter() - began < 2.0:
        for _ in range(4):
            x = x @ x
            x = x / x.norm()
        value = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        calls += 1
        if value != last:
            changes.append((time.perf_counter(), value))
            last = value
    torch.cuda.synchronize()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(changes)]
    fact("nvml.energy_updates_in_2s", len(changes))
    fact("nvml.energy_polls_in_2s", calls)
    if gaps:
        gaps.sort()
        fact(
            "nvml.energy_update_gap_ms_min_median_max",
            [round(1e3 * g, 2) for g in (gaps[0], gaps[len(gaps) // 2], gaps[-1])],
        )
    t0 = time.perf_counter()
    for _ in range(200):
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    fact("nvml.energy_read_cost_us", round((time.perf_counter() - t0) / 200 * 1e6, 1))


def host() -> None:
    fact("cpus_affinity", len(os.sched_getaffinity(0)))
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    fact("numa_nodes", {n.name: (n / "cpulist").read_text().strip() for n in nodes})
    properties = torch.cuda.get_device_properties(0)
    bus = f"{properties.pci_domain_id:04x}:{properties.pci_bus_id:02x}:{properties.pci_device_id:02x}.0"
    device = Path("/sys/bus/pci/devices") / bus
    for name in ("numa_node", "local_cpulist"):
        try:
            fact(f"pci.{name}", (device / name).read_text().strip())
        except OSError as error:
            fact(f"pci.{name}", f"unreadable: {error}")
    fact(
        "rapl",
        sorted(str(p) for p in Path("/sys/class/powercap").glob("*"))
        if Path("/sys/class/powercap").exists()
        else "none",
    )
    for tool in ("numactl", "nvidia-smi"):
        fact(
            f"tool.{tool}",
            subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
            or "absent",
        )


def event_costs() -> None:
    """Host microseconds per call, while the stream is kept busy (as inside a training step)."""
    n = 2000
    busy = torch.randn(2048, 2048, device="cuda")

    def timed(label, body):
        torch.cuda.synchronize()
        for _ in range(50):
            busy.mul_(1.0)
        began = time.perf_counter()
        for _ in range(n):
            body()
        cost = (time.perf_counter() - began) / n * 1e6
        torch.cuda.synchronize()
        fact(f"host_us.{label}", round(cost, 2))

    timed("new_event_and_record", lambda: torch.cuda.Event(enable_timing=True).record())
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for event in pool:
        event.record()
    torch.cuda.synchronize()
    it = iter(pool)
    timed("pooled_event_record", lambda: next(it).record())
    stream = torch.cuda.current_stream()
    it = iter(pool)
    timed("pooled_event_record_on_stream", lambda: next(it).record(stream))
    timed("current_stream", torch.cuda.current_stream)
    timed("small_kernel_launch", lambda: busy.add_(0.0))
    timed("perf_counter", time.perf_counter)


def stamp_cost_in_steps() -> None:
    """Step time of resnet18 (ddlbench's, synthetic cifar10-shaped input) with no stamps, with 10 fresh CUDA
    events per step (ddlbench's step timer, step and phase stamps before issue 31) and with 10 pooled ones:
    median over 3 alternating rounds of 40 steps each, milliseconds per step."""
    for batch, dtype in ((32, torch.bfloat16), (128, torch.bfloat16), (32, None)):
        _stamp_cost(batch, dtype)


def _stamp_cost(batch: int, dtype: torch.dtype | None) -> None:
    import torch.nn.functional as F

    from ddlbench.point import Point
    from ddlbench.train.kernel import build_model

    point = Point(
        model="resnet18",
        dataset="cifar10",
        strategy="ddp",
        nodes=1,
        ranks_per_node=1,
        batch_size=batch,
        threads=1,
        repetition=0,
        warmup_steps=5,
        steps=40,
        seed=0,
        learning_rate=0.01,
        timeout_s=60.0,
    )
    with torch.device("cuda"):
        model = build_model(point)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(10 * 40)]
    for event in pool:
        event.record()

    def step(mark):
        mark()
        optimizer.zero_grad()
        mark()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            mark()
            loss = F.cross_entropy(model(x), y)
            mark()
        mark()
        loss.backward()
        mark()
        mark()
        optimizer.step()
        mark()
        mark()
        mark()

    def fresh():
        torch.cuda.Event(enable_timing=True).record()

    counter = iter(range(10**9))

    def pooled():
        pool[next(counter) % len(pool)].record()

    def nothing():
        pass

    times = {"none": [], "fresh": [], "pooled": []}
    for _ in range(5):
        step(nothing)
    for _ in range(3):
        for label, mark in (("none", nothing), ("fresh", fresh), ("pooled", pooled)):
            torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(40):
                step(mark)
            torch.cuda.synchronize()
            times[label].append((time.perf_counter() - began) / 40 * 1e3)
    name = f"step_ms.resnet18.b{batch}.{'bf16' if dtype else 'fp32'}"
    fact(name, {label: round(sorted(v)[1], 3) for label, v in times.items()})


def _collective_worker(rank: int, world: int, init: str, backend: str, queue) -> None:
    results = {}
    try:
        os.environ.setdefault("NCCL_DEBUG", "WARN")
        torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
        device = torch.device("cuda", 0)

        def check(name, body):
            try:
                ok = body()
                torch.cuda.synchronize()
                results[name] = "ok" if ok else "wrong result"
            except Exception as error:
                results[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"

        def all_reduce():
            t = torch.full((1000,), float(rank + 1), device=device)
            dist.all_reduce(t)
            return bool((t == sum(range(1, world + 1))).all())

        def all_reduce_async():
            t = torch.full((1000,), float(rank + 1), device=device)
            dist.all_reduce(t, async_op=True).wait()
            return bool((t == sum(range(1, world + 1))).all())

        def broadcast():
            t = torch.full((10,), float(rank), device=device)
            dist.broadcast(t, src=0)
            return bool((t == 0).all())

        def all_gather():
            out = [torch.empty(4, device=device) for _ in range(world)]
            dist.all_gather(out, torch.full((4,), float(rank), device=device))
            return all(bool((o == r).all()) for r, o in enumerate(out))

        def all_gather_into_tensor():
            out = torch.empty(4 * world, device=device)
            dist.all_gather_into_tensor(out, torch.full((4,), float(rank), device=device))
            return bool((out.view(world, 4)[:, 0] == torch.arange(world, device=device)).all())

        def reduce_scatter_tensor():
            out = torch.empty(4, device=device)
            dist.reduce_scatter_tensor(out, torch.ones(4 * world, device=device))
            return bool((out == world).all())

        def reduce_scatter():
            out = torch.empty(4, device=device)
            dist.reduce_scatter(out, [torch.ones(4, device=device) for _ in range(world)])
            return bool((out == world).all())

        def all_to_all_single():
            out = torch.empty(world, device=device)
            dist.all_to_all_single(out, torch.full((world,), float(rank), device=device))
            return bool((out == torch.arange(world, device=device, dtype=out.dtype)).all())

        def send_recv():
            t = torch.full((8,), float(rank), device=device)
            if rank == 0:
                dist.send(t, dst=1)
                return True
            if rank == 1:
                dist.recv(t, src=0)
                return bool((t == 0).all())
            return True

        def isend_irecv_batch():
            t = torch.full((8,), float(rank), device=device)
            r = torch.empty(8, device=device)
            ops = [dist.P2POp(dist.isend, t, (rank + 1) % world), dist.P2POp(dist.irecv, r, (rank - 1) % world)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            return bool((r == (rank - 1) % world).all())

        def reduce():
            t = torch.ones(4, device=device)
            dist.reduce(t, dst=0)
            return bool((t == world).all()) if rank == 0 else True

        def barrier():
            dist.barrier()
            return True

        for name, body in list(locals().items()):
            if callable(body) and name not in ("check",) and not name.startswith("_"):
                check(name, body)
        dist.destroy_process_group()
    except Exception as error:
        results["init"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    queue.put((rank, results))


def shared_gpu_collectives(backend: str, world: int = 2) -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init = f"file://{folder}/rendezvous"
        procs = [
            context.Process(target=_collective_worker, args=(r, world, init, backend, queue)) for r in range(world)
        ]
        for p in procs:
            p.start()
        got = {}
        deadline = time.time() + 60
        while len(got) < world and time.time() < deadline:
            try:
                rank, results = queue.get(timeout=max(0.1, deadline - time.time()))
                got[rank] = results
            except Exception:
                break
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    fact(f"shared_gpu.{backend}.{world}ranks", got.get(0, "no answer (hung or crashed)"))
    if 1 in got and got[1] != got.get(0):
        fact(f"shared_gpu.{backend}.{world}ranks.rank1", got[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_probe: needs a CUDA GPU; torch sees none here")
    for part in (versions, nvml, host, event_costs, stamp_cost_in_steps):
        try:
            part()
        except Exception:
            fact(f"{part.__name__}.error", traceback.format_exc(limit=3))
    for backend, world in (("gloo", 2), ("gloo", 4), ("nccl", 2)):
        shared_gpu_collectives(backend, world)
    if args.json:
        args.json.write_text(json.dumps(FACTS, indent=1, default=str))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
