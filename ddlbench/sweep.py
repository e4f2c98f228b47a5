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

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def global_batch_size(self) -> int:
        """Samples consumed per optimizer step by the whole job."""
        data_parallel = STRATEGIES.get(self.strategy).data_parallel
        return self.batch_size * (self.world_size if data_parallel else 1)

    @functools.cached_property
    def spec_hash(self) -> str:
        """sha256 of the canonical spec: names exactly the configuration this point runs."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @functools.cached_property
    def point_id(self) -> str:
        """Readable, stable id: the axes, then a hash of every field, so a changed setting is a new point."""
        digest = self.spec_hash[:8]
        return (
            f"{self.model}-{self.dataset}-{self.strategy}-n{self.nodes}x{self.ranks_per_node}"
            f"-b{self.batch_size}-t{self.threads}-r{self.repetition}-{digest}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["model_options"] = dict(self.model_options)
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
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The points of a sweep, and the combinations its `exclude` list dropped."""

    config: SweepConfig
    points: tuple[Point, ...]
    excluded: tuple[Point, ...]

    def by_id(self) -> dict[str, Point]:
        return {point.point_id: point for point in self.points}


def expand_sweep(config: SweepConfig) -> Plan:
    """Config → points, in the order of the axes as written; pure and deterministic."""
    axis_values = [getattr(config, axis) for axis in AXES]
    fields = list(AXES.values())
    kept: list[Point] = []
    excluded: list[Point] = []
    for combination in itertools.product(*axis_values):
        values = dict(zip(fields, combination, strict=True))
        for repetition in range(config.repetitions):
            point = Point(
                **values,
                repetition=repetition,
                warmup_steps=config.warmup_steps,
                steps=config.steps,
                seed=config.seed,
                learning_rate=config.learning_rate,
                timeout_s=config.timeout_s,
                model_options=dict(config.model_options)[values["model"]],
            )
            (excluded if _is_excluded(values, config.exclude) else kept).append(point)
    if not kept:
        raise ConfigError("exclude", f"removes all {len(excluded)} points of the sweep; nothing would run")
    return Plan(config=config, points=tuple(kept), excluded=tuple(excluded))


def _is_excluded(values: dict[str, Any], exclude: tuple[tuple[tuple[str, Any], ...], ...]) -> bool:
    return any(all(values[field] == value for field, value in entry) for entry in exclude)


def plan_sweep(raw: object) -> Plan:
    """Validate a raw sweep mapping (Snakemake's `config`, parsed YAML) and expand it."""
    return expand_sweep(sweep_config_from_mapping(raw))
