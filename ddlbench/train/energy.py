"""Energy of a rank's measured window, and the rank's software and card, read outside the timed steps.

Counters: the rank's GPU by NVML's total-energy counter (ddlbench.train.nvml), and its host's CPU packages
by RAPL (/sys/class/powercap/intel-rapl:<n>/energy_uj, where readable), read by local rank 0 of each host
only, so that no host is counted once per rank. The kernel opens the window just before the barrier that
opens the measured steps (an NVML read takes milliseconds, the first one longer: read after the barrier, it
would make the ranks start their first step apart) and closes it after the closing synchronisation
(ddlbench.train.kernel, ddlbench.train.clock.StepTimer): no read sits inside a timed step, and the energy
window holds the measured steps plus the barrier and the timer's opening synchronisations (its own window_s).

Each reading is one counter's difference over the window, labelled with its boundary, its device and how it
was read. Its uncertainty: a counter refreshed every T seconds is stale by up to T at each end, so the
energy it gives is that of a window off by up to T at each end, ≈ energy_j × 2T ÷ window_s (J), a
relative uncertainty of 2T ÷ window_s: 0.2 s ÷ window_s for NVML (T ≈ 0.1 s), 0.002 s ÷ window_s for RAPL
(T ≈ 1 ms). A window under MIN_WINDOW_S is marked too short to read: kept, but left out of samples per joule.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlbench.records import EnergyReading
from ddlbench.train.nvml import energy_counter, gpu_facts, nvml

POWERCAP = Path("/sys/class/powercap")  # where RAPL's zones live (a test points it at a folder of its own)
NVML_METHOD, RAPL_METHOD = "nvml total energy counter", "rapl energy_uj"
NVML_UPDATE_S = 0.1  # NVML's energy counter refreshes about every 100 ms (41/100/115 ms gaps on an H200)
RAPL_UPDATE_S = 0.001  # RAPL's counters refresh about every millisecond
MIN_WINDOW_S = 1.0  # under this, the counters' steps are too large a share of the window to read it
NO_RAPL = "no RAPL"


@dataclass(frozen=True, kw_only=True)
class Counter:
    """One energy counter to read at the window's ends."""

    boundary: str  # gpu or cpu-package (EnergyReading.boundary)
    device: str  # the GPU's UUID or the RAPL domain's name
    method: str  # NVML_METHOD or RAPL_METHOD
    read: Callable[[], float]  # the counter now (J)
    wrap_j: float | None  # the counter restarts from 0 past this (J); None: it does not wrap
    period_s: float  # how often the counter is refreshed (s)


def energy_reading(counter: Counter, start_j: float, end_j: float, window_s: float) -> EnergyReading:
    """One counter's energy over the window: end − start (J), plus its range once if it wrapped (a RAPL
    counter wraps at max_energy_range_uj; a window shorter than one wrap, minutes at full power, sees at
    most one); uncertainty energy_j × 2T ÷ window_s (J), T the counter's update period."""
    energy = end_j - start_j
    if energy < 0 and counter.wrap_j:
        energy += counter.wrap_j
    return EnergyReading(
        boundary=counter.boundary,
        device=counter.device,
        method=counter.method,
        energy_j=energy,
        window_s=window_s,
        uncertainty_j=abs(energy) * 2 * counter.period_s / window_s if window_s > 0 else float("inf"),
        too_short=window_s < MIN_WINDOW_S,
    )


def rapl_counters(root: Path | None = None) -> tuple[list[Counter], str]:
    """This host's CPU packages (RAPL zones intel-rapl:<n> named package-*; their subzones, core and
    uncore, are inside them and not summed again), and "" or "no RAPL: <why>"."""
    root = POWERCAP if root is None else root
    zones = sorted(z for z in root.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", z.name))
    counters = []
    for zone in zones:
        try:
            name = (zone / "name").read_text().strip()
            if not name.startswith("package"):
                continue
            wrap_j = int((zone / "max_energy_range_uj").read_text()) / 1e6
            int((zone / "energy_uj").read_text())  # readable? (root-only on kernels patched for CVE-2020-8694)
        except (OSError, ValueError) as exc:
            return [], f"{NO_RAPL}: {zone}: {exc}"
        counters.append(
            Counter(
                boundary="cpu-package",
                device=name,
                method=RAPL_METHOD,
                read=lambda zone=zone: int((zone / "energy_uj").read_text()) / 1e6,
                wrap_j=wrap_j,
                period_s=RAPL_UPDATE_S,
            )
        )
    return counters, "" if counters else f"{NO_RAPL}: no package zone under {root}"


class EnergyWindow:
    """The counters of one measured window, read at its opening (here) and at `close()`."""

    def __init__(self, counters: list[Counter], notes: list[str]) -> None:
        self.counters = counters
        self.note = "; ".join(note for note in notes if note)
        self._starts = [_timed_read(counter) for counter in counters]

    def close(self) -> tuple[EnergyReading, ...]:
        """Each counter's reading over the window: between the midpoints of its two reads (one NVML read
        takes milliseconds), so the window is each counter's own."""
        ends = [_timed_read(counter) for counter in self.counters]
        return tuple(
            energy_reading(counter, start, end, end_s - start_s)
            for counter, (start_s, start), (end_s, end) in zip(self.counters, self._starts, ends, strict=True)
        )


def _timed_read(counter: Counter) -> tuple[float, float]:
    """(the read's midpoint on perf_counter (s), the counter (J))."""
    before = time.perf_counter()
    value = counter.read()
    return (before + time.perf_counter()) / 2, value


def open_energy_window(device: Any, local_rank: int) -> EnergyWindow:
    """Read the rank's counters once, now: its GPU on CUDA; its host's CPU packages on local rank 0."""
    counters: list[Counter] = []
    notes: list[str] = []
    if device.type == "cuda":
        uuid, bus = cuda_identity(device)
        read, why = energy_counter(uuid=uuid, pci_bus_id=bus)
        if read is None:
            notes.append(why)
        else:
            counters.append(
                Counter(boundary="gpu", device=uuid or bus or "", method=NVML_METHOD, read=read, wrap_j=None,
                        period_s=NVML_UPDATE_S)
            )  # fmt: skip
    else:
        lib, why = nvml()
        notes.append(why if lib is None else "no GPU: the rank trained on the CPU")
    if local_rank == 0:
        rapl, why = rapl_counters()
        counters += rapl
        notes.append(why)
    else:
        notes.append("RAPL: read by local rank 0 of this host")
    return EnergyWindow(counters, notes)


def cuda_identity(device: Any) -> tuple[str | None, str | None]:
    """(UUID as GPU-…, PCI bus id as nvidia-smi prints it) of a CUDA device, from torch."""
    import torch

    properties = torch.cuda.get_device_properties(device)
    uuid = getattr(properties, "uuid", None)
    bus = [getattr(properties, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    return (
        None if uuid is None else f"GPU-{uuid}",
        None if None in bus else f"{bus[0]:08X}:{bus[1]:02X}:{bus[2]:02X}.0",
    )


def rank_provenance(device: Any) -> dict[str, Any]:
    """RankResult's software and card fields: on CUDA, torch's CUDA runtime, cuDNN and NCCL versions and the
    GPU's facts (NVML); on the CPU the driver's facts alone (or why NVML is not there)."""
    if device.type != "cuda":
        return {"gpu_facts": gpu_facts()}
    import torch

    try:
        nccl = torch.cuda.nccl.version()
        nccl_version = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except (AttributeError, RuntimeError):  # a torch built without NCCL
        nccl_version = None
    uuid, bus = cuda_identity(device)
    return {
        "cuda_runtime_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "nccl_version": nccl_version,
        "gpu_facts": gpu_facts(uuid=uuid, pci_bus_id=bus),
    }
