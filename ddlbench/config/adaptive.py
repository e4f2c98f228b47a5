"""The sweep's `adaptive` key: what the adaptive sweep models, how it samples, when it stops.

Validated with the rest of the sweep (ddlbench.config), so a bad setting is refused before anything runs;
ddlbench.sampling runs the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddlbench.errors import ConfigError

# the figures an empirical scaling model is fitted to; ddlbench.analysis.empirical.series computes each,
# with its unit and formula (its FIGURES)
MODELLED_FIGURES = ("samples_per_s", "step_time_s", "speedup", "efficiency", "cost_node_h_per_epoch", "cost_per_epoch")
# parameters a series may be modelled over: the numeric fields of a configuration
NUMERIC_PARAMETERS = ("nodes", "ranks_per_node", "world_size", "batch_size", "threads", "micro_batches", "split")


@dataclass(frozen=True, kw_only=True)
class AdaptiveSettings:
    over: str = "batch_size"  # the one parameter the model is a function of
    figure: str = "step_time_s"  # the figure modelled, whose band decides
    initial: int = 3  # points of the first round per series: its smallest (cheapest) values
    per_round: int = 1  # points added per later round
    max_rounds: int = 8
    target_band: float = 0.05  # stop when every unmeasured value's 95 % interval is within ±this share
    budget_node_s: float | None = None  # stop once the measured points cost this many node-seconds
    budget_share: float | None = None  # … or this share of the full sweep's estimated cost
    steps: int = 4  # measured steps per sampled point (the sweep's own count is the full sweep's)
    warmup_steps: int = 1
    repetitions: int = 1
    per_launch: int = 8  # short runs of one layout measured in one launch (1: each its own launch)


KEYS = tuple(AdaptiveSettings.__dataclass_fields__)


def adaptive_settings(raw: dict[str, Any] | None) -> AdaptiveSettings:
    """Validate the `adaptive` mapping; every refusal names the key and what it accepts."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"adaptive.{unknown[0]}", f"unknown setting; accepted: {', '.join(KEYS)}")
    if raw.get("over", "batch_size") not in NUMERIC_PARAMETERS:
        raise ConfigError(
            "adaptive.over", f"{raw['over']!r} is not a parameter; choose from {', '.join(NUMERIC_PARAMETERS)}"
        )
    if raw.get("figure", "step_time_s") not in MODELLED_FIGURES:
        raise ConfigError("adaptive.figure", f"{raw['figure']!r} unknown; choose from {', '.join(MODELLED_FIGURES)}")
    for key, lowest in (
        ("initial", 2),
        ("per_round", 1),
        ("max_rounds", 1),
        ("steps", 1),
        ("warmup_steps", 0),
        ("repetitions", 1),
        ("per_launch", 1),
    ):
        value = raw.get(key, getattr(AdaptiveSettings, key))
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise ConfigError(f"adaptive.{key}", f"{value!r} is not accepted; give an integer >= {lowest}")
    band = raw.get("target_band", AdaptiveSettings.target_band)
    if isinstance(band, bool) or not isinstance(band, int | float) or not 0 < band < 1:
        raise ConfigError("adaptive.target_band", f"{band!r} is not accepted; give a share between 0 and 1, e.g. 0.05")
    budget = raw.get("budget_node_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0):
        raise ConfigError(
            "adaptive.budget_node_s", f"{budget!r} is not accepted; give a positive number of node-seconds"
        )
    share = raw.get("budget_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1):
        raise ConfigError(
            "adaptive.budget_share", f"{share!r} is not accepted; give a share between 0 and 1, e.g. 0.05"
        )
    return AdaptiveSettings(**raw)
