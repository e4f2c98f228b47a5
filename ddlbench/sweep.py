"""Expansion of a sweep config into its points: a pure function, each point with a stable id."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from ddlbench.catalog import STRATEGIES
from ddlbench.config import AXES, SweepConfig, sweep_config_from_mapping
from ddlbench.errors import ConfigError
from ddlbench.point import Point
from ddlbench.validity import why_skipped


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
        if not data.get(values["dataset"]):
            layout["loader_workers"] = 0  # synthetic data stays resident: no loader, whatever the axis says
        fixed = (
            values
            | layout
            | {
                "warmup_steps": config.warmup_steps,
                "steps": config.steps,
                "seed": config.seed,
                "learning_rate": config.learning_rate,
                "timeout_s": config.timeout_s,
                "model_options": model_options[values["model"]],
                "strategy_options": _changed_options(values["strategy"], strategy_options.get(values["strategy"], ())),
                "data_path": data.get(values["dataset"], ""),
                "oversubscribe": config.oversubscribe,
                "share_gpus": config.share_gpus,
                "host_allocator": config.host_allocator,
                "trace_steps": min(config.trace_steps, config.steps),
                "replay_steps": config.replay_steps,
            }
        )
        points = [Point(**fixed, repetition=repetition) for repetition in range(config.repetitions)]
        # whether a configuration is excluded or cannot run does not depend on its repetition: decided once
        if _is_excluded(values, config.exclude):
            excluded.update(dict.fromkeys(points))
        elif (reason := why_skipped(points[0])) is not None:
            for point in points:
                skipped.setdefault(point, reason)
        elif points[0].nodes == 1 and config.each_node:
            kept.update((replace(point, node=node), None) for point in points for node in config.each_node)
        else:
            kept.update(dict.fromkeys(points))
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
