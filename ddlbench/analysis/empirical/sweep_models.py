"""A sweep's scaling models, as its `scaling:` key asks: the series of its table over `over` (nodes by
default), each modelled (Extra-P's normal form, ddlbench.analysis.empirical.modelling) and evaluated where
the key says (`at`), else at 2× and 4× the largest measured value of a single parameter. What
models.json holds; the report draws it. Torch-free (numpy).

The series are independent: with many of them (a study's thousands) they are fitted in forked worker
processes, one per CPU this process may use (ddlbench.parallel); each model is the one a single process
fits."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pandas as pd

from ddlbench.analysis.empirical.modelling import model_series
from ddlbench.analysis.empirical.series import series_from_table
from ddlbench.config import SweepConfig
from ddlbench.errors import DdlbenchError
from ddlbench.parallel import start_forked

SERIES_PER_WORKER = 100  # below this many series a worker process costs more than it saves
DEFAULT_FIGURES = ("step_time_s", "samples_per_s", "speedup", "efficiency", "cost_node_h_per_epoch")


def sweep_models(config: SweepConfig, table: pd.DataFrame) -> dict[str, Any]:
    """{"over": [...], "models": [...]} of the sweep's table, or with "why" there are none."""
    return start_sweep_models(config, table)()


def start_sweep_models(config: SweepConfig, table: pd.DataFrame) -> Callable[[], dict[str, Any]]:
    """sweep_models begun: the series are made and checked now (a DdlbenchError here), the models fitted
    by forked workers while this process goes on (ddlbench.parallel.start_forked); the function returned
    waits for them."""
    scaling = config.to_dict()["scaling"]
    over = tuple(scaling.get("over", ["nodes"]))
    price = scaling.get("price_per_node_hour")
    epoch_samples = scaling.get("epoch_samples")
    figures = (*DEFAULT_FIGURES, *(("cost_per_epoch",) if price else ()))
    series = series_from_table(
        table, over=over, figures=figures, epoch_samples=epoch_samples, price_per_node_hour=price
    )
    if not series:
        why = (
            f"no series over {', '.join(over)} with 2 or more measured points; a sweep needs several values "
            "of the parameter, each with a successful record"
        )
        return lambda: {"over": list(over), "models": [], "why": why}
    given = scaling.get("at") or {}
    if given and sorted(given) != sorted(over):
        raise DdlbenchError(
            f"scaling.at names {', '.join(sorted(given))}; it needs a list for each parameter of scaling.over "
            f"({', '.join(over)}) and no other"
        )
    at = list(itertools.product(*(map(float, given[name]) for name in over))) if given else []
    method = scaling.get("method", "ddlbench")
    fitted = start_model_all(series, method=method, at=at)
    return lambda: {"over": list(over), "models": fitted()}


def model_all(series: list, *, method: str, at: list[tuple[float, ...]], workers: int | None = None) -> list[dict]:
    """model_series of every series (at `at`, or where `beyond` says), in order, over the CPUs this
    process may use where there are many (ddlbench.parallel)."""
    return start_model_all(series, method=method, at=at, workers=workers)()


def start_model_all(
    series: list, *, method: str, at: list[tuple[float, ...]], workers: int | None = None
) -> Callable[[], list[dict]]:
    """model_all begun by forked workers (ddlbench.parallel.start_forked); the function returned waits."""
    tasks = [(s, method, at or beyond(s)) for s in series]
    return start_forked(_model, tasks, least=SERIES_PER_WORKER, workers=workers)


def _model(task: tuple) -> dict[str, Any]:
    series, method, at = task
    return model_series(series, method=method, at=at)


def beyond(series) -> list[tuple[float, ...]]:
    """Where a single-parameter series is evaluated without `at`: 2× and 4× its largest measured value."""
    if len(series.parameters) != 1:
        return []
    largest = max(x[0] for x in series.x)
    return [(2 * largest,), (4 * largest,)]
