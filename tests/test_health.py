"""GPU health over a load (ddlbench.train.health; its figures, ddlbench.certify.health), read through a fake
pynvml whose GPUs a test can change between samples: a healthy GPU passes, each fault names itself with its
numbers, and what NVML does not answer is None rather than a failure."""

from __future__ import annotations

import importlib.util
import json
import types
from typing import Any

import pytest

import ddlbench.train.nvml
from ddlbench.certify.certificate import judge
from ddlbench.certify.health import health_figures
from ddlbench.train.health import GpuHealth, HealthWatch

NOT_FOUND, NOT_SUPPORTED, TIMEOUT, FUNCTION_NOT_FOUND = 6, 3, 10, 13
XID_EVENT = 8


class FakeNVMLError(Exception):
    """pynvml.NVMLError: the NVML return code in `value`."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


def healthy() -> dict[str, Any]:
    """A loaded H200 as it should be: at its clocks, cool, at its default power limit, on a Gen5 x16 link."""
    return {
        "reasons": 0,
        "sm_clock": 1980,
        "temperature": 62,
        "power_mw": 650_000,
        "pcie_gen": 5,
        "pcie_width": 16,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_sbe": [],
        "retired_dbe": [],
        "pending": 0,
        "rows": (0, 0, 0, 0),
        "max_clock": 1980,
        "app_clock": 1980,
        "limit_mw": 700_000,
        "default_mw": 700_000,
        "slowdown": 87,
        "max_gen": 5,
        "max_width": 16,
        "xids": [],  # queued XID codes, taken by the event wait
        "unsupported": set(),  # keys whose query answers NVML_ERROR_NOT_SUPPORTED
        "events_unsupported": False,
        "old_pynvml": False,  # no nvmlDeviceGetCurrentClocksEventReasons: only the throttle-reasons name
    }


class FakePynvml(types.SimpleNamespace):
    """The slice of pynvml that health.py calls, over GPUs keyed by UUID (the UUID is the handle)."""

    NVMLError = FakeNVMLError
    NVML_ERROR_TIMEOUT = TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nvmlEventTypeXidCriticalError = XID_EVENT

    def __init__(self, gpus: dict[str, dict[str, Any]]):
        super().__init__(gpus=gpus, freed=[])

    def _get(self, handle: str, key: str) -> Any:
        if key in self.gpus[handle]["unsupported"]:
            raise FakeNVMLError(NOT_SUPPORTED)
        return self.gpus[handle][key]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.gpus:
            raise FakeNVMLError(NOT_FOUND)
        return uuid

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        raise FakeNVMLError(NOT_FOUND)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        if self.gpus[handle]["old_pynvml"]:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)
        return self._get(handle, "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._get(handle, "reasons")

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return self._get(handle, "sm_clock")

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return self._get(handle, "max_clock")

    def nvmlDeviceGetApplicationsClock(self, handle, clock):
        return self._get(handle, "app_clock")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._get(handle, "temperature")

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold):
        assert threshold == self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return self._get(handle, "slowdown")

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._get(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._get(handle, "limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        return self._get(handle, "default_mw")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._get(handle, "pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._get(handle, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._get(handle, "max_gen")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self._get(handle, "max_width")

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter):
        assert counter == self.NVML_VOLATILE_ECC
        corrected = error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self._get(handle, "ecc_corrected" if corrected else "ecc_uncorrected")

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        single = cause == self.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(self._get(handle, "retired_sbe" if single else "retired_dbe"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        return self._get(handle, "pending")

    def nvmlDeviceGetRemappedRows(self, handle):
        return self._get(handle, "rows")

    def nvmlEventSetCreate(self):
        return []  # an event set: the handles registered on it

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        assert event_types == XID_EVENT
        if self.gpus[handle]["events_unsupported"]:
            raise FakeNVMLError(NOT_SUPPORTED)
        event_set.append(handle)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        assert timeout_ms == 0
        for handle in event_set:
            if self.gpus[handle]["xids"]:
                xid = self.gpus[handle]["xids"].pop(0)
                return types.SimpleNamespace(device=handle, eventType=XID_EVENT, eventData=xid)
        raise FakeNVMLError(TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        self.freed.append(list(event_set))


@pytest.fixture
def gpus(monkeypatch) -> dict[str, dict[str, Any]]:
    """Two healthy GPUs behind a fake NVML; change a GPU's dict to change what NVML answers next."""
    state = {"GPU-0": healthy(), "GPU-1": healthy()}
    fake = FakePynvml(state)
    monkeypatch.setattr("ddlbench.train.health.nvml", lambda: (fake, ""))
    state["fake"] = fake  # type: ignore[assignment]
    return state


def watch_load(gpus, *, start=None, during=None, labels=(("cuda:0", "GPU-0"),)) -> list[GpuHealth]:
    """Open a watch (after `start` is applied to GPU-0), sample, apply `during`, sample twice, finish."""
    gpus["GPU-0"].update(start or {})
    watch = HealthWatch([(label, uuid, None) for label, uuid in labels])
    assert watch.why_not == ""
    watch.sample()
    gpus["GPU-0"].update(during or {})
    watch.sample()
    watch.sample()
    return watch.finish()


def test_a_healthy_gpu_passes_with_its_readings_filled(gpus):
    [health] = watch_load(gpus)
    assert health.findings == ()
    assert (health.label, health.uuid, health.why_missing) == ("cuda:0", "GPU-0", "")
    readings = health.readings
    assert readings["samples"] == 4  # three during the load, one at finish
    assert readings["sm_clock_mhz_min"] == readings["sm_clock_mhz_max"] == readings["sm_clock_max_mhz"] == 1980
    assert readings["sm_clock_app_mhz"] == 1980
    assert (readings["temperature_c_max"], readings["slowdown_temperature_c"]) == (62, 87)
    assert (readings["power_w_max"], readings["power_limit_w"], readings["power_default_limit_w"]) == (650, 700, 700)
    assert readings["clocks_event_reasons"] == [] and readings["clocks_event_reasons_mask"] == 0
    assert readings["ecc_corrected_volatile_start"] == readings["ecc_uncorrected_volatile_end"] == 0
    assert readings["retired_pages_start"] == readings["retired_pages_end"] == 0
    assert readings["retired_pages_pending"] is False
    assert readings["remapped_rows"] == {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False}
    assert (readings["xid_events"], readings["xid_watch"]) == ([], "watched")
    assert (readings["pcie_gen_max_seen"], readings["pcie_gen_max"]) == (5, 5)
    assert (readings["pcie_width_max_seen"], readings["pcie_width_max"]) == (16, 16)
    assert gpus["fake"].freed == [["GPU-0"]]  # the event set is given back
    assert json.loads(json.dumps(health.to_dict()))["readings"] == readings
    [figure] = health_figures([health], "")
    assert (figure.name, figure.kind, figure.unit) == ("health/cuda:0", "health", "findings")
    assert (figure.value, figure.n, figure.check, figure.finding) == (0, 4, "pass", "")
    assert "4 samples" in figure.basis


FAULTS = {
    "hw_thermal": (
        {},
        {"reasons": 0x44, "sm_clock": 1410},
        "HW thermal slowdown while loaded (clocks-event reasons 0x44, SM clock 1410–1980 MHz)",
    ),
    "hw_power_brake": (
        {},
        {"reasons": 0x88, "sm_clock": 1200},
        "HW slowdown and HW power brake slowdown while loaded (clocks-event reasons 0x88, SM clock 1200–1980 MHz)",
    ),
    "sw_thermal": (
        {},
        {"reasons": 0x20},
        "SW thermal slowdown while loaded (clocks-event reasons 0x20, SM clock 1980–1980 MHz)",
    ),
    "temperature": (
        {},
        {"temperature": 88},
        "temperature reached 88 °C, at or above its slowdown threshold of 87 °C",
    ),
    "power_capped": (
        {"limit_mw": 500_000},
        {},
        "power capped: enforced power limit 500 W is below the default 700 W",
    ),
    "uncorrected_ecc_during": (
        {},
        {"ecc_uncorrected": 2},
        "uncorrected ECC errors: 2 since the driver loaded (volatile count), 2 during the load",
    ),
    "uncorrected_ecc_before": (
        {"ecc_uncorrected": 1},
        {},
        "uncorrected ECC errors: 1 since the driver loaded (volatile count)",
    ),
    "corrected_ecc_during": (
        {"ecc_corrected": 3},
        {"ecc_corrected": 5},
        "corrected ECC errors during the load: 2 (volatile count 3 → 5)",
    ),
    "retired_pending": (
        {},
        {"pending": 1},
        "retired pages pending: pages wait for a GPU reset to be retired",
    ),
    "retired_during": (
        {"retired_sbe": [0x1000]},
        {"retired_dbe": [0x2000]},
        "pages retired during the load: 1 (1 → 2)",
    ),
    "remap_pending": (
        {},
        {"rows": (0, 1, 1, 0)},
        "row remapping: a remap pending (it needs a GPU reset), rows remapped for uncorrected errors "
        "(remapped rows: 0 for corrected, 1 for uncorrected errors)",
    ),
    "remap_failed": (
        {},
        {"rows": (2, 0, 0, 1)},
        "row remapping: a remap failed (remapped rows: 2 for corrected, 0 for uncorrected errors)",
    ),
    "xid": (
        {},
        {"xids": [79, 48]},
        "XID critical errors during the load: XID 79, XID 48",
    ),
    "pcie_generation": (
        {"pcie_gen": 3},
        {},
        "PCIe link degraded under load: generation 3 at most, of 5",
    ),
    "pcie_width": (
        {"pcie_width": 8},
        {},
        "PCIe link degraded under load: width x8 at most, of x16",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_gives_the_one_finding_that_names_it(gpus, fault):
    start, during, expected = FAULTS[fault]
    [health] = watch_load(gpus, start=start, during=during)
    assert health.findings == (expected,)
    [figure] = health_figures([health], "")
    assert (figure.check, figure.value, figure.finding) == ("failed", 1, expected)
    assert judge(figure, None)["status"] == "failed"


def test_the_readings_of_a_fault_carry_its_numbers(gpus):
    [health] = watch_load(gpus, during={"reasons": 0x44, "xids": [79], "ecc_uncorrected": 1, "rows": (0, 1, 1, 0)})
    readings = health.readings
    assert readings["clocks_event_reasons"] == ["SW power cap", "HW thermal slowdown"]
    assert readings["xid_events"] == [79]
    assert (readings["ecc_uncorrected_volatile_start"], readings["ecc_uncorrected_volatile_end"]) == (0, 1)
    assert readings["remapped_rows"] == {"corrected": 0, "uncorrected": 1, "pending": True, "failure": False}
    assert len(health.findings) == 4


def test_the_sw_power_cap_alone_is_not_a_finding(gpus):
    [health] = watch_load(gpus, during={"reasons": 0x4 | 0x1 | 0x2 | 0x10 | 0x100})
    assert health.findings == ()
    assert health.readings["clocks_event_reasons"] == [
        "GPU idle",
        "applications clocks setting",
        "SW power cap",
        "sync boost",
        "display clock setting",
    ]


def test_a_link_downtrained_at_idle_counts_by_the_best_seen_under_load(gpus):
    idle = {"pcie_gen": 1, "pcie_width": 4}
    gpus["GPU-0"].update(idle)
    watch = HealthWatch([("cuda:0", "GPU-0", None)])
    watch.sample()  # before the load reaches the GPU
    gpus["GPU-0"].update(pcie_gen=5, pcie_width=16)
    watch.sample()
    gpus["GPU-0"].update(idle)  # the load is over when finish() samples
    [health] = watch.finish()
    assert health.findings == ()
    assert (health.readings["pcie_gen_max_seen"], health.readings["pcie_width_max_seen"]) == (5, 16)


def test_unanswered_queries_leave_their_readings_none_without_a_finding(gpus):
    refused = {"reasons", "sm_clock", "temperature", "slowdown", "power_mw", "limit_mw", "default_mw", "pcie_gen"}
    refused |= {"max_gen", "ecc_corrected", "ecc_uncorrected", "retired_sbe", "retired_dbe", "pending", "rows"}
    [health] = watch_load(gpus, start={"unsupported": refused})
    assert health.findings == ()
    readings = health.readings
    for key in (
        "clocks_event_reasons",
        "sm_clock_mhz_min",
        "temperature_c_max",
        "slowdown_temperature_c",
        "power_w_max",
        "power_limit_w",
        "power_default_limit_w",
        "pcie_gen_max_seen",
        "pcie_gen_max",
        "ecc_corrected_volatile_start",
        "ecc_uncorrected_volatile_end",
        "retired_pages_start",
        "retired_pages_end",
        "retired_pages_pending",
        "remapped_rows",
    ):
        assert readings[key] is None, key
    assert (readings["pcie_width_max_seen"], readings["sm_clock_max_mhz"]) == (16, 1980)  # the others still read
    assert health_figures([health], "")[0].check == "pass"


def test_retired_pages_unsupported_on_one_cause_counts_the_other(gpus):
    [health] = watch_load(gpus, start={"unsupported": {"retired_sbe"}}, during={"retired_dbe": [0x3000]})
    assert health.findings == ("pages retired during the load: 1 (0 → 1)",)


def test_xid_registration_unsupported_is_tolerated(gpus):
    [health] = watch_load(gpus, start={"events_unsupported": True}, during={"xids": [79]})
    assert health.findings == ()
    assert health.readings["xid_events"] == []
    assert health.readings["xid_watch"].startswith("unsupported: nvmlDeviceRegisterEvents")
    assert gpus["fake"].freed == [[]]  # the unused event set was freed at once


def test_an_older_pynvml_reads_the_throttle_reasons(gpus):
    [health] = watch_load(gpus, start={"old_pynvml": True}, during={"reasons": 0x40})
    assert health.findings == ("HW thermal slowdown while loaded (clocks-event reasons 0x40, SM clock 1980–1980 MHz)",)


def test_a_gpu_nvml_cannot_find_is_unmeasured_not_passed(gpus):
    [known, unknown] = watch_load(gpus, labels=(("cuda:0", "GPU-0"), ("cuda:7", "GPU-missing")))
    assert known.findings == () and unknown.findings == ()
    assert unknown.why_missing == "not measurable here: NVML has no device for GPU-missing"
    figures = health_figures([known, unknown], "")
    assert [(f.name, f.check, f.value) for f in figures] == [("health/cuda:0", "pass", 0), ("health/cuda:7", "", None)]
    assert figures[1].why_missing == unknown.why_missing


def test_two_gpus_one_failed_make_two_figures(gpus):
    gpus["GPU-1"]["xids"] = [79]
    watch = HealthWatch([("cuda:0", "GPU-0", None), ("cuda:1", "GPU-1", None)])
    watch.sample()
    healths = watch.finish()
    assert watch.finish() is healths  # finishing twice reads nothing again
    figures = health_figures(healths, watch.why_not)
    assert [(f.name, f.check, f.value, f.n, f.finding) for f in figures] == [
        ("health/cuda:0", "pass", 0, 2, ""),
        ("health/cuda:1", "failed", 1, 2, "XID critical errors during the load: XID 79"),
    ]
    assert [judge(figure, None)["passed"] for figure in figures] == [True, False]


def test_without_nvml_one_figure_says_why(monkeypatch):
    why = "no NVML: pynvml (package nvidia-ml-py) not installed"
    monkeypatch.setattr("ddlbench.train.health.nvml", lambda: (None, why))
    watch = HealthWatch([("cuda:0", "GPU-0", None)])
    watch.sample()
    assert watch.why_not == f"not measurable here: {why}"
    assert watch.finish() == []
    [figure] = health_figures([], watch.why_not)
    assert (figure.name, figure.value, figure.check, figure.n) == ("health/gpus", None, "", 0)
    assert figure.why_missing == figure.basis == watch.why_not
    assert judge(figure, None)["passed"] is None  # neither passes nor fails a certificate


def test_nvml_without_gpus_gives_no_figures(gpus):
    watch = HealthWatch([])
    assert (watch.finish(), health_figures(watch.finish(), watch.why_not)) == ([], [])


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here")
def test_the_real_nvml_is_absent_here():
    ddlbench.train.nvml.nvml.cache_clear()
    try:
        watch = HealthWatch([("cuda:0", None, None)])
        assert watch.why_not.startswith("not measurable here: no NVML")
        assert watch.finish() == []
    finally:
        ddlbench.train.nvml.nvml.cache_clear()


def test_the_suites_health_figures_come_from_each_ranks_reading_per_gpu_and_node():
    from dataclasses import replace

    from ddlbench.certify.health import record_health_figures
    from ddlbench.records import RankResult
    from tests.test_records import sample_record

    def rank(r: int, node: str, health: dict) -> RankResult:
        return RankResult(rank=r, hostname=node, step_times_s=(0.1,), losses=(1.0,), peak_rss_bytes=1, health=health)

    healthy = GpuHealth(label="cuda:0", uuid="GPU-a", pci_bus_id="0:1", readings={"samples": 2}, findings=())
    thermal = "HW thermal slowdown while loaded (clocks-event reasons 0x40, SM clock 900–1980 MHz)"
    hot = GpuHealth(label="cuda:0", uuid="GPU-b", pci_bus_id="0:2", readings={"samples": 2}, findings=(thermal,))
    record = replace(sample_record(), ranks=(rank(0, "n1", healthy.to_dict()), rank(1, "n2", hot.to_dict())))
    figures = {(f.name, f.node): f for f in record_health_figures([record])}
    assert set(figures) == {("health/GPU-a", "n1"), ("health/GPU-b", "n2")}
    assert figures[("health/GPU-a", "n1")].check == "pass"
    assert figures[("health/GPU-b", "n2")].check == "failed" and "HW thermal" in figures[("health/GPU-b", "n2")].finding
    why = "not measurable here: no NVML: pynvml (package nvidia-ml-py) not installed"
    cpu = replace(sample_record(), ranks=(rank(0, "n1", {"why_not": why}),))
    (unread,) = record_health_figures([cpu])
    assert (unread.name, unread.value, unread.check, unread.why_missing) == ("health/gpus", None, "", why)
