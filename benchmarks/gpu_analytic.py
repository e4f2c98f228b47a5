"""The analytical model calibrated on one CUDA GPU and scored there on configurations the calibration never ran
(issue 31, item 6). One script, one short device lease, no Snakemake:

    python benchmarks/gpu_analytic.py                          # a host with one CUDA GPU: about 2 minutes
    python benchmarks/gpu_analytic.py --device cpu --quick     # the same steps on the CPU, tiny (a minute): a
                                                               # smoke run, its figures mean nothing
    python benchmarks/gpu_analytic.py --rescore DIR            # re-fit and re-predict from a run's saved files
                                                               # (its folder or its .tar.gz), no GPU, no torch

1. **Calibration** (`ddlbench.calibrate.calibrate`, suite benchmarks/analytic/gpu_calibration.yaml): compute
   rates, generic operators over drawn shapes and the layer timings of one model (resnet8), every point one
   rank on the GPU → <out>/machine-measured.yaml. Then the **GPU memory calibration**: training points (ddp,
   one rank) of other models than the held-out ones (MEMORY_CALIBRATION), in one group launch; their measured
   tensor peaks fit the CUDA allocator's terms (ddlbench.analysis.analytic.memory.fit_cuda_terms: workspaces
   kept from the first step, the largest call's transient workspace, 512 B block rounding) → <out>/machine.yaml
   (the measured machine plus `cuda_memory`).
2. **Held-out points** (HELD_OUT, fixed before any GPU figure was seen and never tuned to one): models and
   batches no calibration point ran, ddp on one rank (the host's one GPU), warm-up ≥ 2 so the memory probe runs,
   in one group launch (each point measured as alone: ddlbench.launch.group).
3. **Scoring** (`score`, which --rescore runs too, on the saved files only): each held-out point predicted
   from the calibrated machine (ddlbench.analysis.analytic.predict: compute from the operator fits, memory with
   the CUDA terms) beside its measurement: step time (the record's median step) and memory (the tensor peak:
   max_memory_allocated over the probed step, less the baseline and the input pool); accuracy =
   1 − |p − m| / m, means against the targets (≥ 90 % time, ≥ 95 % memory), n; and the calibration's own fit
   (operator fits' leave-one-out errors, the memory fit's residuals, and leave-one-model-out).

Writes under --out (default /tmp/gpu-analytic): the suite as run, the calibration's records and report, both
machine files, every point's record, predictions.json and summary.json; with $OUT set (the device machine's
return folder) also $OUT/gpu-analytic.tar.gz (everything) and $OUT/gpu-analytic-summary.json: a return
folder takes few files. `--rescore` reads either.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "analytic"
if str(REPO) not in sys.path:  # run from a checkout without ddlbench installed (a bare GPU image)
    sys.path.insert(0, str(REPO))

TIME_TARGET, MEMORY_TARGET = 0.90, 0.95
MARKER = ".gpu_analytic"  # a folder this script made (and may clear)
DATASET, STRATEGY = "cifar10", "ddp"

# Fixed on 2026-11-29, before this script had run on any GPU; never to be tuned to GPU figures. The held-out
# models and batches are none of the calibration's: resnet8 is layer-timed, resnet8, vgg16 and alexnet are the
# memory calibration's.
# The first held-out set was scored once, on an H200 on 2026-11-28 (time 64.8 %, memory 91.8 %); the host
# floor (cuda_host, fitted on the memory calibration's steps alone) came after that look, so that set is no
# longer unseen. The second set, added the same day and never run, is the one the headline scores.
SEEN_HELD_OUT = tuple((model, batch) for model in ("resnet20", "vgg11", "resnet18") for batch in (32, 64, 128))
UNSEEN_HELD_OUT = tuple((model, batch) for model in ("mobilenet_v2", "resnet50") for batch in (32, 64, 128))
HELD_OUT = SEEN_HELD_OUT + UNSEEN_HELD_OUT
MEMORY_CALIBRATION = (
    ("resnet8", 32),
    ("resnet8", 128),
    ("vgg16", 32),
    ("vgg16", 128),
    ("alexnet", 32),
    ("alexnet", 128),
)
STEPS = {"warmup": 3, "steps": 20}
# --quick (a CPU smoke run: two cores, about a minute)
QUICK_HELD_OUT = (("resnet20", 4), ("vgg11", 4))
QUICK_MEMORY_CALIBRATION = (("resnet8", 2), ("resnet8", 8), ("vgg16", 2))
QUICK_STEPS = {"warmup": 2, "steps": 3}

log = logging.getLogger("gpu_analytic")


# ---- running ---------------------------------------------------------------------------------------------


def prepare_out(out: Path) -> None:
    """An empty folder at `out`: made, or cleared when an earlier run of this script made it."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise SystemExit(f"{out} holds files this script did not write: give another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by benchmarks/gpu_analytic.py\n")


def check_device(device: str) -> dict[str, Any]:
    """The device the points will run on, as the ranks will see it (their device is CUDA exactly when torch
    sees a GPU: ddlbench.launch.devices); on `cpu` the GPUs are hidden from the ranks."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks (child processes) see no GPU
        import torch

        return {"device": "cpu", "name": "CPU", "torch": torch.__version__}
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU here (run with --device cpu --quick for a smoke run)")
    return {
        "device": "cuda",
        "name": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def training_points(pairs, *, threads: int, steps: dict[str, int]):
    from ddlbench.point import Point

    return [
        Point(
            model=model,
            dataset=DATASET,
            strategy=STRATEGY,
            nodes=1,
            ranks_per_node=1,
            batch_size=batch,
            threads=threads,
            repetition=0,
            warmup_steps=steps["warmup"],  # ≥ 2: the last warm-up step is the memory probe's
            steps=steps["steps"],
            seed=0,
            learning_rate=0.01,
            timeout_s=120.0 if steps is STEPS else 300.0,
        )
        for model, batch in pairs
    ]


def run_points(points, folder: Path, launch_id: str) -> None:
    """The points in one launch (ddlbench.launch.group), each record at <folder>/points/<id>/record.json."""
    from ddlbench.launch.group import run_group

    outs = [folder / "points" / point.point_id / "record.json" for point in points]
    run_group(points, outs=outs, launch_out=folder / "launch.json", launch_id=launch_id, launcher="local")


def calibrate_machine(suite_file: Path, out: Path) -> dict[str, Any]:
    """`ddlbench calibrate` on the suite, its records and report under <out>/calibration; the machine file
    at <out>/machine-measured.yaml."""
    import yaml

    from ddlbench.calibrate import calibrate

    suite = yaml.safe_load(suite_file.read_text()) | {"results_dir": str(out / "calibration")}
    (out / "suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return calibrate(None, raw=suite, out=out / "machine-measured.yaml", launcher="local")


def run(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    prepare_out(out)
    try:
        return _run(args, out)
    finally:  # what was written comes back even when a step failed
        archive(out)


def _run(args: argparse.Namespace, out: Path) -> int:
    started = time.monotonic()
    facts = check_device(args.device)
    # the ranks import ddlbench from this checkout, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    facts |= {"quick": args.quick, "meaningless": args.device != "cuda" or args.quick}
    (out / "run.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(f"device: {facts}", flush=True)
    if facts["meaningless"]:
        print("NOTE: not a GPU run at full size: every figure below only shows that the steps run; none means anything")
    print(f"held out (fixed): {', '.join(f'{m} b{b}' for m, b in (QUICK_HELD_OUT if args.quick else HELD_OUT))}")
    memory_points = QUICK_MEMORY_CALIBRATION if args.quick else MEMORY_CALIBRATION
    print(f"memory calibration: {', '.join(f'{m} b{b}' for m, b in memory_points)}")
    suite_file = HERE / ("gpu_quick_calibration.yaml" if args.quick else "gpu_calibration.yaml")
    threads = int(_yaml(suite_file)["threads"])
    steps = QUICK_STEPS if args.quick else STEPS
    phases: dict[str, float] = {}

    began = time.monotonic()
    machine = calibrate_machine(suite_file, out)
    phases["calibration"] = time.monotonic() - began
    failed = machine.get("failed_points") or []
    print(f"calibration: {phases['calibration']:.0f} s, device {machine['device']}, {len(failed)} point(s) failed")
    for point in failed:
        print(f"  failed: {point['point_id']}: {point['status']}: {point['reason']}")
    if machine["device"]["kind"] != args.device:
        raise SystemExit(f"the calibration ran on {machine['device']['kind']}, not {args.device}")

    began = time.monotonic()
    memory_pairs = QUICK_MEMORY_CALIBRATION if args.quick else MEMORY_CALIBRATION
    run_points(training_points(memory_pairs, threads=threads, steps=steps), out / "memory-calibration", "memory")
    phases["memory_calibration"] = time.monotonic() - began
    terms = write_machine(out)  # fitted before any held-out point runs
    print(
        f"memory calibration: {phases['memory_calibration']:.0f} s; cuda_memory: fixed "
        f"{terms.fixed_bytes / 1e6:.4g} MB, {terms.per_call_byte:.4g} per byte of the largest call's operands, "
        f"blocks of {terms.block_bytes} B"
    )

    began = time.monotonic()
    held_out = QUICK_HELD_OUT if args.quick else HELD_OUT
    run_points(training_points(held_out, threads=threads, steps=steps), out / "held-out", "held-out")
    phases["held_out"] = time.monotonic() - began

    summary = score(out)
    phases["total"] = time.monotonic() - started
    summary |= {"run": facts, "wall_s": phases}
    write_json(out / "summary.json", summary)
    report(summary)
    print(f"wall time: {', '.join(f'{k} {v:.0f} s' for k, v in phases.items())}")
    return 0


def archive(out: Path) -> None:
    """With $OUT set (a device machine's return folder, which takes few files): everything as one .tar.gz
    and the summary beside it."""
    target = os.environ.get("OUT")
    if not target:
        return
    target_dir = Path(target)
    target_dir.mkdir(parents=True, exist_ok=True)
    if out.resolve().is_relative_to(target_dir.resolve()):
        return  # already there
    with tarfile.open(target_dir / "gpu-analytic.tar.gz", "w:gz") as tar:
        tar.add(out, arcname="gpu-analytic")
    if (out / "summary.json").exists():
        shutil.copyfile(out / "summary.json", target_dir / "gpu-analytic-summary.json")
    print(f"archived to {target_dir / 'gpu-analytic.tar.gz'}")


# ---- fitting and scoring (torch-free: --rescore runs them on the saved files) --------------------------------


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def records_in(folder: Path) -> list:
    """The records of a group launch's points (read_record), in the launch's order."""
    from ddlbench.records import read_record

    launch = folder / "launch.json"
    order = [span["point_id"] for span in json.loads(launch.read_text())["points"]] if launch.exists() else []
    records = [read_record(path) for path in sorted((folder / "points").glob("*/record.json"))]
    rank = {point_id: index for index, point_id in enumerate(order)}
    return sorted(records, key=lambda record: rank.get(record.point_id, len(rank)))


def label(record) -> str:
    point = record.point
    return f"{point.model} b{point.batch_size} {point.strategy} {point.world_size} rank(s)"


def measured_of(record) -> tuple[float | None, int | None]:
    """(median step seconds, tensor peak bytes) of a record; None where it has none."""
    metrics = record.metrics
    if record.status != "ok" or metrics is None:
        return None, None
    return metrics.step_time_s.median, metrics.tensor_peak_bytes


def fit_memory(out: Path):
    """The CUDA memory terms fitted to the memory calibration's records, on the measured machine; and the
    fitted rows. On a CPU machine the terms are fitted the same way but never applied (device_kind cpu)."""
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.memory import CudaMemoryTerms, fit_cuda_terms, largest_call_bytes
    from ddlbench.analysis.analytic.predict import introspected_table, predict, resolved_options

    measured_machine = MachineModel.from_file(out / "machine-measured.yaml")
    from dataclasses import replace

    # the prediction the terms are fitted on top of: rounding applied, no workspace (on CUDA)
    bare = replace(measured_machine, cuda_memory=CudaMemoryTerms(fixed_bytes=0.0, per_call_byte=0.0))
    rows = []
    for record in records_in(out / "memory-calibration"):
        _, peak = measured_of(record)
        setting = Setting.of_point(record.point)
        table = introspected_table(setting.model, setting.dataset, resolved_options(setting))
        base = predict(setting, bare, search_batch=False).peak_memory_bytes
        rows.append(
            {
                "label": label(record),
                "group": setting.model,
                "point_id": record.point_id,
                "status": record.status,
                "measured_bytes": peak,
                "base_bytes": base,
                "call_bytes": largest_call_bytes(table, setting.batch_size / max(1, setting.micro_batches)),
            }
        )
    terms, fitted = fit_cuda_terms(rows)
    return terms, fitted, [row for row in rows if not row.get("measured_bytes")]


def write_machine(out: Path, folder: Path | None = None):
    """<folder or out>/machine.yaml: the measured machine plus its fitted `cuda_memory`; returns the terms."""
    from ddlbench.analysis.machine.machine_file import read_machine
    from ddlbench.analysis.machine.machine_file import write_machine as write

    terms, fitted, unmeasured = fit_memory(out)
    machine = read_machine(out / "machine-measured.yaml")
    accuracies = [row["loo_accuracy"] for row in fitted if row["loo_accuracy"] is not None]
    machine["cuda_memory"] = terms.to_dict() | {
        "method": "benchmarks/gpu_analytic.py: measured − predicted tensor peak of the memory calibration's points "
        "= fixed_bytes + per_call_byte × the largest conv/linear call's operands, non-negative least squares on "
        "relative residuals (ddlbench.analysis.analytic.memory.fit_cuda_terms); applied on CUDA machines only",
        "loo_accuracy_mean": sum(accuracies) / len(accuracies) if accuracies else None,
        "fitted_on": fitted,
        "not_measured": [{"label": row["label"], "status": row["status"]} for row in unmeasured],
    }
    machine["cuda_host"] = fit_host(out, machine)
    write((folder or out) / "machine.yaml", machine)
    return terms


HOST_GRID = tuple(1e-6 * 1.05**i for i in range(160))  # 1 µs to about 2.4 ms per layer, 5 % apart


def fit_host(out: Path, machine: dict[str, Any]) -> dict[str, Any]:
    """The host's time to issue one layer (`cuda_host.per_layer_s`, ddlbench.analysis.analytic.compute.host_floor)
    fitted to the memory calibration's measured steps alone: the h of HOST_GRID whose predictions have the
    least mean relative error |p − m| / m over those points; with each model left out in turn, the h fitted
    on the others predicts it (loo_accuracy). Never fitted on the held-out points."""
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict

    points = []
    for record in records_in(out / "memory-calibration"):
        measured, _ = measured_of(record)
        if measured:
            points.append((label(record), record.point.model, Setting.of_point(record.point), measured))
    if not points:
        return {"per_layer_s": None, "method": "no measured memory-calibration point to fit on"}
    predicted = {}
    for h in HOST_GRID:
        model = MachineModel.from_dict(machine | {"cuda_host": {"per_layer_s": h}})
        predicted[h] = [predict(setting, model, search_batch=False).step_time_s for _, _, setting, _ in points]

    def best(keep) -> float:
        def error(h: float) -> float:
            pairs = [(p, m) for p, (_, model, _, m), k in zip(predicted[h], points, keep, strict=True) if k]
            return sum(abs(p - m) / m for p, m in pairs) / len(pairs)

        return min(HOST_GRID, key=error)

    h = best([True] * len(points))
    rows = []
    for index, (name, model, _, measured) in enumerate(points):
        others = [other != model for _, other, _, _ in points]
        loo = best(others) if any(others) else None
        rows.append(
            {
                "label": name,
                "measured_step_s": measured,
                "fitted_step_s": predicted[h][index],
                "accuracy": accuracy(predicted[h][index], measured),
                "loo_step_s": predicted[loo][index] if loo else None,
                "loo_accuracy": accuracy(predicted[loo][index], measured) if loo else None,
            }
        )
    loo_values = [row["loo_accuracy"] for row in rows if row["loo_accuracy"] is not None]
    return {
        "per_layer_s": h,
        "method": "benchmarks/gpu_analytic.py: the memory calibration's measured steps, predicted with a floor of "
        "h per layer forward and 2h backward per block (ddlbench.analysis.analytic.compute.host_floor); h of a "
        "5 % grid from 1 µs with the least mean relative error; applied on CUDA machines only",
        "loo_accuracy_mean": sum(loo_values) / len(loo_values) if loo_values else None,
        "fitted_on": rows,
    }


def accuracy(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return 1.0 - abs(predicted - measured) / measured


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def score(out: Path, *, machine_file: Path | None = None) -> dict[str, Any]:
    """Every held-out point predicted from the machine file beside its measurement, with the means against
    the targets and the calibration's own fit; from the saved files alone (no torch)."""
    from dataclasses import replace

    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict

    machine = MachineModel.from_file(machine_file or out / "machine.yaml")
    plain = replace(machine, cuda_memory=None)  # the tensor model alone, for comparison
    raw = _yaml(machine_file or out / "machine.yaml")
    rows = []
    for record in records_in(out / "held-out"):
        time_s, peak = measured_of(record)
        setting = Setting.of_point(record.point)
        predicted = predict(setting, machine, search_batch=False)
        without = predict(setting, plain, search_batch=False).peak_memory_bytes
        rows.append(
            {
                "label": label(record),
                "point_id": record.point_id,
                "seen": (record.point.model, record.point.batch_size) in SEEN_HELD_OUT,
                "status": record.status,
                "reason": record.reason,
                "predicted_step_s": predicted.step_time_s,
                "measured_step_s": time_s,
                "time_accuracy": accuracy(predicted.step_time_s, time_s),
                "predicted_peak_bytes": predicted.peak_memory_bytes,
                "measured_peak_bytes": peak,
                "memory_accuracy": accuracy(predicted.peak_memory_bytes, peak),
                "predicted_peak_without_cuda_terms_bytes": without,
                "memory_accuracy_without_cuda_terms": accuracy(without, peak),
                "compute_source": predicted.compute_source,
                "memory_detail": predicted.memory_detail,
            }
        )
    write_json(out / "predictions.json", rows)
    unseen = [r for r in rows if not r["seen"]]
    headline = unseen or rows  # a --quick run has no unseen set
    time_mean = mean(r["time_accuracy"] for r in headline)
    memory_mean = mean(r["memory_accuracy"] for r in headline)
    seen = [r for r in rows if r["seen"]]
    return {
        "device": raw.get("device"),
        "torch_version": raw.get("torch_version"),
        "targets": {"time": TIME_TARGET, "memory": MEMORY_TARGET},
        "held_out": rows,
        "headline": "unseen held-out set"
        if unseen
        else "held-out set seen before (not a held-out figure any more)"
        if seen
        else "quick points",
        "n_time": sum(r["time_accuracy"] is not None for r in headline),
        "n_memory": sum(r["memory_accuracy"] is not None for r in headline),
        "time_accuracy_mean": time_mean,
        "memory_accuracy_mean": memory_mean,
        "memory_accuracy_without_cuda_terms_mean": mean(r["memory_accuracy_without_cuda_terms"] for r in headline),
        "time_accuracy_worst": min(
            (r["time_accuracy"] for r in headline if r["time_accuracy"] is not None), default=None
        ),
        "memory_accuracy_worst": min(
            (r["memory_accuracy"] for r in headline if r["memory_accuracy"] is not None), default=None
        ),
        "seen_time_accuracy_mean": mean(r["time_accuracy"] for r in seen) if unseen else None,
        "seen_memory_accuracy_mean": mean(r["memory_accuracy"] for r in seen) if unseen else None,
        "calibration": calibration_fit(out, machine, raw),
    }


def calibration_fit(out: Path, machine, raw: dict[str, Any]) -> dict[str, Any]:
    """How well the calibration fits itself: the operator fits' leave-one-out errors, the memory fit's rows
    (in-sample and with the row's model left out), and the memory calibration's points' step times predicted
    (resnet8 from its own layer timings: circular; the others from the operator fits)."""
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.predict import predict

    operators = []
    for entry in machine.operator_timings:
        model = machine.operator_model_for(
            str(entry["precision"]), int(entry.get("threads", 1)), sharing=int(entry.get("ranks_per_node", 1))
        )
        operators.append(
            {
                "describe": model.describe(),
                "fits": [
                    {
                        "kind": fit.kind,
                        "direction": fit.direction,
                        "samples": fit.samples,
                        "loo_error_median": fit.loo_error_median,
                    }
                    for fit in model.fits.values()
                ],
            }
        )
    times = []
    for record in records_in(out / "memory-calibration"):
        time_s, _ = measured_of(record)
        predicted = predict(Setting.of_point(record.point), machine, search_batch=False)
        times.append(
            {
                "label": label(record),
                "predicted_step_s": predicted.step_time_s,
                "measured_step_s": time_s,
                "time_accuracy": accuracy(predicted.step_time_s, time_s),
                "compute_source": predicted.compute_source,
            }
        )
    memory = raw.get("cuda_memory") or {}
    return {
        "failed_points": raw.get("failed_points") or [],
        "operators": operators,
        "layer_timings": [
            {"model": t.model, "dataset": t.dataset, "ranks_per_node": t.ranks_per_node, "threads": t.threads}
            for t in machine.layer_timings
        ],
        "memory": {key: memory.get(key) for key in ("fixed_bytes", "per_call_byte", "block_bytes", "loo_accuracy_mean")}
        | {"rows": memory.get("fitted_on") or [], "not_measured": memory.get("not_measured") or []},
        "memory_calibration_times": times,
        "host": {key: (raw.get("cuda_host") or {}).get(key) for key in ("per_layer_s", "loo_accuracy_mean")}
        | {"rows": (raw.get("cuda_host") or {}).get("fitted_on") or []},
    }


# ---- printing ---------------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{1e3 * value:.3g} ms"


def mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e6:.4g} MB"


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "no figure"
    return "meets the target" if value >= target else f"{100 * (target - value):.1f} points short"


def report(summary: dict[str, Any]) -> None:
    run = summary.get("run") or {}
    if run.get("meaningless", True) and run:
        print("\nNOTE: a CPU or --quick run: the figures below say nothing of a GPU")
    device = summary.get("device") or {}
    print(f"\nmachine: {device.get('kind')} {device.get('name')}, torch {summary.get('torch_version')}")
    calibration = summary["calibration"]
    for entry in calibration["operators"]:
        print(f"calibration: {entry['describe']}")
        for fit in entry["fits"]:
            print(
                f"  {fit['kind']:>18} {fit['direction']:<8} {fit['samples']:>3} shapes, "
                f"leave-one-out median error {pct(fit['loo_error_median'])}"
            )
    for timings in calibration["layer_timings"]:
        where = f"{timings['model']} on {timings['dataset']} ({timings['ranks_per_node']} rank(s) at once)"
        print(f"calibration: layer timings of {where}")
    memory = calibration["memory"]
    print(
        f"calibration: cuda_memory fixed {mb(memory['fixed_bytes'])}, per call byte {memory['per_call_byte']:.4g}, "
        f"blocks of {memory['block_bytes']} B; leave-one-model-out accuracy {pct(memory['loo_accuracy_mean'])}"
    )
    print(f"  {'memory calibration point':<32} {'measured':>11} {'tensors':>11} {'fitted':>11} {'acc':>8} {'LOMO':>8}")
    for row in memory["rows"]:
        print(
            f"  {row['label']:<32} {mb(row['measured_bytes']):>11} {mb(row['base_bytes']):>11} "
            f"{mb(row['fitted_bytes']):>11} {pct(row['accuracy']):>8} {pct(row['loo_accuracy']):>8}"
        )
    for row in memory["not_measured"]:
        print(f"  {row['label']:<32} not measured ({row['status']})")
    print(f"  {'memory calibration point':<32} {'time pred':>10} {'measured':>10} {'acc':>8}  compute from")
    for row in calibration["memory_calibration_times"]:
        print(
            f"  {row['label']:<32} {ms(row['predicted_step_s']):>10} {ms(row['measured_step_s']):>10} "
            f"{pct(row['time_accuracy']):>8}  {row['compute_source']}"
        )
    host = calibration.get("host") or {}
    if host.get("per_layer_s"):
        print(
            f"calibration: cuda_host {1e6 * host['per_layer_s']:.1f} µs per layer issued (forward; backward twice), "
            f"fitted on the memory calibration's steps; leave-one-model-out accuracy {pct(host['loo_accuracy_mean'])}"
        )
        for row in host["rows"]:
            print(
                f"  {row['label']:<32} {ms(row['fitted_step_s']):>10} {ms(row['measured_step_s']):>10} "
                f"{pct(row['accuracy']):>8}  LOMO {pct(row['loo_accuracy'])}"
            )
    for point in calibration["failed_points"]:
        print(f"calibration point failed: {point['point_id']}: {point['status']}: {point['reason']}")

    print("\nheld out (never run by the calibration): predicted, measured, accuracy = 1 − |p − m| / m")
    print(
        f"{'configuration':<32} {'time pred':>10} {'measured':>10} {'acc':>8} | {'mem pred':>11} {'measured':>11} "
        f"{'acc':>8} | {'no CUDA terms':>13}"
    )
    for row in summary["held_out"]:
        if row["status"] != "ok":
            print(f"{row['label']:<32} {row['status']}: {row['reason']}")
            continue
        print(
            f"{row['label']:<32} {ms(row['predicted_step_s']):>10} {ms(row['measured_step_s']):>10} "
            f"{pct(row['time_accuracy']):>8} | {mb(row['predicted_peak_bytes']):>11} "
            f"{mb(row['measured_peak_bytes']):>11} "
            f"{pct(row['memory_accuracy']):>8} | {pct(row['memory_accuracy_without_cuda_terms']):>13}"
        )
    t, m = summary["time_accuracy_mean"], summary["memory_accuracy_mean"]
    print(f"\nscored on: {summary.get('headline', 'every held-out point')}")
    if summary.get("seen_time_accuracy_mean") is not None:
        print(
            f"(the set seen before the host floor: time {pct(summary['seen_time_accuracy_mean'])}, memory "
            f"{pct(summary['seen_memory_accuracy_mean'])}; not a held-out figure any more)"
        )
    print(
        f"time:   mean accuracy {pct(t)} (worst {pct(summary['time_accuracy_worst'])}), n = {summary['n_time']}, "
        f"target ≥ {100 * TIME_TARGET:.0f} %: {verdict(t, TIME_TARGET)}"
    )
    print(
        f"memory: mean accuracy {pct(m)} (worst {pct(summary['memory_accuracy_worst'])}), n = {summary['n_memory']}, "
        f"target ≥ {100 * MEMORY_TARGET:.0f} %: {verdict(m, MEMORY_TARGET)}; without the CUDA terms "
        f"{pct(summary['memory_accuracy_without_cuda_terms_mean'])}"
    )


# ---- rescoring ----------------------------------------------------------------------------------------------


def rescore(source: Path) -> int:
    """Fit and predict again from a run's saved files (its folder, or the .tar.gz of it): the memory terms
    from machine-measured.yaml and the memory calibration's records, the held-out predictions from them."""
    with tempfile.TemporaryDirectory(prefix="gpu-analytic-rescore-") as scratch:
        folder = source
        if source.is_file():
            with tarfile.open(source) as tar:
                tar.extractall(scratch, filter="data")
            folder = next(Path(scratch).iterdir())
        saved = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
        rescored = Path(scratch) / "rescored"
        rescored.mkdir()
        for name in ("machine-measured.yaml", "memory-calibration", "held-out"):
            target = rescored / name
            if (folder / name).is_dir():
                shutil.copytree(folder / name, target)
            else:
                shutil.copyfile(folder / name, target)
        write_machine(rescored)
        summary = score(rescored)
        summary["run"] = saved.get("run") or {}
        report(summary)
        if saved:
            same = all(
                _close(summary.get(key), saved.get(key)) for key in ("time_accuracy_mean", "memory_accuracy_mean")
            )
            print(f"\nrescored from {source}: {'the same' if same else 'NOT the same'} means as the run's summary.json")
        print(json.dumps({key: summary[key] for key in ("time_accuracy_mean", "memory_accuracy_mean")}))
    return 0


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the points run (default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny calibration and points (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu-analytic"), help="folder of everything written")
    parser.add_argument("--rescore", type=Path, metavar="DIR", help="re-fit and re-predict a run's saved files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    if args.rescore is not None:
        return rescore(args.rescore)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
