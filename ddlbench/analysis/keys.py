"""What makes two records the same configuration, the same series over nodes, or like for like with ddp.

Every key is derived from the `Point` dataclass itself, never from a hand-kept list, so a field added
to Point separates configurations in every table, figure, speedup and comparison the day it exists:

- configuration: every Point field but `repetition` (repetitions are independent launches of it);
- series: the configuration without `nodes`, and without `split` where the strategy splits the model
  over the whole world (pure model/pipeline/tensor/ParaDL splits, split = world size by definition): a
  line over nodes at a fixed per-replica batch (weak scaling);
- strong series (`strong_series_key`): the series without the per-replica `batch_size`, with the global
  batch (Point.global_batch_size) held equal instead: a line over nodes at a fixed global batch (strong
  scaling), what the report's like-for-like comparisons hold equal;
- comparison (like for like, `comparison_key`; its hash is `baseline_key`): the configuration without
  the fields a strategy owns (`strategy`, `strategy_options`, `split`, `micro_batches`) and without the
  per-replica `batch_size`, with the global batch (Point.global_batch_size = batch_size × world_size //
  split) held equal instead: strategies compared with each other, or with ddp, run the same samples per
  optimizer step on the same nodes, ranks, threads, model, data and precision. (A pipeline of 2 ranks at
  batch 32 runs 32 samples a step; ddp on the same 2 ranks at batch 32 runs 64, at batch 16 it runs 32.)
- replica baseline (`baseline_replica_key`): the configuration without the strategy's own fields only,
  per-replica batch held equal: the fallback when no ddp ran at the same global batch, named as such.

config and series keys are short hashes of the canonical JSON of what they keep (Point.to_dict, which
leaves fields at their defaults out, so a new defaulted field keeps old keys); the comparison key is a
tuple of (field, value) over every comparison field, and its hash the same tuple's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from ddlbench.catalog import STRATEGIES
from ddlbench.point import Point

# the one Point field that does not define a configuration: it numbers launches of the same one
REPETITION_FIELD = "repetition"
POINT_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Point))
CONFIG_FIELDS: tuple[str, ...] = tuple(name for name in POINT_FIELDS if name != REPETITION_FIELD)
# fields a strategy owns: the only ones a point may differ in from the ddp point it is compared with
STRATEGY_FIELDS: tuple[str, ...] = ("strategy", "strategy_options", "split", "micro_batches")
BASELINE_STRATEGY = "ddp"
# the fields two configurations compared like for like may differ in: the strategy's own, and the
# per-replica batch, which a strategy's layout sets so that the global batch is the one held equal
COMPARED_APART: tuple[str, ...] = (*STRATEGY_FIELDS, "batch_size")
COMPARISON_FIELDS: tuple[str, ...] = (
    *(name for name in CONFIG_FIELDS if name not in COMPARED_APART),
    "global_batch_size",
)
# option fields are tuples of pairs on a Point; in tables they are canonical JSON objects
JSON_FIELDS = ("model_options", "strategy_options")
_KEY_LENGTH = 16  # hex digits of sha256: collisions are out of reach for any sweep


def split_follows_world(strategy: str) -> bool:
    """True when the strategy cuts one replica over every rank, so split = world size grows with nodes.

    Unknown names (a strategy since removed) count as not derived: their split then stays in the key."""
    if strategy not in STRATEGIES:
        return False
    spec = STRATEGIES.get(strategy)
    return spec.split_dim is not None and not spec.data_parallel


def point_columns(point: Point) -> dict[str, Any]:
    """One column per Point field, named after it; option tuples as canonical JSON objects."""
    row = {name: getattr(point, name) for name in POINT_FIELDS}
    for name in JSON_FIELDS:
        row[name] = json.dumps(dict(row[name]), sort_keys=True)
    return row


def point_of_row(row: Mapping[str, Any], **changes: Any) -> Point:
    """The Point a table row (point_columns) names, with `changes`; a row without `repetition` (a
    configuration) gets repetition 0. Raises KeyError naming a Point field the row lacks."""
    fields = {name: _plain(row[name]) for name in POINT_FIELDS if name in row} | changes
    fields.setdefault(REPETITION_FIELD, 0)
    for name in JSON_FIELDS:
        if isinstance(fields.get(name), str):
            fields[name] = json.loads(fields[name] or "{}")
    missing = [name for name in POINT_FIELDS if name not in fields]
    if missing:
        raise KeyError(f"a row without the Point fields {', '.join(missing)}")
    return Point.from_dict(fields)


def configuration(point: Point) -> dict[str, Any]:
    """The point's canonical spec without its repetition number."""
    spec = json.loads(point.to_json())  # = to_dict(), from the point's cached canonical JSON (faster)
    spec.pop(REPETITION_FIELD, None)
    return spec


def config_key(point: Point) -> str:
    """Equal for exactly the points that differ in nothing but `repetition`."""
    return _digest(configuration(point))


def series_key(point: Point) -> str:
    """Equal for the configurations that form one line over nodes (strong or weak, as the sweep made it)."""
    spec = configuration(point)
    spec.pop("nodes")
    if split_follows_world(point.strategy):
        spec.pop("split", None)
    return _digest(spec)


def comparison_key(row: Mapping[str, Any] | Point) -> tuple[tuple[str, Any], ...]:
    """Like for like: equal for exactly the configurations that differ in nothing but the strategy's own
    fields (STRATEGY_FIELDS) and the per-replica batch_size, at the same global batch.

    `row` is a Point, or a row of the aggregated table or of the configuration summary (a mapping with
    a column per configuration field, options as canonical JSON, and global_batch_size, which the table
    takes from Point.global_batch_size). A field the row lacks counts as None. The key is a tuple of
    (field, value) pairs in COMPARISON_FIELDS order: hashable, for grouping and dictionary keys."""
    if isinstance(row, Point):
        row = point_columns(row) | {"global_batch_size": row.global_batch_size}
    return tuple((name, _plain(row.get(name))) for name in COMPARISON_FIELDS)


def baseline_key(point: Point) -> str:
    """The comparison key's hash: the ddp configuration a point is compared with has the same one."""
    return _digest(dict(comparison_key(point)))


def baseline_replica_key(point: Point) -> str:
    """Equal for the configurations that differ only in the strategy and its own settings, per-replica
    batch held equal (so a pipeline and ddp then run different global batches)."""
    spec = configuration(point)
    for name in STRATEGY_FIELDS:
        spec.pop(name, None)
    return _digest(spec)


def keys(point: Point) -> dict[str, str]:
    """The five keys at once, from one spec (each key alone builds it again: 10,000 points, seconds)."""
    spec = configuration(point)
    series = {name: value for name, value in spec.items() if name != "nodes"}
    if split_follows_world(point.strategy):
        series.pop("split", None)
    replica = {name: value for name, value in spec.items() if name not in STRATEGY_FIELDS}
    strong = {name: value for name, value in series.items() if name != "batch_size"}
    strong["global_batch_size"] = point.global_batch_size
    return {
        "config_key": _digest(spec),
        "series_key": _digest(series),
        "strong_series_key": _digest(strong),
        "baseline_key": baseline_key(point),
        "baseline_replica_key": _digest(replica),
    }


def _plain(value: Any) -> Any:
    """A table's value as the Point's: numpy scalars as Python ones, missing values (NaN, NA) as None."""
    if value is None or type(value).__name__ == "NAType":  # pandas.NA, without importing pandas here
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _digest(spec: dict[str, Any]) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:_KEY_LENGTH]


def describe(row: dict[str, Any], names: list[str] | tuple[str, ...]) -> str:
    """A short label of a configuration from the named fields (the strategy first, then the others).

    A split is named only for hybrids, where it is a choice (pure data parallelism has 1, pure model
    splits the world size); micro-batches only above 1, where a strategy uses them."""
    strategy = str(row.get("strategy", ""))
    parts = [strategy] if "strategy" in names else []
    for name in names:
        value = row.get(name)
        if name == "strategy":
            continue
        if name == "split":
            if not _is_hybrid(strategy):
                continue
            parts.append(f"split={value}")
        elif name == "micro_batches":
            if int(value or 1) > 1:
                parts.append(f"mb{int(value)}")
        elif name in _SHORT:
            parts.append(_SHORT[name].format(value))
        elif name in JSON_FIELDS:
            options = json.loads(value or "{}")
            parts.append(" ".join(f"{key}={option}" for key, option in sorted(options.items())) or f"{name}=default")
        elif name == "data_path":
            parts.append(f"data={value or 'synthetic'}")
        elif name == "oversubscribe":
            parts.append("oversubscribe" if value else "no oversubscribe")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


_SHORT = {"batch_size": "b{}", "threads": "t{}", "ranks_per_node": "{}/node", "nodes": "n{}"}


def _is_hybrid(strategy: str) -> bool:
    if strategy not in STRATEGIES:
        return True  # unknown: show what there is
    spec = STRATEGIES.get(strategy)
    return spec.split_dim is not None and spec.data_parallel


def varying_fields(rows: list[dict[str, Any]], *, leave_out: tuple[str, ...] = ()) -> list[str]:
    """The configuration fields whose values differ among `rows`, in Point's order: what a legend must name."""
    return [name for name in CONFIG_FIELDS if name not in leave_out and len({str(row.get(name)) for row in rows}) > 1]
