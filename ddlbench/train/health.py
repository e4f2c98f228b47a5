"""GPU health over a load, as an administrator accepting GPUs reads it: each GPU's clocks and why they were
held back, temperature against its slowdown threshold, power against its limit, memory errors, retired pages,
remapped rows, XID events and the PCIe link, all from NVML (ddlbench.train.nvml), and what is wrong with it.

What counts as a finding follows the practice of NVIDIA DCGM's diagnostics, Azure's node health checks (NHC)
and Meta's GPU cluster monitoring (GCM): a GPU fails when it slowed itself for heat or a hardware signal, ran
at its slowdown temperature, is power-capped below its default limit, reports uncorrectable memory errors (or
correctable ones that grew during the load), retired pages or remapped rows that are pending or failed, logged
an XID critical error, or runs its PCIe link below the generation or width it and the slot allow. Holding the
clocks at the power limit (SW power cap) is not a finding: a loaded GPU at its limit is doing what it should,
and DCGM does not fail it either. Every finding is a sentence that names what was seen, with its numbers.

The readings that matter are taken under the load, not at rest: an idle GPU drops its clocks and downtrains its
PCIe link (to generation 1 and sometimes fewer lanes) to save power, so a link read at idle looks degraded and
clocks read at idle say nothing. `HealthWatch.sample()` is called during the load and keeps the extremes; the
counters (ECC, retired pages, remapped rows) are read before and after it, and XID events are caught as they
come (an NVML event set drained at each sample).

The figures a certificate makes of these are ddlbench.certify.health's; this module reads, so that a rank
(ddlbench.launch.worker, around a point of the standard suite) can read its GPU as the node levels do.

Each NVML call costs host time (4.0 ms for one on a virtualised H200, ddlbench.train.nvml) and one sample makes
about eight per GPU, so sample() belongs between timed runs, never inside one. Without NVML (no pynvml, no
driver) nothing here is measurable and the one figure says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ddlbench.train.nvml import ask, device_handle, nvml

NOT_MEASURABLE = "not measurable here"

# Clocks-event (formerly "throttle") reason bits, nvmlClocksEventReason* in nvml.h; named here so that an older
# pynvml, or none, does not decide what they mean.
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100
REASON_NAMES = {
    GPU_IDLE: "GPU idle",
    APPLICATIONS_CLOCKS_SETTING: "applications clocks setting",
    SW_POWER_CAP: "SW power cap",
    HW_SLOWDOWN: "HW slowdown",
    SYNC_BOOST: "sync boost",
    SW_THERMAL_SLOWDOWN: "SW thermal slowdown",
    HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "HW power brake slowdown",
    DISPLAY_CLOCK_SETTING: "display clock setting",
}
# heat or a hardware signal held the clocks back: a fault under load. The power cap, idling, a clock setting
# and sync boost are the GPU doing as told.
SLOWDOWN_REASONS = HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
NVML_ERROR_TIMEOUT = 10  # what an event wait answers when no event is pending
MAX_EVENTS_PER_SAMPLE = 64  # a GPU logging XIDs without end must not keep sample() from returning


@dataclass(frozen=True, kw_only=True)
class GpuHealth:
    """One GPU's health over a load: what NVML read and what is wrong."""

    label: str  # how the caller names the device, e.g. "cuda:0"
    uuid: str | None
    pci_bus_id: str | None
    readings: dict[str, Any]  # JSON-able; units in the keys; None where the card did not answer
    findings: tuple[str, ...]  # each a sentence naming what was seen, with its numbers
    why_missing: str = ""  # why nothing was read of this GPU (NVML has no device by its UUID or bus id)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["findings"] = list(self.findings)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuHealth:
        return cls(**{**data, "findings": tuple(data.get("findings") or ())})


@dataclass(kw_only=True)
class _Watched:
    """What is known of one GPU so far; mutable, as the samples come in."""

    label: str
    uuid: str | None
    pci_bus_id: str | None
    handle: Any
    start: dict[str, Any] = field(default_factory=dict)
    events: Any = None  # its NVML event set, None where XID events cannot be watched
    xid_watch: str = ""  # why XID events are not watched ("" when they are)
    xids: list[int] = field(default_factory=list)
    samples: int = 0
    reasons: int | None = None  # the OR of every clocks-event reason mask read
    sm_clock_mhz: list[int] = field(default_factory=list)  # [min, max]
    temperature_c_max: int | None = None
    power_w_max: float | None = None
    pcie_gen_max_seen: int | None = None
    pcie_width_max_seen: int | None = None


class HealthWatch:
    """Health of the given GPUs over a load: open before it, sample() during it (as often as the caller likes,
    cheap, never raises), finish() after it."""

    def __init__(self, gpus: list[tuple[str, str | None, str | None]]):
        """`gpus`: (label, UUID, PCI bus id) per GPU; reads the counters' baselines and starts watching XIDs."""
        self._lib, why = nvml()
        self._why_not = "" if self._lib is not None else f"{NOT_MEASURABLE}: {why}"
        self._gpus: list[_Watched] = []
        self._result: list[GpuHealth] | None = None
        if self._lib is None:
            return
        for label, uuid, pci_bus_id in gpus:
            handle = device_handle(self._lib, uuid=uuid, pci_bus_id=pci_bus_id)
            gpu = _Watched(label=label, uuid=uuid, pci_bus_id=pci_bus_id, handle=handle)
            if handle is not None:
                gpu.start = self._counters(handle)
                self._watch_xids(gpu)
            self._gpus.append(gpu)

    @property
    def why_not(self) -> str:
        """Why nothing can be read: "not measurable here: no NVML: <why>"; empty when NVML is there."""
        return self._why_not

    def sample(self) -> None:
        """Read each GPU's clocks, reasons, temperature, power and PCIe link now, and drain its XID events."""
        if self._result is not None:
            return
        for gpu in self._gpus:
            if gpu.handle is not None:
                self._sample(gpu)

    def finish(self) -> list[GpuHealth]:
        """Sample once more, read the counters again and the GPUs' limits, stop watching, and judge each GPU."""
        if self._result is None:
            self.sample()
            self._result = [self._finish(gpu) for gpu in self._gpus]
        return self._result

    def _call(self, name: str, *args: Any) -> Any:
        """One NVML query by name; None where it fails or this pynvml lacks the function."""
        function = getattr(self._lib, name, None)
        return None if function is None else ask(self._lib, function, *args)

    def _counters(self, handle: Any) -> dict[str, Any]:
        """The counters compared over the load: volatile ECC counts (since the driver loaded) and retired pages."""
        lib = self._lib
        ecc = "nvmlDeviceGetTotalEccErrors"
        pages = [
            self._call("nvmlDeviceGetRetiredPages", handle, cause)
            for cause in (
                lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        ]
        answered = [len(list(found)) for found in pages if found is not None]
        return {
            "ecc_corrected": self._call(ecc, handle, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_VOLATILE_ECC),
            "ecc_uncorrected": self._call(ecc, handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC),
            # a GPU that remaps rows instead (A100 and later) may not answer: None, not 0
            "retired_pages": sum(answered) if answered else None,
        }

    def _watch_xids(self, gpu: _Watched) -> None:
        """Register for the GPU's XID critical errors, one event set per GPU so that each event is its own."""
        lib = self._lib
        events = self._call("nvmlEventSetCreate")
        if events is None:
            gpu.xid_watch = "unsupported: nvmlEventSetCreate failed"
            return
        try:
            lib.nvmlDeviceRegisterEvents(gpu.handle, getattr(lib, "nvmlEventTypeXidCriticalError", XID_EVENT), events)
        except lib.NVMLError as exc:
            gpu.xid_watch = f"unsupported: nvmlDeviceRegisterEvents: {exc}"
            self._call("nvmlEventSetFree", events)
            return
        gpu.events = events

    def _sample(self, gpu: _Watched) -> None:
        lib, handle = self._lib, gpu.handle
        gpu.samples += 1
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:  # the name before driver 535 / nvidia-ml-py 12.535
            reasons = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if reasons is not None:
            gpu.reasons = (gpu.reasons or 0) | int(reasons)
        if (clock := self._call("nvmlDeviceGetClockInfo", handle, lib.NVML_CLOCK_SM)) is not None:
            low, high = gpu.sm_clock_mhz or (clock, clock)
            gpu.sm_clock_mhz = [min(low, clock), max(high, clock)]
        temperature = self._call("nvmlDeviceGetTemperature", handle, lib.NVML_TEMPERATURE_GPU)
        gpu.temperature_c_max = _max(gpu.temperature_c_max, temperature)
        power_mw = self._call("nvmlDeviceGetPowerUsage", handle)
        gpu.power_w_max = _max(gpu.power_w_max, None if power_mw is None else power_mw / 1000.0)
        gpu.pcie_gen_max_seen = _max(gpu.pcie_gen_max_seen, self._call("nvmlDeviceGetCurrPcieLinkGeneration", handle))
        gpu.pcie_width_max_seen = _max(gpu.pcie_width_max_seen, self._call("nvmlDeviceGetCurrPcieLinkWidth", handle))
        self._drain_xids(gpu)

    def _drain_xids(self, gpu: _Watched) -> None:
        """Take the pending XID events without waiting (timeout 0: NVML_ERROR_TIMEOUT means none is pending)."""
        lib = self._lib
        if gpu.events is None:
            return
        wait = getattr(lib, "nvmlEventSetWait_v2", None) or lib.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                event = wait(gpu.events, 0)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(lib, "NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT):
                    gpu.xid_watch = f"event wait failed: {exc}"
                return
            if getattr(event, "eventType", XID_EVENT) == XID_EVENT:
                gpu.xids.append(int(event.eventData))

    def _finish(self, gpu: _Watched) -> GpuHealth:
        identity = {"label": gpu.label, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}
        if gpu.handle is None:
            why = f"{NOT_MEASURABLE}: NVML has no device for {gpu.uuid or gpu.pci_bus_id or gpu.label}"
            return GpuHealth(**identity, readings={"samples": 0}, findings=(), why_missing=why)
        readings = self._readings(gpu)
        if gpu.events is not None:
            self._call("nvmlEventSetFree", gpu.events)
            gpu.events = None
        return GpuHealth(**identity, readings=readings, findings=tuple(judge_health(readings)))

    def _readings(self, gpu: _Watched) -> dict[str, Any]:
        lib, handle = self._lib, gpu.handle
        end = self._counters(handle)
        rows = self._call("nvmlDeviceGetRemappedRows", handle)
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        limit_mw = self._call("nvmlDeviceGetEnforcedPowerLimit", handle)
        default_mw = self._call("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        sm_clock = gpu.sm_clock_mhz or [None, None]
        return {
            "samples": gpu.samples,
            "sm_clock_mhz_min": sm_clock[0],
            "sm_clock_mhz_max": sm_clock[1],
            "sm_clock_max_mhz": self._call("nvmlDeviceGetMaxClockInfo", handle, lib.NVML_CLOCK_SM),
            "sm_clock_app_mhz": self._call("nvmlDeviceGetApplicationsClock", handle, lib.NVML_CLOCK_SM),
            "clocks_event_reasons": None if gpu.reasons is None else reason_names(gpu.reasons),
            "clocks_event_reasons_mask": gpu.reasons,
            "temperature_c_max": gpu.temperature_c_max,
            "slowdown_temperature_c": self._call(
                "nvmlDeviceGetTemperatureThreshold", handle, lib.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "power_w_max": gpu.power_w_max,
            "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,  # NVML answers in mW
            "power_default_limit_w": None if default_mw is None else default_mw / 1000.0,
            "ecc_corrected_volatile_start": gpu.start.get("ecc_corrected"),
            "ecc_corrected_volatile_end": end["ecc_corrected"],
            "ecc_uncorrected_volatile_start": gpu.start.get("ecc_uncorrected"),
            "ecc_uncorrected_volatile_end": end["ecc_uncorrected"],
            "retired_pages_start": gpu.start.get("retired_pages"),
            "retired_pages_end": end["retired_pages"],
            "retired_pages_pending": None if pending is None else bool(pending),
            "remapped_rows": None
            if rows is None
            else dict(zip(("corrected", "uncorrected", "pending", "failure"), _rows(rows), strict=True)),
            "xid_events": list(gpu.xids),
            "xid_watch": gpu.xid_watch or "watched",
            "pcie_gen_max_seen": gpu.pcie_gen_max_seen,
            "pcie_gen_max": self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "pcie_width_max_seen": gpu.pcie_width_max_seen,
            "pcie_width_max": self._call("nvmlDeviceGetMaxPcieLinkWidth", handle),
        }


def reason_names(mask: int) -> list[str]:
    """The clocks-event reasons set in `mask`, by name; a bit NVML may add later as "unknown 0x…"."""
    names = [name for bit, name in REASON_NAMES.items() if mask & bit]
    unknown = mask & ~sum(REASON_NAMES)
    return names + ([f"unknown 0x{unknown:x}"] if unknown else [])


def judge_health(readings: dict[str, Any]) -> list[str]:
    """What is wrong with a GPU, from its readings (HealthWatch): one sentence per fault, with what was seen."""
    findings = []
    mask = readings.get("clocks_event_reasons_mask") or 0
    if mask & SLOWDOWN_REASONS:
        names = " and ".join(reason_names(mask & SLOWDOWN_REASONS))
        low, high = readings.get("sm_clock_mhz_min"), readings.get("sm_clock_mhz_max")
        clocks = f", SM clock {low}–{high} MHz" if low is not None else ""
        findings.append(f"{names} while loaded (clocks-event reasons 0x{mask:x}{clocks})")
    hottest, slowdown = readings.get("temperature_c_max"), readings.get("slowdown_temperature_c")
    if hottest is not None and slowdown is not None and hottest >= slowdown:
        findings.append(f"temperature reached {hottest} °C, at or above its slowdown threshold of {slowdown} °C")
    limit, default = readings.get("power_limit_w"), readings.get("power_default_limit_w")
    if limit is not None and default is not None and limit < default:
        findings.append(f"power capped: enforced power limit {limit:g} W is below the default {default:g} W")
    findings += _memory_findings(readings)
    if xids := readings.get("xid_events"):
        findings.append(f"XID critical errors during the load: {', '.join(f'XID {xid}' for xid in xids)}")
    findings += _pcie_findings(readings)
    return findings


def _memory_findings(readings: dict[str, Any]) -> list[str]:
    """ECC errors, retired pages and remapped rows: what DCGM and NHC fail a GPU's memory for."""
    findings = []
    if uncorrected := readings.get("ecc_uncorrected_volatile_end"):
        grown = _increase(readings, "ecc_uncorrected_volatile")
        during = f", {grown} during the load" if grown else ""
        findings.append(f"uncorrected ECC errors: {uncorrected} since the driver loaded (volatile count){during}")
    if corrected := _increase(readings, "ecc_corrected_volatile"):
        start, end = readings["ecc_corrected_volatile_start"], readings["ecc_corrected_volatile_end"]
        findings.append(f"corrected ECC errors during the load: {corrected} (volatile count {start} → {end})")
    if readings.get("retired_pages_pending"):
        findings.append("retired pages pending: pages wait for a GPU reset to be retired")
    if retired := _increase(readings, "retired_pages"):
        start, end = readings["retired_pages_start"], readings["retired_pages_end"]
        findings.append(f"pages retired during the load: {retired} ({start} → {end})")
    rows = readings.get("remapped_rows") or {}
    faults = [
        *(["a remap pending (it needs a GPU reset)"] if rows.get("pending") else []),
        *(["a remap failed"] if rows.get("failure") else []),
        *(["rows remapped for uncorrected errors"] if rows.get("uncorrected") else []),
    ]
    if faults:
        counts = f"{rows.get('corrected')} for corrected, {rows.get('uncorrected')} for uncorrected errors"
        findings.append(f"row remapping: {', '.join(faults)} (remapped rows: {counts})")
    return findings


def _pcie_findings(readings: dict[str, Any]) -> list[str]:
    """The link under load below what the GPU and its slot allow (NVML's max is of both); the best seen counts,
    as an idle or lightly used link downtrains and a sample may catch it between transfers."""
    gen, gen_max = readings.get("pcie_gen_max_seen"), readings.get("pcie_gen_max")
    width, width_max = readings.get("pcie_width_max_seen"), readings.get("pcie_width_max")
    parts = []
    if gen is not None and gen_max is not None and gen < gen_max:
        parts.append(f"generation {gen} at most, of {gen_max}")
    if width is not None and width_max is not None and width < width_max:
        parts.append(f"width x{width} at most, of x{width_max}")
    return [f"PCIe link degraded under load: {'; '.join(parts)}"] if parts else []


def _max(known: Any, value: Any) -> Any:
    return value if known is None else known if value is None else max(known, value)


def _increase(readings: dict[str, Any], key: str) -> int:
    """How much a counter grew between start and end; 0 where either is unknown or it did not grow."""
    start, end = readings.get(f"{key}_start"), readings.get(f"{key}_end")
    return end - start if start is not None and end is not None and end > start else 0


def _rows(rows: Any) -> tuple[int, int, bool, bool]:
    corrected, uncorrected, pending, failure = rows
    return int(corrected), int(uncorrected), bool(pending), bool(failure)
