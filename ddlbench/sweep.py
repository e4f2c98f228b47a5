"""Expansion of a sweep config into its points: a pure function, each point with a stable id."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import asdict, dataclass
from typing import Any

from ddlbench.catalog import STRATEGIES
from ddlbench.config import AXES, SweepConfig, sweep_config_from_mapping
from ddlbench.errors import ConfigError
from ddlbench.validity import why_skipped

POINT_ID_PATTERN = r"[a-z0-9_]+(?:-[a-z0-9_]+)*"


@dataclass(frozen=True, kw_only=True)
class Point:
    """One benchmark run: everything a launcher needs, and nothing that depends on where it runs."""

    model: str
    dataset: str
    strategy: str
    nodes: int
    ranks_per_node: int
    batch_size: int  # samples per rank per step
    threads: int
    repetition: int
    warmup_steps: int
    steps: int
    seed: int
    learning_rate: float
    timeout_s: float
    model_options: tuple[tuple[str, str], ...] = ()
    # fields below are left out of the canonical spec at their defaults, so points that do not use
    # them keep the ids (and records) they had before the fields existed
    micro_batches: int = 1  # pieces each replica's batch is cut into (pipelines); 1 elsewhere
    split: int = 1  # ranks that share one model replica (world size for model/pipeline/tensor/ParaDL splits)
    strategy_options: tuple[tuple[str, str], ...] = ()  # the strategy's options that differ from its defaults
    data_path: str = ""  # real data to read; "" is synthetic data

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def resolved_strategy_options(self) -> dict[str, str]:
        """The strategy's options with its defaults filled in."""
        return STRATEGIES.get(self.strategy).default_options() | dict(self.strategy_options)

    @property
    def replicas(self) -> int:
        """Data-parallel replicas of the model: world_size // split."""
        return self.world_size // self.split

    @property
    def global_batch_size(self) -> int:
        """Samples consumed per optimizer step by the whole job: batch_size per replica times the replicas."""
        return self.batch_size * self.replicas

    @functools.cached_property
    def spec_hash(self) -> str:
        """sha256 of the canonical spec: names exactly the configuration this point runs."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @functools.cached_property
    def point_id(self) -> str:
        """Readable, stable id: the axes, then a hash of every field, so a changed setting is a new point."""
        digest = self.spec_hash[:8]
        shape = f"-s{self.split}" if 1 < self.split < self.world_size else ""
        micro = f"-mb{self.micro_batches}" if self.micro_batches > 1 else ""
        return (
            f"{self.model}-{self.dataset}-{self.strategy}-n{self.nodes}x{self.ranks_per_node}{shape}"
            f"-b{self.batch_size}{micro}-t{self.threads}-r{self.repetition}-{digest}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["model_options"] = dict(self.model_options)
        data["strategy_options"] = dict(self.strategy_options)
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data[name] == default:
                del data[name]
        return data

    def to_json(self) -> str:
        """Canonical compact JSON; the spec handed to `ddlbench run-point --spec`."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        # cached (outside the fields, so equality is untouched): a 10,000-point plan asks for it 20,000 times
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        fields = dict(data)
        fields["model_options"] = tuple(sorted(dict(fields.get("model_options") or {}).items()))
        fields["strategy_options"] = tuple(sorted(dict(fields.get("strategy_options") or {}).items()))
        return cls(**fields)


_OMITTED_AT_DEFAULT: dict[str, Any] = {"micro_batches": 1, "split": 1, "strategy_options": {}, "data_path": ""}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The points of a sweep, the combinations its `exclude` list dropped, and those that cannot run."""

    config: SweepConfig
    points: tuple[Point, ...]
    excluded: tuple[Point, ...]
    skipped: tuple[tuple[Point, str], ...] = ()  # (point, why it cannot run)

    def by_id(self) -> dict[str, Point]:
        return {point.point_id: point for point in self.points}


def expand_sweep(config: SweepConfig) -> Plan:
    """Config → points, in the order of the axes as written; pure and deterministic."""
    axis_values = [getattr(config, axis) for axis in AXES]
    fields = list(AXES.values())
    kept: dict[Point, None] = {}  # insertion-ordered set: axes a strategy ignores would repeat points
    excluded: dict[Point, None] = {}
    skipped: dict[Point, str] = {}
    model_options, strategy_options, data = (
        dict(config.model_options),
        dict(config.strategy_options),
        dict(config.data),
    )
    for combination in itertools.product(*axis_values):
        values = dict(zip(fields, combination, strict=True))
        layout = resolve_layout(values)
        for repetition in range(config.repetitions):
            point = Point(
                **(values | layout),
                repetition=repetition,
                warmup_steps=config.warmup_steps,
                steps=config.steps,
                seed=config.seed,
                learning_rate=config.learning_rate,
                timeout_s=config.timeout_s,
                model_options=model_options[values["model"]],
                strategy_options=_changed_options(values["strategy"], strategy_options.get(values["strategy"], ())),
                data_path=data.get(values["dataset"], ""),
            )
            if _is_excluded(values, config.exclude):
                excluded[point] = None
            elif (reason := why_skipped(point)) is not None:
                skipped.setdefault(point, reason)
            else:
                kept[point] = None
    if not kept:
        if skipped:
            reasons = sorted(set(skipped.values()))
            raise ConfigError(
                "strategies",
                f"no point of the sweep can run; {len(skipped)} skipped, e.g.: " + "; ".join(reasons[:3]),
            )
        raise ConfigError("exclude", f"removes all {len(excluded)} points of the sweep; nothing would run")
    return Plan(config=config, points=tuple(kept), excluded=tuple(excluded), skipped=tuple(skipped.items()))


def _changed_options(strategy: str, options: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Only the options that differ from the strategy's defaults, so a point's id changes when (and only
    when) a setting is changed; the rank fills the defaults back in (`Point.resolved_strategy_options`)."""
    defaults = STRATEGIES.get(strategy).default_options()
    return tuple((key, value) for key, value in options if defaults.get(key) != value)


def resolve_layout(values: dict[str, Any]) -> dict[str, int]:
    """The split and micro-batches the strategy really uses, from the axes' values.

    Pure data parallelism keeps one rank per replica; a model cut over ranks uses all of them; a
    hybrid takes `split` (0: ranks per node). Only micro-batched strategies keep micro_batches.
    """
    spec = STRATEGIES.get(values["strategy"])
    world = values["nodes"] * values["ranks_per_node"]
    if spec.split_dim is None:
        split = 1
    elif not spec.data_parallel:
        split = world
    else:
        split = values["split"] or values["ranks_per_node"]
    return {"split": split, "micro_batches": values["micro_batches"] if spec.micro_batched else 1}


def _is_excluded(values: dict[str, Any], exclude: tuple[tuple[tuple[str, Any], ...], ...]) -> bool:
    return any(all(values[field] == value for field, value in entry) for entry in exclude)


def plan_sweep(raw: object) -> Plan:
    """Validate a raw sweep mapping (Snakemake's `config`, parsed YAML) and expand it."""
    return expand_sweep(sweep_config_from_mapping(raw))
