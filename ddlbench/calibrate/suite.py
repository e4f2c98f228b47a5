"""A calibration suite and its points: the microbenchmarks that measure a machine for later models.

A suite (YAML, validated against suite.schema.yaml) expands into points that launch like training
points (the same launchers, local, srun in an allocation or mpirun; the same worker, which dispatches on
the spec's `kind`):
- one `compute` point: one rank timing matrix products and convolutions per precision, and a copy for
  memory bandwidth;
- one `collectives` point per backend and node count: every collective over every message size, within
  a node (1 node × ranks_per_node ranks) or across nodes (n nodes × 1 rank);
- one `layer_timings` point per entry of `layer_timings` and precision: ranks_per_node ranks (the entry's
  `ranks` where it gives them: 1 on a host with one GPU) on one node,
  each training the model alone on synthetic batches and timing every block's forward and backward
  (ddlbench.train.calibration.layer_timing_kernel), all at once, as the ranks of a training point share a node;
- with `fsdp_units`, one `fsdp_units` point per node count, laid out as the collectives' points: FSDP2's
  own cost per unit it shards, on a toy (ddlbench.train.calibration.fsdp_unit_kernel);
- with `spatial_layers`, one `spatial_layers` point per node count, laid out the same way: what spatial
  parallelism adds per layer it runs on slabs, on a toy (ddlbench.train.calibration.spatial_layer_kernel);
- one `operators` point of the most ranks in the suite's `operators.ranks`, on one node, timing generic
  operators (convolutions, norms, activations, pools, linear layers) over drawn shapes, each shape by every
  entry's count of ranks at once in turn, the others waiting at a barrier
  (ddlbench.train.calibration.operator_kernel), for compute predictions of models whose layers nobody timed.
A suite without matmul sizes, convolutions and memory bytes has no compute point; one without
collectives no collective points.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlbench.catalog import DATASETS, MODELS
from ddlbench.config.schema import validate_with
from ddlbench.errors import ConfigError
from ddlbench.train.calibration.point import CalibrationPoint

SCHEMA_PATH = Path(__file__).with_name("suite.schema.yaml")
DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "workflow" / "calibration" / "default.yaml"
OPERATOR_DEFAULTS = {"samples": 24, "seed": 0, "max_flop": 1.5e9, "max_elements": 8388608}


@dataclass(frozen=True, kw_only=True)
class Suite:
    """A validated suite: its settings and its points."""

    name: str
    results_dir: Path
    machine: str | None
    points: tuple[CalibrationPoint, ...]
    settings: dict[str, Any]

    @property
    def folder(self) -> Path:
        """Where the suite's records, report and figures live."""
        return self.results_dir / self.name / "calibration"

    def record_path(self, point: CalibrationPoint) -> Path:
        return self.folder / "points" / point.point_id / "record.json"


@functools.cache
def suite_schema() -> dict[str, Any]:
    """The suite schema with the catalog's model and dataset names filled into the layer timings' enums."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    entry = schema["properties"]["layer_timings"]["items"]["properties"]
    entry["model"]["enum"] = MODELS.names()
    entry["dataset"]["enum"] = DATASETS.names()
    return schema


def load_suite(path: Path | None = None, raw: dict[str, Any] | None = None) -> Suite:
    """The suite of a YAML file (the default suite without one), or of an already parsed mapping."""
    if raw is None:
        path = path or DEFAULT_SUITE
        raw = yaml.safe_load(path.read_text()) or {}
    if isinstance(raw, dict) and "profiles" in raw:
        raise ConfigError("profiles", "this key is now layer_timings (the same entries); rename it")
    data = validate_with(raw, suite_schema(), what="a calibration suite")
    return Suite(
        name=data["name"],
        results_dir=Path(data["results_dir"]),
        machine=data.get("machine"),
        points=expand_suite(data),
        settings=data,
    )


def expand_suite(data: dict[str, Any]) -> tuple[CalibrationPoint, ...]:
    common = dict(
        suite=data["name"],
        threads=data["threads"],
        warmup=data["warmup"],
        iterations=data["iterations"],
        timeout_s=float(data["timeout_s"]),
        oversubscribe=data["oversubscribe"],
        host_allocator=data["host_allocator"],
    )
    points = []
    if data["matmul_sizes"] or data["conv_shapes"] or data["memory_bytes"]:
        points.append(
            CalibrationPoint(
                benchmark="compute",
                backend="",
                nodes=1,
                ranks_per_node=1,
                precisions=tuple(data["precisions"]),
                matmul_sizes=tuple(data["matmul_sizes"]),
                conv_shapes=tuple(tuple(shape) for shape in data["conv_shapes"]),
                memory_bytes=data["memory_bytes"],
                alone_collective_bytes=tuple(sorted(data.get("alone_collective_bytes") or ())),
                **common,
            )
        )
    for backend in data["backends"] if data["collectives"] else ():
        for nodes in data["nodes"]:
            points.append(
                CalibrationPoint(
                    benchmark="collectives",
                    backend=backend,
                    nodes=nodes,
                    ranks_per_node=data["ranks_per_node"] if nodes == 1 else 1,
                    collectives=tuple(data["collectives"]),
                    message_bytes=tuple(sorted(data["message_bytes"])),
                    **common,
                )
            )
    for nodes in data["nodes"] if data.get("fsdp_units") else ():
        ranks = data["ranks_per_node"] if nodes == 1 else 1  # ≥ 2 ranks either way (the schema's minimums)
        points.append(
            CalibrationPoint(
                benchmark="fsdp_units", backend="", nodes=nodes, ranks_per_node=ranks, precisions=("fp32",), **common
            )
        )
    for nodes in data["nodes"] if data.get("spatial_layers") else ():
        ranks = data["ranks_per_node"] if nodes == 1 else 1
        points.append(
            CalibrationPoint(
                benchmark="spatial_layers",
                backend="",
                nodes=nodes,
                ranks_per_node=ranks,
                precisions=("fp32",),
                **common,
            )
        )
    for index, entry in enumerate(data.get("layer_timings", [])):
        options = resolve_model(entry, f"layer_timings[{index}]")
        for precision in data["precisions"]:
            points.append(
                CalibrationPoint(
                    benchmark="layer_timings",
                    backend="",
                    nodes=1,
                    ranks_per_node=entry.get("ranks", data["ranks_per_node"]),
                    precisions=(precision,),
                    model=entry["model"],
                    dataset=entry["dataset"],
                    model_options=options,
                    batch_sizes=tuple(sorted(entry["batch_sizes"])),
                    **common,
                )
            )
    operators = data.get("operators")
    if operators is not None:
        settings = OPERATOR_DEFAULTS | operators
        # one launch of the most ranks, each shape timed by every count of ranks in turn (the others idle at
        # a barrier): the counts then see the same load on the host, where separate launches minutes apart
        # saw different loads (two calibrations put the two-rank/one-rank ratio anywhere from 0.90 to 1.84)
        at_once = tuple(sorted(settings.get("ranks") or {1, data["ranks_per_node"]}))
        points.append(
            CalibrationPoint(
                benchmark="operators",
                backend="",
                nodes=1,
                ranks_per_node=at_once[-1],
                precisions=tuple(data["precisions"]),
                operator_samples=settings["samples"],
                operator_seed=settings["seed"],
                operator_max_flop=float(settings["max_flop"]),
                operator_max_elements=settings["max_elements"],
                operator_at_once=at_once,
                **common,
            )
        )
    if not points:
        raise ConfigError(
            "",
            "the suite measures nothing: give matmul_sizes, conv_shapes, memory_bytes, collectives, layer_timings, "
            "operators, fsdp_units or spatial_layers",
        )
    return tuple(points)


def resolve_model(entry: dict[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    """A layer_timings entry's complete model options (the model's defaults, overridden by its own), after checking
    that the model takes the dataset's input and accepts each option and value."""
    model, dataset = MODELS.get(entry["model"]), DATASETS.get(entry["dataset"])  # names: checked by the schema
    if model.input_kind != dataset.input_kind:
        takes = [name for name in DATASETS.names() if DATASETS.get(name).input_kind == model.input_kind]
        raise ConfigError(
            f"{key}.dataset",
            f"{dataset.name!r} gives {dataset.input_kind} input; {model.name} takes {model.input_kind}: "
            f"choose from: {', '.join(takes)}",
        )
    options = model.default_options()
    for option, raw_value in entry.get("options", {}).items():
        if option not in model.options:
            accepted = ", ".join(model.options) or "none"
            raise ConfigError(
                f"{key}.options.{option}", f"{option!r} is not an option of {model.name}; accepted: {accepted}"
            )
        value = str(raw_value)
        if value not in model.options[option]:
            choices = ", ".join(model.options[option])
            raise ConfigError(f"{key}.options.{option}", f"{value!r} is not accepted: choose from: {choices}")
        options[option] = value
    return tuple(sorted(options.items()))


def calibration_cores(path: str | Path) -> int:
    """Cores a suite's busiest point keeps busy (ranks on one host × threads): what a workflow grants it."""
    suite = load_suite(Path(path))
    return max((point.ranks_per_node * point.cores_per_rank for point in suite.points), default=1)
