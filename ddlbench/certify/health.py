"""The health figures of a certificate: one check per GPU from NVML's readings over a load
(ddlbench.train.health reads them and says what is wrong), or one figure saying why nothing was read.

- `health/<label>` (unit findings; a node level's label is `cuda:<i>`, the suite's the GPU's UUID with the
  node set): value = the GPU's findings, `pass` with none, `failed` naming each; n = NVML samples;
- `health/gpus` without a value where nothing could be read ("not measurable here: no NVML: <why>"), listed
  unjudged: a CPU partition's certificate says so rather than leave the figure out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ddlbench.history.figures import Figure
from ddlbench.records import PointRecord
from ddlbench.train.health import GpuHealth


def health_figures(healths: list[GpuHealth], why_not: str) -> list[Figure]:
    """One `health/<label>` check figure per GPU (value: its findings), or one `health/gpus` figure without a
    value that says why nothing could be read (no NVML)."""
    if not healths:
        return [_unmeasured("health/gpus", why_not)] if why_not else []
    figures = []
    for health in healths:
        name = f"health/{health.label}"
        if health.why_missing:
            figures.append(_unmeasured(name, health.why_missing))
            continue
        samples = int(health.readings.get("samples") or 0)
        figures.append(
            Figure(
                name=name, unit="findings", kind="health", value=float(len(health.findings)), ci_low=None,
                ci_high=None, n=samples, check="failed" if health.findings else "pass",
                finding="; ".join(health.findings),
                basis=f"NVML over {samples} samples under load: clocks-event reasons, temperature, power, PCIe "
                "link; ECC, retired pages and remapped rows before and after; XID events between",
            )
        )  # fmt: skip
    return figures


def _unmeasured(name: str, why: str) -> Figure:
    """A health figure with nothing read: no check, so it neither passes nor fails a certificate."""
    return Figure(
        name=name, unit="findings", kind="health", value=None, ci_low=None, ci_high=None, n=0, basis=why,
        why_missing=why,
    )  # fmt: skip


def record_health_figures(records: Iterable[PointRecord]) -> list[Figure]:
    """The standard suite's health figures: each rank's reading of its GPU around its point
    (RankResult.health), one figure per GPU and node (the last point's reading where several ran on it),
    or one `health/gpus` figure saying why no rank could read (its first reason)."""
    healths: dict[tuple[str, str], GpuHealth] = {}
    why_not = ""
    for record in records:
        for rank in record.ranks:
            if not rank.health:
                continue
            if rank.health.get("why_not"):
                why_not = why_not or rank.health["why_not"]
                continue
            health = GpuHealth.from_dict(rank.health)
            label = health.uuid or health.pci_bus_id or health.label  # a bound rank's cuda:0 names no GPU
            healths[(rank.slurm_node or rank.hostname, label)] = replace(health, label=label)
    figures = [
        replace(figure, node=node)
        for (node, _), health in sorted(healths.items())
        for figure in health_figures([health], "")
    ]
    return figures or health_figures([], why_not)
