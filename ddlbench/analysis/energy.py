"""A point's energy over its measured window, from what its ranks read (ddlbench.train.energy reads it)."""

from __future__ import annotations

import math
from typing import Any

from ddlbench.point import Point
from ddlbench.records import EnergyReading, RankResult

NOT_MEASURABLE = "not measurable here"


def energy_figures(point: Point, ranks: list[RankResult]) -> dict[str, Any]:
    """The point's energy figures (records.Metrics' energy fields).

    A counter belongs to a place, not to a rank: two ranks on one GPU read the same counter, so a GPU counts
    once, keyed by (host, UUID), and a RAPL package once, keyed by (host, domain) (local rank 0 of each host
    reads RAPL; the key guards against a second reader). The lowest rank's reading of each is kept.

    - energy_j = Σ over distinct GPUs of the GPU's counter difference over its window (J);
      energy_uncertainty_j = Σ of their uncertainties (J; bounds add: the counters are refreshed on one
      driver's schedule, their errors need not cancel);
    - cpu_package_energy_j, cpu_package_uncertainty_j: the same over distinct RAPL packages (J);
    - samples_per_j = global_batch_size × steps ÷ energy_j (samples/J): the global samples of every measured
      step (the counters span them all, warm-up-dropped steps included) per joule the GPUs drew;
      samples_per_j_uncertainty = samples_per_j × energy_uncertainty_j ÷ energy_j (samples/J, first order).
      None without GPU energy, or when a GPU's window is under 1 s (`energy_too_short`: energy_j is kept).
    - energy_note: how the energy was read, or "not measurable here: no NVML, no RAPL" where neither was.
    """
    gpus, packages = distinct_readings(ranks, "gpu"), distinct_readings(ranks, "cpu-package")
    too_short = any(reading.too_short for reading in gpus)
    figures: dict[str, Any] = {"energy_gpus": len(gpus), "energy_too_short": too_short}
    figures["energy_note"] = energy_note(ranks, gpus, packages, too_short)
    if gpus:
        energy = math.fsum(reading.energy_j for reading in gpus)
        uncertainty = math.fsum(reading.uncertainty_j for reading in gpus)
        figures |= {"energy_j": energy, "energy_uncertainty_j": uncertainty}
        if not too_short and energy > 0:
            per_joule = point.global_batch_size * point.steps / energy
            figures |= {"samples_per_j": per_joule, "samples_per_j_uncertainty": per_joule * uncertainty / energy}
    if packages:
        figures["cpu_package_energy_j"] = math.fsum(reading.energy_j for reading in packages)
        figures["cpu_package_uncertainty_j"] = math.fsum(reading.uncertainty_j for reading in packages)
    if gpus or packages:
        figures["energy_window_s"] = max(reading.window_s for reading in (gpus or packages))
    return figures


def distinct_readings(ranks: list[RankResult], boundary: str) -> list[EnergyReading]:
    """The readings of this boundary, one per (host, device), the lowest rank's."""
    kept: dict[tuple[str, str], EnergyReading] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        for reading in rank.energy:
            if reading.boundary == boundary:
                kept.setdefault((rank.hostname, reading.device), reading)
    return list(kept.values())


def energy_note(
    ranks: list[RankResult], gpus: list[EnergyReading], packages: list[EnergyReading], too_short: bool
) -> str:
    """What was read, by which method; where a part is missing, why in two words (no NVML, no GPU, no RAPL)."""
    no_nvml = any(
        "no NVML" in rank.energy_note or (rank.gpu_facts is not None and rank.gpu_facts.source.startswith("no NVML"))
        for rank in ranks
    )
    gpu_part = f"{len(gpus)} GPU(s) by {_methods(gpus)}" if gpus else ("no NVML" if no_nvml or not ranks else "no GPU")
    hosts = len({rank.hostname for rank in ranks if any(r.boundary == "cpu-package" for r in rank.energy)})
    cpu_part = f"{len(packages)} CPU package(s) on {hosts} host(s) by {_methods(packages)}" if packages else "no RAPL"
    if not gpus and not packages:
        return f"{NOT_MEASURABLE}: {gpu_part}, {cpu_part}"
    note = f"{gpu_part}; {cpu_part}"
    if too_short:
        window = min(reading.window_s for reading in gpus if reading.too_short)
        note += f"; a GPU's window of {window:.2g} s is under 1 s: too short to read, no samples per joule"
    return note


def _methods(readings: list[EnergyReading]) -> str:
    return ", ".join(sorted({reading.method for reading in readings}))
