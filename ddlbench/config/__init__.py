"""Sweep configuration: a YAML file validated by a JSON Schema, held as a frozen value object."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES
from ddlbench.catalog.data_layout import find_layout_problem
from ddlbench.config.schema import validate_raw
from ddlbench.errors import ConfigError

# Axis keys of the config (lists) and the point field each one becomes.
AXES: dict[str, str] = {
    "models": "model",
    "datasets": "dataset",
    "strategies": "strategy",
    "nodes": "nodes",
    "ranks_per_node": "ranks_per_node",
    "batch_size": "batch_size",
    "threads": "threads",
    "micro_batches": "micro_batches",
    "split": "split",
    "precision": "precision",
    "channels_last": "channels_last",
    "compile": "compile",
    "loader_workers": "loader_workers",
}

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "workflow" / "config"  # the shipped sweeps
DEFAULT_SWEEP = REPO_CONFIGS / "default.yaml"


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """A validated sweep: axes to combine, measurement settings and exclusions."""

    name: str
    results_dir: str
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    strategies: tuple[str, ...]
    nodes: tuple[int, ...]
    ranks_per_node: tuple[int, ...]
    batch_size: tuple[int, ...]
    threads: tuple[int, ...]
    micro_batches: tuple[int, ...]
    split: tuple[int, ...]
    precision: tuple[str, ...]
    channels_last: tuple[bool, ...]
    compile: tuple[bool, ...]
    loader_workers: tuple[int, ...]
    warmup_steps: int
    steps: int
    repetitions: int
    seed: int
    learning_rate: float
    timeout_s: float
    # model -> complete option mapping (defaults filled), as sorted pairs so the object stays hashable
    model_options: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    exclude: tuple[tuple[tuple[str, Any], ...], ...]
    # strategy -> complete option mapping (defaults filled), like model_options
    strategy_options: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    data: tuple[tuple[str, str], ...] = ()  # dataset -> path of real data; absent datasets are synthetic
    slurm_partition: str | None = None
    slurm_mem_per_rank_mb: int | None = None
    slurm_pinned_one_at_a_time: bool = False
    each_node: tuple[str, ...] = ()  # single-node points run once on each of these nodes
    oversubscribe: bool = False
    alone: bool = False  # locally, one point at a time: none shares the host with another (preflight)
    share_gpus: bool = False
    host_allocator: str = "system"  # system | retain: the ranks' host allocator (ddlbench.launch.command)
    trace_steps: int = 0
    replay_steps: int = 0
    predicted_misfits: str = "run"  # run | skip: points predicted not to fit or finish (analysis.analytic.foresight)
    machine: str = ""  # machine file the points are predicted on ("" none)
    calibrate: str = ""  # calibration suite run first into machine_path ("" none)
    scaling_json: str = "{}"  # the `scaling` mapping (empirical models) as canonical JSON
    adaptive_json: str = "{}"  # the `adaptive` mapping (ddlbench.config.adaptive) as canonical JSON

    @property
    def machine_path(self) -> Path | None:
        """The machine file predictions read: the given one, the calibrated one, or None."""
        if self.machine:
            return Path(self.machine)
        return self.sweep_dir / "machine.yaml" if self.calibrate else None

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able data, defaults filled in (round-trips through from_mapping)."""
        data = asdict(self)
        data["model_options"] = {model: dict(options) for model, options in self.model_options}
        data["exclude"] = [dict(entry) for entry in self.exclude]
        data["strategy_options"] = {strategy: dict(options) for strategy, options in self.strategy_options}
        data["data"] = dict(self.data)
        data["scaling"] = json.loads(data.pop("scaling_json"))
        data["adaptive"] = json.loads(data.pop("adaptive_json"))
        slurm = {
            "partition": data.pop("slurm_partition"),
            "mem_per_rank_mb": data.pop("slurm_mem_per_rank_mb"),
            "pinned_one_at_a_time": data.pop("slurm_pinned_one_at_a_time") or None,
        }
        data["slurm"] = {key: value for key, value in slurm.items() if value is not None}
        data["each_node"] = list(self.each_node)
        if not self.each_node:
            del data["each_node"]  # left out at its default: the config hashes of sweeps before it stand
        if not self.replay_steps:
            del data["replay_steps"]  # likewise
        if self.predicted_misfits == "run":
            del data["predicted_misfits"]  # likewise
        if self.host_allocator == "system":
            del data["host_allocator"]  # likewise
        for key in AXES:
            data[key] = list(data[key])
        return data

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the resolved config; names the config in provenance."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def sweep_dir(self) -> Path:
        return Path(self.results_dir) / self.name

    @property
    def report_path(self) -> Path:
        return self.sweep_dir / "report.html"


def load_sweep_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("", f"cannot read the sweep file {str(path)!r}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("", f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return sweep_config_from_mapping(raw if raw is not None else {})


def sweep_config_from_mapping(raw: object) -> SweepConfig:
    """Validate a raw mapping (from YAML, JSON or Snakemake's `config`) into a SweepConfig."""
    data = validate_raw(raw)
    model_options = _resolve_model_options(data["models"], data["model_options"])
    strategy_options = _resolve_strategy_options(data["strategies"], data["strategy_options"])
    _check_data(data["datasets"], data["data"])
    _check_exclude(data)
    if data["adaptive"]:
        from ddlbench.config.adaptive import adaptive_settings

        adaptive_settings(data["adaptive"])  # refused here, with the key, before anything runs
    if data["predicted_misfits"] == "skip" and not data["machine"]:
        raise ConfigError(
            "predicted_misfits",
            "skip needs `machine` (a machine file the points are predicted on before anything runs); "
            "`calibrate` makes its machine file only once the sweep runs",
        )
    if data["machine"] and data["calibrate"]:
        raise ConfigError(
            "calibrate", "give either `machine` (a machine file) or `calibrate` (a suite to measure one), not both"
        )
    return SweepConfig(
        name=data["name"],
        results_dir=data["results_dir"],
        **{key: tuple(data[key]) for key in AXES},
        warmup_steps=data["warmup_steps"],
        steps=data["steps"],
        repetitions=data["repetitions"],
        seed=data["seed"],
        learning_rate=float(data["learning_rate"]),
        timeout_s=float(data["timeout_s"]),
        model_options=tuple(sorted(model_options.items())),
        exclude=tuple(tuple(sorted(entry.items())) for entry in data["exclude"]),
        strategy_options=tuple(sorted(strategy_options.items())),
        data=tuple(sorted(data["data"].items())),
        slurm_partition=data["slurm"].get("partition"),
        slurm_mem_per_rank_mb=data["slurm"].get("mem_per_rank_mb"),
        slurm_pinned_one_at_a_time=bool(data["slurm"].get("pinned_one_at_a_time", False)),
        each_node=tuple(data["each_node"]),
        oversubscribe=data["oversubscribe"],
        alone=data["alone"],
        share_gpus=data["share_gpus"],
        host_allocator=data["host_allocator"],
        trace_steps=data["trace_steps"],
        replay_steps=data["replay_steps"],
        predicted_misfits=data["predicted_misfits"],
        machine=data["machine"],
        calibrate=data["calibrate"],
        scaling_json=json.dumps(data["scaling"], sort_keys=True),
        adaptive_json=json.dumps(data["adaptive"], sort_keys=True),
    )


def _resolve_model_options(
    models: list[str], given: Mapping[str, Mapping[str, Any]]
) -> dict[str, tuple[tuple[str, str], ...]]:
    def check(choices: tuple[str, ...], value: str) -> str | None:
        return None if value in choices else f"choose from: {', '.join(choices)}"

    return _resolve_options("model", "models", models, given, MODELS, check)


def _resolve_strategy_options(
    strategies: list[str], given: Mapping[str, Mapping[str, Any]]
) -> dict[str, tuple[tuple[str, str], ...]]:
    return _resolve_options(
        "strategy", "strategies", strategies, given, STRATEGIES, lambda option, value: option.check(value)
    )


def _resolve_options(
    kind: str, axis: str, names: list[str], given: Mapping[str, Mapping[str, Any]], registry, check
) -> dict[str, tuple[tuple[str, str], ...]]:
    """Every swept model's (or strategy's) complete options: its defaults, overridden by `given`, which
    may only name swept entries, known options and accepted values (`check(spec option, value)`)."""
    section = f"{kind}_options"
    for name in given:
        if name not in names:
            raise ConfigError(
                f"{section}.{name}", f"{name!r} is not in `{axis}`; options may be given for: {', '.join(names)}"
            )
    resolved = {}
    for name in names:
        spec = registry.get(name)
        options = spec.default_options()
        for option, raw_value in given.get(name, {}).items():
            key = f"{section}.{name}.{option}"
            if option not in spec.options:
                accepted = ", ".join(spec.options) or "none"
                raise ConfigError(key, f"{option!r} is not an option of {name}; accepted: {accepted}")
            value = str(raw_value)
            problem = check(spec.options[option], value)
            if problem:
                raise ConfigError(key, f"{value!r} is not accepted: {problem}")
            options[option] = value
        resolved[name] = tuple(sorted(options.items()))
    return resolved


def _check_data(datasets: list[str], data: Mapping[str, str]) -> None:
    for dataset, path in data.items():
        if dataset not in datasets:
            raise ConfigError(
                f"data.{dataset}", f"{dataset!r} is not in `datasets`; paths may be given for: {', '.join(datasets)}"
            )
        if not DATASETS.get(dataset).real_data:
            raise ConfigError(f"data.{dataset}", f"{dataset} is synthetic only; it reads no real data")
        if not Path(path).exists():
            raise ConfigError(f"data.{dataset}", f"{path!r} does not exist (real data is never downloaded)")
        problem = find_layout_problem(DATASETS.get(dataset), path)
        if problem:
            raise ConfigError(f"data.{dataset}", problem)


def _check_exclude(data: Mapping[str, Any]) -> None:
    """An exclusion naming a value that is on no axis is a typo that would silently exclude nothing."""
    field_to_axis = {field: axis for axis, field in AXES.items()}
    for index, entry in enumerate(data["exclude"]):
        for field, value in entry.items():
            axis = field_to_axis[field]
            if value not in data[axis]:
                choices = ", ".join(str(v) for v in data[axis])
                raise ConfigError(
                    f"exclude[{index}].{field}",
                    f"{json.dumps(value)} is not a value of `{axis}`, so it would exclude nothing; "
                    f"values of `{axis}`: {choices}",
                )
