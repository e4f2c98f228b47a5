"""The searches ddlbench's default is chosen among, by name (ddlbench.analysis.empirical.selection chooses,
out of sample on public series; extrapolation.search_ddlbench applies the choice).

- extrap: Extra-P's search (search.py), the baseline every other candidate must not fall below;
- law: the figure's law over the devices, Amdahl's (laws.amdahl), for a throughput or a per-device
  rate only: for another kind it is no candidate;
- forward: the normal form chosen by forward validation (laws.forward_search);
- extrap+law, extrap+forward: the mean of the two predictions, their bands united (combine.py).

A candidate may also say how its leave-one-out predictions are made faster than by refitting it once per
point (`register_folds`): Extra-P's search and the law have such a way (search.single_fold_predictions,
laws.amdahl_fold_predictions), the same numbers as refitting; the others are refitted (combine.fold_predictions).

A family is the candidates for what is known of the figure: `law` where its kind is a throughput or a
per-device rate, `unknown` where it is not (`ddlbench fit --x … --y …` without --kind).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from ddlbench.analysis.empirical.combine import combine, fold_predictions
from ddlbench.analysis.empirical.laws import amdahl, amdahl_fold_predictions, forward_search
from ddlbench.analysis.empirical.regression import Fit
from ddlbench.analysis.empirical.search import search_extrap, single_fold_predictions
from ddlbench.errors import DdlbenchError

# a search over one parameter: its name, the points (one row each) and their repetitions -> the fit
Search = Callable[[tuple[str, ...], np.ndarray, list[list[float]]], Fit]
LAW_KINDS = ("throughput", "per_device")
FAMILIES = {
    "law": ("extrap", "law", "extrap+law", "forward", "extrap+forward"),
    "unknown": ("extrap", "forward", "extrap+forward"),
}
BASELINE = "extrap"

CANDIDATES: dict[str, Callable[[str], Search]] = {}
# a candidate's leave-one-out predictions over one parameter, where they have a way of their own
FOLDS: dict[str, Callable[[str], Callable[[np.ndarray, list[list[float]]], np.ndarray]]] = {}


def register_candidate(name: str) -> Callable[[Callable[[str], Search]], Callable[[str], Search]]:
    def add(build: Callable[[str], Search]) -> Callable[[str], Search]:
        if name in CANDIDATES:
            raise ValueError(f"candidate {name!r} registered twice")
        CANDIDATES[name] = build
        return build

    return add


def register_folds(name: str):
    def add(build):
        if name in FOLDS:
            raise ValueError(f"folds of {name!r} registered twice")
        FOLDS[name] = build
        return build

    return add


def candidate(name: str, kind: str) -> Search:
    """The search `name` for a figure of `kind` (over one parameter)."""
    if name not in CANDIDATES:
        raise DdlbenchError(f"candidate {name!r} unknown; candidates: {', '.join(CANDIDATES)}")
    return CANDIDATES[name](kind)


def family_of(kind: str) -> str:
    return "law" if kind in LAW_KINDS else "unknown"


@register_candidate("extrap")
def _extrap(kind: str) -> Search:
    return search_extrap


@register_candidate("law")
def _law(kind: str) -> Search:
    if kind not in LAW_KINDS:
        raise DdlbenchError(f"no law for a figure of kind {kind!r}; kinds with one: {', '.join(LAW_KINDS)}")
    return partial(amdahl, per_device=kind == "per_device")


@register_candidate("forward")
def _forward(kind: str) -> Search:
    return partial(forward_search, kind="time" if kind == "time" else "other")


@register_folds("extrap")
def _extrap_folds(kind: str):
    return single_fold_predictions


@register_folds("law")
def _law_folds(kind: str):
    return partial(amdahl_fold_predictions, per_device=kind == "per_device")


def _mean_of(*names: str) -> Callable[[str], Search]:
    def build(kind: str) -> Search:
        searches = [candidate(name, kind) for name in names]

        def search(names_: tuple[str, ...], x: np.ndarray, values: list[list[float]]) -> Fit:
            bound = [partial(s, names_) for s in searches]
            folds = [
                FOLDS[name](kind) if name in FOLDS and len(names_) == 1 else fold_predictions(one)
                for name, one in zip(names, bound, strict=True)
            ]
            return combine([s(x, values) for s in bound], x, values, folds=folds)

        return search

    return build


register_candidate("extrap+law")(_mean_of("extrap", "law"))
register_candidate("extrap+forward")(_mean_of("extrap", "forward"))
