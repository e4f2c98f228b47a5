"""`ddlbench certify --level burn-in --duration D`: a node loaded for D, each figure judged at its worst.

RWTH loops HPL and STREAM for hours after a repair; CoreWeave runs 20-30 minute checks on idle nodes; DCGM's
level 3 takes about 15 minutes. What a long load finds that a short one does not is a device that gets worse:
it heats, throttles, drops a clock, logs an error, or computes a wrong number once in a while. So a burn-in
repeats the quick check's loads (ddlbench.certify.quick: a GEMM per precision and a memory copy on every device
of this node) in rounds until D has passed, and judges each figure on its worst runs, not its best or typical:

- `burn-in/matmul_flop_per_s/<precision>[/cuda:i]` (FLOP/s), `burn-in/memory_bandwidth_bytes_per_s[/cuda:i]`
  (B/s): the 5th percentile (WORST_PERCENT) of every timed run's throughput over all rounds, with its 95 %
  interval by order statistics (ddlbench.statistics.quantile_ci: it needs 59 runs or more); the basis also
  gives the median and the first and last rounds' medians (a device that heats up drifts between them). Their
  own family: a 5th percentile is not a median, so neither the quick nor the standard bands apply;
- `burn-in/replay[/cuda:i]` (a check, unit `replays`): each round, each device replays a small training
  computation with deterministic kernels (ddlbench.train.replay: resnet8 on CIFAR-10-shaped data, batch 16,
  REPLAY_STEPS steps); every replay of the node, all rounds and devices, must agree bit for bit. The value is
  the device's odd replays (those whose digest differs from the strict majority's, or whose own passes
  disagree); the finding names the rounds. A device that computes right cold and wrong hot is found here;
- `health/…` (a check): NVML's readings over the whole load (ddlbench.certify.health), sampled between loads.

The node is named by the figures' device suffix and the line's host; the certificate goes into the results
database (kind certificate, suite `burn-in`) for change detection, unlike the quick check's.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddlbench.certify.quick import device_suffix, load_failure, node_devices, node_loads
from ddlbench.certify.replay import is_odd, majority
from ddlbench.history.figures import Figure
from ddlbench.statistics import percentile, quantile_ci

log = logging.getLogger(__name__)

SLICE_S = 2.0  # timed runs of one load per round, before the next load: every load sees every temperature
WORST_PERCENT = 5.0
REPLAY = {"model": "resnet8", "dataset": "cifar10", "batch_size": 16}
REPLAY_STEPS = 2
MIN_DURATION_S = 1.0


@dataclass(frozen=True, kw_only=True)
class BurnIn:
    """What a burn-in measured: its figures, the device name, the rounds run and the seconds they took."""

    figures: list[Figure]
    device: str
    rounds: int
    seconds: float


def burn_in(
    duration_s: float, *, slice_s: float = SLICE_S, replay: bool = True, say: Callable[[str], None] = log.info
) -> BurnIn:
    """Load every device of this node in rounds until `duration_s` has passed (at least one round)."""
    from ddlbench.certify.health import health_figures
    from ddlbench.train.energy import cuda_identity
    from ddlbench.train.health import HealthWatch
    from ddlbench.train.replay import CUBLAS_WORKSPACE_CONFIG

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)  # before cuBLAS makes its handles
    devices, name = node_devices()
    gpus = [(str(device), *cuda_identity(device)) for device in devices if device.type == "cuda"]
    watch = HealthWatch(gpus)
    samples: dict[str, list[float]] = defaultdict(list)
    loads: dict[str, tuple[str, str]] = {}  # figure name -> (unit, what one timed run is)
    failed: dict[str, str] = {}  # figure name -> why a load raised
    round_medians: dict[str, list[float]] = defaultdict(list)
    replays: list[tuple[str, int, dict[str, Any]]] = []
    point = _replay_point()
    began = time.perf_counter()
    rounds = 0
    while rounds == 0 or time.perf_counter() - began < duration_s:
        for device in devices:
            for figure, unit, what, load in node_loads(device):
                loads[f"burn-in/{figure}"] = (unit, what)
                try:
                    _add(samples, round_medians, f"burn-in/{figure}", load(slice_s))
                except RuntimeError as exc:  # failures are data: the figure says why it has no value
                    failed.setdefault(f"burn-in/{figure}", load_failure(exc))
                watch.sample()
            if replay:
                from ddlbench.train.replay import replay_point

                replays.append((str(device), rounds, replay_point(point, device)))
                watch.sample()
        rounds += 1
        say(f"burn-in: round {rounds} done, {time.perf_counter() - began:.0f} s of {duration_s:.0f} s")
    seconds = time.perf_counter() - began
    figures = [
        _worst_figure(figure, values, *loads[figure], round_medians[figure], rounds)
        for figure, values in samples.items()
    ]
    figures += [
        Figure.unmeasured(figure, unit=loads[figure][0], kind="machine", why=why)
        for figure, why in failed.items()
        if figure not in samples
    ]
    if replay:
        figures += replay_check_figures(replays, devices={str(device): device_suffix(device) for device in devices})
    figures += health_figures(watch.finish(), watch.why_not)
    return BurnIn(figures=figures, device=name, rounds=rounds, seconds=seconds)


def _replay_point():
    from ddlbench.point import Point

    return Point(
        **REPLAY, strategy="ddp", nodes=1, ranks_per_node=1, threads=1, repetition=0, warmup_steps=0, steps=1,
        seed=0, learning_rate=0.05, timeout_s=600.0, replay_steps=REPLAY_STEPS,
    )  # fmt: skip


def _add(samples: dict[str, list[float]], medians: dict[str, list[float]], name: str, values: list[float]) -> None:
    samples[name].extend(values)
    medians[name].append(percentile(sorted(values), 50))


def _worst_figure(name: str, values: list[float], unit: str, load: str, medians: list[float], rounds: int) -> Figure:
    """The figure at its worst: the WORST_PERCENT-th percentile of the throughputs, with its interval."""
    ordered = sorted(values)
    interval = quantile_ci(ordered, WORST_PERCENT / 100) or (None, None)
    basis = (
        f"{WORST_PERCENT:g}th percentile of {len(values)} timed runs ({load}) over {rounds} round(s) "
        f"(95 % CI by order statistics{'' if interval[0] is not None else ': none below 59 runs'}); "
        f"median {percentile(ordered, 50):.4g}, first round's median {medians[0]:.4g}, last round's {medians[-1]:.4g}"
    )
    return Figure(
        name=name, unit=unit, kind="machine", value=percentile(ordered, WORST_PERCENT), ci_low=interval[0],
        ci_high=interval[1], n=len(values), basis=basis,
    )  # fmt: skip


def replay_check_figures(replays: list[tuple[str, int, dict[str, Any]]], *, devices: dict[str, str]) -> list[Figure]:
    """One check figure per device: its replays (one a round) against the strict majority of all the node's."""
    common, held, decided = majority(result for _, _, result in replays)
    figures = []
    for label, suffix in devices.items():
        mine = [(round_, result) for device, round_, result in replays if device == label]
        if not decided:
            finding = f"the node's {len(replays)} replays disagree and no majority says which is right"
            value, check = None, "failed"
        else:
            odd = [(r, res) for r, res in mine if is_odd(res, common)]
            finding = "; ".join(
                f"round {r}: " + ("its own passes disagree" if res["digest"] == common else "digest differs")
                + (f" (an injected fault: {res['corrupted']})" if res.get("corrupted") else "")
                for r, res in odd
            )  # fmt: skip
            value, check = len(odd), ("failed" if odd else "pass")
        if len(replays) == 1:
            check, finding = "", ""
        basis = (
            f"{len(mine)} replay(s) of this device, one a round, among the node's {len(replays)}, compared bit for "
            f"bit; {held} hold the most common digest"
        )
        entry = Figure(
            name=f"burn-in/replay{suffix}", unit="replays", kind="replay", value=value, ci_low=None, ci_high=None,
            n=len(mine), basis=basis, why_missing=finding if value is None else "", check=check, finding=finding,
        )  # fmt: skip
        figures.append(entry)
    return figures
