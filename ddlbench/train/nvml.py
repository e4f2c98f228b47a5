"""NVML, the NVIDIA driver's management library, read through pynvml: a GPU's facts and its energy counter.

pynvml (the package nvidia-ml-py) is imported on first use, never at import time: where it is absent (a
CPU host, CI) or NVML does not start, `nvml()` says why and the callers record "no NVML: <why>". A fact
the card does not answer (NVML_ERROR_NOT_SUPPORTED, e.g. nvmlDeviceGetNumaNodeId on a virtualised H200)
is None. Nothing here is called inside the measured steps: one NVML call took 4.0 ms of host time on a
virtualised H200 (nvmlDeviceGetTotalEnergyConsumption, driver 580.159.04), more than a fast step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ddlbench.records import GpuFacts

NO_NVML = "no NVML"


@functools.cache
def nvml() -> tuple[Any, str]:
    """(pynvml, NVML started) or (None, "no NVML: <why>"); once per process."""
    try:
        import pynvml
    except ImportError:
        return None, f"{NO_NVML}: pynvml (package nvidia-ml-py) not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"{NO_NVML}: nvmlInit failed: {exc}"
    return pynvml, ""


def ask(lib: Any, call: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None where the card or driver does not answer it. Bytes (older pynvml) as text."""
    try:
        value = call(*args)
    except lib.NVMLError:
        return None
    return value.decode() if isinstance(value, bytes) else value


def device_handle(lib: Any, *, uuid: str | None, pci_bus_id: str | None) -> Any:
    """The NVML handle of the GPU torch calls by this UUID (GPU-…) or, failing that, PCI bus id; None if none."""
    if uuid and (handle := ask(lib, lib.nvmlDeviceGetHandleByUUID, uuid)) is not None:
        return handle
    if pci_bus_id:
        return ask(lib, lib.nvmlDeviceGetHandleByPciBusId, pci_bus_id)
    return None


def gpu_facts(*, uuid: str | None = None, pci_bus_id: str | None = None) -> GpuFacts:
    """The driver, and the GPU of this UUID or bus id (None for both: the driver alone), as NVML reports them."""
    lib, why = nvml()
    if lib is None:
        return GpuFacts(source=why)
    facts: dict[str, Any] = {
        "driver_version": ask(lib, lib.nvmlSystemGetDriverVersion),
        "cuda_driver_version": ask(lib, lib.nvmlSystemGetCudaDriverVersion),
    }
    handle = device_handle(lib, uuid=uuid, pci_bus_id=pci_bus_id) if uuid or pci_bus_id else None
    if handle is None:
        return GpuFacts(source="nvml", **facts)
    sm, mem = lib.NVML_CLOCK_SM, lib.NVML_CLOCK_MEM
    pci = ask(lib, lib.nvmlDeviceGetPciInfo, handle)
    bus = getattr(pci, "busId", None)
    limit_mw = ask(lib, lib.nvmlDeviceGetPowerManagementLimit, handle)
    ecc = ask(lib, lib.nvmlDeviceGetEccMode, handle) or (None, None)  # (current, pending)
    mig = ask(lib, lib.nvmlDeviceGetMigMode, handle) or (None, None)
    facts |= {
        "name": ask(lib, lib.nvmlDeviceGetName, handle),
        "uuid": ask(lib, lib.nvmlDeviceGetUUID, handle),
        "pci_bus_id": bus.decode() if isinstance(bus, bytes) else bus,
        "sm_clock_app_mhz": ask(lib, lib.nvmlDeviceGetApplicationsClock, handle, sm),
        "sm_clock_max_mhz": ask(lib, lib.nvmlDeviceGetMaxClockInfo, handle, sm),
        "mem_clock_app_mhz": ask(lib, lib.nvmlDeviceGetApplicationsClock, handle, mem),
        "mem_clock_max_mhz": ask(lib, lib.nvmlDeviceGetMaxClockInfo, handle, mem),
        "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,  # NVML answers in mW
        "ecc_mode": ecc[0],
        "ecc_mode_pending": ecc[1],
        "mig_mode": mig[0],
        "mig_mode_pending": mig[1],
        "persistence_mode": ask(lib, lib.nvmlDeviceGetPersistenceMode, handle),
        "vbios_version": ask(lib, lib.nvmlDeviceGetVbiosVersion, handle),
    }
    return GpuFacts(source="nvml", **facts)


def energy_counter(*, uuid: str | None, pci_bus_id: str | None) -> tuple[Callable[[], float] | None, str]:
    """(a reader of the GPU's total energy in joules, "") or (None, why not). The counter is
    nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded (64 bits: it does not wrap in
    practice), refreshed about every 0.1 s (gaps of 41/100/115 ms min/median/max, read on an H200)."""
    lib, why = nvml()
    if lib is None:
        return None, why
    handle = device_handle(lib, uuid=uuid, pci_bus_id=pci_bus_id)
    if handle is None:
        return None, f"{NO_NVML}: no NVML device for {uuid or pci_bus_id}"
    if ask(lib, lib.nvmlDeviceGetTotalEnergyConsumption, handle) is None:
        return None, f"{NO_NVML} energy counter: nvmlDeviceGetTotalEnergyConsumption not supported on {uuid}"
    return (lambda: lib.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0), ""
