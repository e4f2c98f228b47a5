"""The machine file: what later analyses know of a machine, measured (`ddlbench calibrate`) or written
by hand from datasheets (workflow/machines/). Versioned YAML; every figure a mapping with its `value`
and unit in its key's name, measured ones with their statistics and sample size.

    machine_version: 1
    name, source (measured | datasheet), references (datasheet files: where each figure comes from)
    device: {kind, name, per_node, memory_bytes}
    compute:
      matmul_flop_per_s: {<precision>: {value, ...}}   # best over the sizes timed
      conv_flop_per_s:   {<precision>: {value, ...}}
      memory_bandwidth_bytes_per_s: {value, ...}
      first_touch_s_per_byte: {value, ..., bytes_filled}   # CPU: memory mapped and zeroed on first use
      update_s_per_param: {value, ..., elements, tensors}   # the optimizer's step, per parameter element
    links: {intra_node | inter_node: {alpha_s, beta_s_per_byte, bandwidth_bytes_per_s, ...}}
    collectives: [{library, link, op, ranks, nodes, alpha_s, beta_s_per_byte, bandwidth_bytes_per_s,
                   rel_error_median, rel_error_max, curve: [{bytes, time_s: {value, ci_low, ci_high, n}}],
                   busy: {alpha_s, beta_s_per_byte, wait_per_compute_s, rel_error_median, rel_error_max,
                          curve: [{bytes, burst_s, mean_s, n}]},   # busy: optional (torch on CPUs)
                   beside: {share: figure, in_flight_share: figure, stretch: figure,
                            curve: [{bytes, share: figure, in_flight_share: figure, stretch: figure,
                                     call_s, compute_s, beside_s, call_beside_s}]}}]
                   # beside: optional (torch on CPUs, all_reduce, all_gather and reduce_scatter)
    layer_timings:                   # optional ([] or absent: none); ddlbench.analysis.machine.layer_timings
      - {model, dataset, options (resolved), precision, threads, ranks_per_node (ranks that timed it at
         once on one node), batch_sizes: [b, ...], point_id,
         blocks: [{name, forward_s: [figure per batch size], backward_s: [...],
                   forward_fit: {alpha_s, beta_s_per_sample, rel_error_max}, backward_fit: {...}}],
         loss_s: [...], loss_fit: {...}, update_s: figure, step_s: [...], other_s: [...]}
    fsdp_units:                      # optional; ddlbench.analysis.machine.fsdp_units
      - {ranks, nodes, layout, threads, point_id,
         forward: {per_unit_s, per_tensor_s, per_byte_s, rel_error_max}, backward: {...},
         update: {per_tensor_s}, variants: [{units, tensors_per_unit, unit_bytes, plain_forward_s: figure,
         fsdp_forward_s: figure, ..., forward_extra_per_unit_s, backward_extra_per_unit_s,
         update_extra_per_tensor_s}]}
    spatial_layers:                  # optional; ddlbench.analysis.machine.spatial_layers
      - {ranks, nodes, layout, threads, point_id,
         forward: {per_layer_s, per_byte_s, rel_error_max}, backward: {...},
         variants: [{units, channels, side, batch, parts, slab_bytes, halo_bytes, alone_forward_s: figure,
         slabs_forward_s: figure, ..., forward_extra_per_layer_s, backward_extra_per_layer_s}]}
    operator_timings:                # optional; ddlbench.analysis.machine.operator_timings
      - {precision, threads, ranks_per_node, point_id, autograd_call_s: figure, update_s_per_param: figure,
         samples: [{kind, batch, in_channels, height, width, out_channels, kernel, stride,
                    forward_s, backward_s, n}]}
    failed_points: [{point_id, status, reason}]   # status "refused": a precision the device cannot run
    host_probes:                     # optional; ddlbench.analysis.machine.host_speed (the host's speed per point)
      - {point_id, benchmark, at_once, ranks, threads, compute_s, copy_s, all_reduce_s, n}
    cuda_memory:                     # optional, CUDA machines: what the caching allocator counts beyond tensors
      {fixed_bytes, per_call_byte, block_bytes, method, fitted_on: [{label, measured_bytes, base_bytes, ...}]}
      # ddlbench.analysis.analytic.memory (CudaMemoryTerms, fit_cuda_terms); written by benchmarks/gpu_analytic.py
    cuda_host:                       # optional, CUDA machines: the host's time to issue one layer's forward
      {per_layer_s, method, fitted_on: [{label, measured_step_s, ...}]}
      # ddlbench.analysis.analytic.compute.host_floor; fitted by benchmarks/gpu_analytic.py

machine_version stays 1: layer_timings, operator_timings, fsdp_units and spatial_layers are optional, so files
written before them still read, and a reader that does not know one ignores it. Files written before the key was renamed
call layer_timings `layer_profiles`: read_machine reads that key as layer_timings.

Figures from measurements (one calibration's records; formulas here and in ddlbench.train.calibration.kernels):
- FLOP/s of a size = its operations ÷ each iteration's time; the figure is the median over iterations
  with its 95 % CI (records.Stats); `value` is that of the size with the highest median;
- memory bandwidth = bytes moved (read + write) ÷ time, the same way;
- update per parameter = the optimizer step's time ÷ its parameter elements, the same way (its figure's
  `elements` and `tensors` say what it was timed over);
- a collective's time at a size: per iteration the slowest rank's time (they start together after a
  barrier), median over iterations; send_recv: rank 0's round trip ÷ 2;
- α–β per collective, library and link: fitted to those medians (ddlbench.analysis.machine.fit);
- busy: the same collectives called after each rank's own compute instead of a barrier; per size and
  burst the mean over every rank's calls, and α + β·S + κ·(compute before the call) fitted to them
  (ddlbench.analysis.machine.fit.fit_busy): what a call costs inside a step, its peers' lateness included;
- beside: the share of a rank's cores a collective in flight takes from the rank's compute, per iteration
  (the chain of products run beside the collective − the chain alone) ÷ the collective alone, on each rank;
  per size the median over every rank's iterations, and `share` the median over every size's iterations
  (ddlbench.train.calibration.kernels._beside). Where the collective was timed beside the chain too: the
  same for `in_flight_share` (the chain's loss ÷ the time the collective ran under it: the compute's slowdown
  while a collective is in flight) and `stretch` (the collective's time beside the chain ÷ its time alone)
  (in_flight_figures);
- links: the α–β of send_recv through the first library measured on that link. A link is `intra_node`
  when every rank of the point ran on one host, else `inter_node`: named by where ranks really ran;
- layer timings: per block and batch size the median seconds per step over every rank's timed steps
  pooled, lines α + β·batch fitted to them (ddlbench.analysis.machine.layer_timings);
- fsdp units: FSDP2's cost per unit, sharded toy − unsharded toy, and its fit over tensors and bytes per
  unit (ddlbench.analysis.machine.fsdp_units);
- spatial layers: what spatial parallelism adds per layer on slabs, toy on slabs − toy alone on a slab,
  and its fit over the slab's bytes (ddlbench.analysis.machine.spatial_layers).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from ddlbench.analysis.machine.fit import bus_factor, fit_alpha_beta, fit_busy
from ddlbench.analysis.machine.fsdp_units import fsdp_unit_figures
from ddlbench.analysis.machine.host_speed import calibration_probes
from ddlbench.analysis.machine.layer_timings import check_layer_timings, layer_timing_figures
from ddlbench.analysis.machine.operator_timings import operator_timings
from ddlbench.analysis.machine.spatial_layers import spatial_layer_figures
from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.provenance import utc_now
from ddlbench.train.calibration.records import CalibrationRecord, stats_figure

MACHINE_VERSION = 1
# hand-written machine files of known systems, from datasheets (shown beside a calibration)
REFERENCE_MACHINES = Path(__file__).resolve().parents[3] / "workflow" / "machines"
REQUIRED_KEYS = ("machine_version", "name", "source", "device", "compute", "links", "collectives")


def measured_machine(records: list[CalibrationRecord], *, name: str | None, suite: str) -> dict[str, Any]:
    ok = [record for record in records if record.status == "ok"]
    if not ok:
        raise DdlbenchError("no calibration point ended ok: nothing to write a machine file from")
    hosts = list(dict.fromkeys(host for record in ok for host in record.hostnames))
    first_rank = ok[0].ranks[0]
    machine: dict[str, Any] = {
        "machine_version": MACHINE_VERSION,
        "name": name or hosts[0],
        "source": "measured",
        "measured_at": utc_now(),
        "suite": suite,
        "ddlbench_version": ok[0].ddlbench_version,
        "git_commit": ok[0].git_commit,
        "hosts": hosts,
        "cpu_model": ok[0].cpu_model,
        "torch_version": first_rank.torch_version,
        # the ranks' host allocator policy (the suite's `host_allocator`); "mixed" where its points differ
        "host_allocator": policies.pop()
        if len(policies := {record.point.host_allocator for record in ok}) == 1
        else "mixed",
        "device": {
            "kind": first_rank.device,
            "name": first_rank.device_name or ok[0].cpu_model,
            "per_node": max((r.point.ranks_per_node for r in ok if r.point.nodes == 1), default=1),
            "memory_bytes": first_rank.memory_bytes,
            "threads_per_rank": first_rank.threads,
        },
        "compute": {},
        "links": {},
        "collectives": [],
        "layer_timings": [],
        "operator_timings": [],
        "fsdp_units": [],
        "spatial_layers": [],
        "failed_points": [
            {"point_id": record.point_id, "status": record.status, "reason": record.reason}
            for record in records
            if record.status != "ok"
        ],
        # each point's host speed probes, per turn (ddlbench.analysis.machine.host_speed)
        "host_probes": [
            probe
            for record in ok
            for probe in calibration_probes(record.point_id, record.point.benchmark, record.ranks)
        ],
    }
    for record in ok:
        if record.point.benchmark == "compute":
            machine["compute"] = compute_figures(record)
        elif record.point.benchmark == "layer_timings":
            timings = layer_timing_figures(record)
            if isinstance(timings, str):  # the device refused the precision
                machine["failed_points"].append({"point_id": record.point_id, "status": "refused", "reason": timings})
            else:
                machine["layer_timings"].append(timings)
        elif record.point.benchmark == "operators":
            machine["operator_timings"] += operator_timings(record)
        elif record.point.benchmark == "fsdp_units":
            machine["fsdp_units"] += fsdp_unit_figures(record)
        elif record.point.benchmark == "spatial_layers":
            machine["spatial_layers"].append(spatial_layer_figures(record))
        else:
            machine["collectives"] += collective_figures(record)
    for entry in machine["collectives"]:
        link = entry["link"]
        if entry["op"] == "send_recv" and link not in machine["links"]:
            machine["links"][link] = {
                key: entry[key]
                for key in (
                    "alpha_s",
                    "beta_s_per_byte",
                    "bandwidth_bytes_per_s",
                    "rel_error_median",
                    "rel_error_max",
                    "clamped",
                )
            } | {"from": f"send_recv through {entry['library']}, layout {entry['layout']}, {entry['nodes']} host(s)"}
    return machine


def compute_figures(record: CalibrationRecord) -> dict[str, Any]:
    rank = record.ranks[0]
    figures: dict[str, Any] = {"matmul_flop_per_s": {}, "conv_flop_per_s": {}, "refused": []}
    sized: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in rank.measurements:
        if entry["kind"] == "copy":
            bandwidth = [entry["bytes"] / t for t in entry["times_s"]]
            figures["memory_bandwidth_bytes_per_s"] = stats_figure(bandwidth, bytes_moved=entry["bytes"])
        elif entry["kind"] == "update":
            per_param = [t / entry["elements"] for t in entry["times_s"]]
            figures["update_s_per_param"] = stats_figure(
                per_param, elements=entry["elements"], tensors=entry["tensors"]
            )
        elif entry["kind"] == "first_touch":
            # seconds per byte of memory filled for the first time, beyond filling it again: (fresh − kept) ÷
            # bytes for each pair of order statistics of the two timings (the k-th fastest of each), at least 0
            per_byte = [
                max(0.0, fresh - kept) / entry["bytes"]
                for fresh, kept in zip(sorted(entry["times_s"]), sorted(entry["kept_times_s"]), strict=True)
            ]
            figures["first_touch_s_per_byte"] = stats_figure(per_byte, bytes_filled=entry["bytes"])
        elif entry["kind"] == "alone_collective":
            # zero2's collectives on a group of one: seconds a call, per op and bytes (kernels._alone_collectives)
            by_op = figures.setdefault("alone_collectives", {}).setdefault(entry["op"], [])
            by_op.append(stats_figure(entry["times_s"], bytes=entry["bytes"]))
        elif "error" in entry:
            figures["refused"].append({"kind": entry["kind"], "precision": entry["precision"], "why": entry["error"]})
        else:
            size = entry.get("size", entry.get("shape"))
            flops = [entry["flop"] / t for t in entry["times_s"]]
            key = (f"{entry['kind']}_flop_per_s", entry["precision"])
            sized.setdefault(key, []).append(stats_figure(flops, size=size))
    for (key, precision), by_size in sized.items():
        best = max(by_size, key=lambda figure: figure["value"])
        figures[key][precision] = best | {"by_size": by_size}
    return figures


def link_of(record: CalibrationRecord) -> str:
    return "intra_node" if len(record.hostnames) == 1 else "inter_node"


def collective_figures(record: CalibrationRecord) -> list[dict[str, Any]]:
    """Per collective of a point: its curve (time per size) and its α–β fit."""
    ranks = sorted(record.ranks, key=lambda r: r.rank)
    library = ranks[0].library
    out = []
    ops = list(dict.fromkeys(entry["op"] for entry in ranks[0].measurements))
    for op in ops:
        curve = []
        for index, entry in enumerate(ranks[0].measurements):
            if entry["op"] != op or entry.get("mode") in ("busy", "beside"):
                continue
            per_rank = [rank.measurements[index]["times_s"] for rank in ranks]
            if op == "send_recv":
                times = [t / 2 for t in per_rank[0]]  # half rank 0's round trip
            else:
                times = [max(column) for column in zip(*per_rank, strict=True)]
            time = stats_figure(times)
            algbw = entry["bytes"] / time["value"]
            curve.append(
                {
                    "bytes": entry["bytes"],
                    "time_s": time,
                    "algbw_bytes_per_s": algbw,
                    "busbw_bytes_per_s": algbw * bus_factor(op, len(ranks)),
                }
            )
        fit = fit_alpha_beta([point["bytes"] for point in curve], [point["time_s"]["value"] for point in curve])
        out.append(
            {
                "library": library,
                "link": link_of(record),
                "op": op,
                "ranks": len(ranks),
                "nodes": len(record.hostnames),  # hosts the ranks ran on
                "layout": f"{record.point.nodes}x{record.point.ranks_per_node}",  # as planned: nodes × ranks per node
                "point_id": record.point_id,
                **{key: value for key, value in asdict(fit).items() if key != "sizes"},
                "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                "curve": curve,
            }
            | ({"busy": busy} if (busy := busy_figures(ranks, op)) else {})
            | ({"beside": beside} if (beside := beside_figures(ranks, op)) else {})
        )
    return out


def beside_figures(ranks: list, op: str) -> dict[str, Any] | None:
    """The beside-mode figures of one collective (ddlbench.train.calibration.kernels._beside): per iteration and
    rank, share = (the chain beside the collective − the chain alone) ÷ the collective alone, the share of the
    rank's cores the collective took from its compute. Where the records time the collective beside the chain
    too (`call_beside_s`, from 2026-12-07), per iteration and rank (in_flight_share and stretch)
    (in_flight_figures). Per size the median share (and the two others) with the medians of the times; `share`
    (`in_flight_share`, `stretch`) over every size. None when the point has no beside entries."""
    curve, every = [], {"share": [], "in_flight_share": [], "stretch": []}
    for index, entry in enumerate(ranks[0].measurements):
        if entry["op"] != op or entry.get("mode") != "beside":
            continue
        rows = [rank.measurements[index] for rank in ranks]
        shares = [
            (beside - alone) / call
            for row in rows
            for alone, call, beside in zip(row["compute_s"], row["times_s"], row["beside_s"], strict=True)
            if call > 0
        ]
        if not shares:
            continue
        figures = {"share": shares}
        if all(row.get("call_beside_s") for row in rows):
            pairs = [
                in_flight_figures(alone, call, beside, along)
                for row in rows
                for alone, call, beside, along in zip(
                    row["compute_s"], row["times_s"], row["beside_s"], row["call_beside_s"], strict=True
                )
                if call > 0
            ]
            figures |= {
                "in_flight_share": [f[0] for f in pairs if f is not None],
                "stretch": [f[1] for f in pairs if f is not None],
            }
        times = (("call_s", "times_s"), ("compute_s", "compute_s"), ("beside_s", "beside_s"))
        times += (("call_beside_s", "call_beside_s"),) if "stretch" in figures else ()
        for name, values in figures.items():
            every[name] += values
        curve.append(
            {"bytes": entry["bytes"]}
            | {name: stats_figure(values) for name, values in figures.items() if values}
            | {name: statistics.median(t for row in rows for t in row[key]) for name, key in times}
        )
    if not curve:
        return None
    return {name: stats_figure(values) for name, values in every.items() if values} | {"curve": curve}


def in_flight_figures(alone: float, call: float, beside: float, along: float) -> tuple[float, float] | None:
    """One beside iteration's (in_flight_share, stretch): the chain of products alone (`alone` s), the collective
    alone (`call`), the chain beside the collective (`beside`) and the collective beside the chain (`along`, from
    its start to its end). in_flight_share = (beside − alone) ÷ min(along, beside): the share of its speed the
    chain lost while the collective was in flight; stretch = along ÷ call: how much longer the collective ran
    beside compute than alone. Where it outlasted the chain (the chain is BESIDE_CHAIN collectives long), its last
    part ran beside its peer's chain, still running, rather than alone: counting that part as beside compute keeps
    the figure bounded, where pricing it at the alone speed (the first version: overlap ÷ (call − tail)) grew
    without bound as the tail neared the call and failed a CI run beside other tests. None where nothing has a
    length."""
    overlap = min(along, beside)
    if overlap <= 0 or call <= 0:
        return None
    return (beside - alone) / overlap, along / call


def busy_figures(ranks: list, op: str) -> dict[str, Any] | None:
    """The busy-mode figures of one collective (ddlbench.train.calibration.kernels): per size and burst the mean
    seconds of a call over every rank's calls (a mean: a step pays every call's cost, the rare slow one
    included; send_recv: half the round trip) and of the compute before it, and the fit of
    ddlbench.analysis.machine.fit.fit_busy over them. None when the point has no busy entries."""
    curve, rows = [], []
    for index, entry in enumerate(ranks[0].measurements):
        if entry["op"] != op or entry.get("mode") != "busy":
            continue
        times = [t for rank in ranks for t in rank.measurements[index]["times_s"]]
        bursts = [t for rank in ranks for t in rank.measurements[index]["burst_s"]]
        if op == "send_recv":
            times = [t / 2 for t in times]
        mean, burst = math.fsum(times) / len(times), math.fsum(bursts) / len(bursts)
        curve.append({"bytes": entry["bytes"], "burst_s": burst, "mean_s": mean, "n": len(times)})
        rows.append((float(entry["bytes"]), burst, mean))
    if len(rows) < 3:
        return None
    return fit_busy(rows) | {"curve": curve}


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: a machine file is read by people too."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write_machine(path: Path, machine: dict[str, Any]) -> None:
    header = (
        "# ddlbench machine file (ddlbench.analysis.machine.machine_file): figures with their unit in the key's name;\n"
        "# measured ones give the median over iterations (value), its 95 % CI and n.\n"
    )
    write_text_atomic(path, header + yaml.dump(machine, Dumper=_PlainDumper, sort_keys=False, width=110))


def read_machine(path: Path) -> dict[str, Any]:
    """A machine file, checked for its version and keys."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DdlbenchError(f"cannot read machine file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise DdlbenchError(f"machine file {path} is not a mapping")
    if data.get("machine_version") != MACHINE_VERSION:
        raise DdlbenchError(
            f"machine file {path}: machine_version {data.get('machine_version')!r} unknown; this ddlbench reads "
            f"{MACHINE_VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise DdlbenchError(f"machine file {path} lacks {', '.join(missing)}; required: {', '.join(REQUIRED_KEYS)}")
    for where, value in _figures(data, ""):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            # YAML 1.1 reads 6.7e13 (no sign in the exponent) as a string: write 6.7e+13
            raise DdlbenchError(f"machine file {path}: {where} is {value!r}, not a number (write exponents as 1.5e+13)")
    if "layer_profiles" in data:  # the key's earlier name: machine files written with it still read
        data.setdefault("layer_timings", data.pop("layer_profiles"))
    check_layer_timings(data.get("layer_timings"), f"machine file {path}")
    return data


NUMERIC_KEYS = (
    "value",
    "alpha_s",
    "beta_s_per_byte",
    "beta_s_per_sample",
    "bandwidth_bytes_per_s",
    "ci_low",
    "ci_high",
    "memory_bytes",
    "per_unit_s",
    "per_tensor_s",
    "per_byte_s",
)


def _figures(node: Any, where: str):
    """(path, value) of every numeric key in a machine file."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key in NUMERIC_KEYS:
                yield path, value
            else:
                yield from _figures(value, path)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _figures(value, f"{where}[{index}]")
