"""Energy per sample and the provenance of the software and the card (issue 31, items 4 and 5).

NVML does not exist on a CPU host, so its readings are tested through a fake `pynvml` module put in
sys.modules, with the facts read on an H200 (driver 580.159.04, CUDA 13.0, cuDNN 91900, NCCL 2.28.9); RAPL
through a folder standing in for /sys/class/powercap. Beside them, real runs: a CPU point says its energy
is not measurable and why, `ddlbench report` shows that note or draws samples per joule, and `compare`
names a changed driver and power limit. tests/test_gpu_energy.py reads a real GPU.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ddlbench.analysis.aggregate import build_table
from ddlbench.analysis.energy import energy_figures
from ddlbench.cli import main
from ddlbench.config import sweep_config_from_mapping
from ddlbench.launch.runner import run_point
from ddlbench.provenance import collect_provenance
from ddlbench.records import EnergyReading, GpuFacts, PointRecord, RankResult, read_record, write_record
from ddlbench.report.render import render_report
from ddlbench.sweep import expand_sweep
from ddlbench.train import energy, nvml
from tests.conftest import make_point
from tests.test_aggregate import plan_of, record_for, write

UUID = "GPU-e924712e-2e2a-7546-7a31-544096520aeb"
BUS = "00000000:00:06.0"
NO_NVML_NO_RAPL = "not measurable here: no NVML, no RAPL"


class NVMLError(Exception):
    pass


def fake_pynvml(*, energy_mj: list[int] | None = None, unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    """pynvml as an H200 answered it (2026-11-28); the calls in `unsupported` raise NotSupported, and the
    energy counter answers `energy_mj` in turn (mJ)."""
    module = types.ModuleType("pynvml")
    handle = object()
    counter = iter(energy_mj or [1_000_000])
    answers = {
        "nvmlInit": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlDeviceGetHandleByUUID": lambda uuid: handle if uuid == UUID else _fail(),
        "nvmlDeviceGetHandleByPciBusId": lambda bus: handle if bus == BUS else _fail(),
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200",  # older pynvml answers bytes
        "nvmlDeviceGetUUID": lambda h: UUID,
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=BUS),
        "nvmlDeviceGetApplicationsClock": lambda h, clock: {1: 1980, 2: 3201}[clock],
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: {1: 1980, 2: 3201}[clock],
        "nvmlDeviceGetPowerManagementLimit": lambda h: 700_000,
        "nvmlDeviceGetEccMode": lambda h: [1, 1],
        "nvmlDeviceGetMigMode": lambda h: [0, 0],
        "nvmlDeviceGetPersistenceMode": lambda h: 1,
        "nvmlDeviceGetVbiosVersion": lambda h: "96.00.A5.00.1A",
        "nvmlDeviceGetNumaNodeId": lambda h: _fail(),
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: next(counter),
    }
    for name, answer in answers.items():
        setattr(module, name, _fail if name in unsupported else answer)
    module.NVMLError, module.NVML_CLOCK_SM, module.NVML_CLOCK_MEM = NVMLError, 1, 2
    return module


def _fail(*_args):
    raise NVMLError("Not Supported")


@pytest.fixture
def with_nvml(monkeypatch):
    """Put a fake pynvml in place (or None: not installed) for one test, NVML's start forgotten around it."""

    def install(module: types.ModuleType | None) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", module)
        nvml.nvml.cache_clear()

    yield install
    nvml.nvml.cache_clear()


@pytest.fixture
def powercap(tmp_path, monkeypatch):
    """A folder standing in for /sys/class/powercap: package-0 (with a core subzone) and a psys zone."""
    root = tmp_path / "powercap"
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "core"), ("intel-rapl:1", "psys")):
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "max_energy_range_uj").write_text("262143328850\n")
        (root / zone / "energy_uj").write_text("262143000000\n")
    monkeypatch.setattr(energy, "POWERCAP", root)
    return root


def test_the_gpu_and_its_driver_are_read_through_nvml_and_what_the_card_does_not_answer_is_none(with_nvml):
    with_nvml(fake_pynvml(unsupported=("nvmlDeviceGetVbiosVersion",)))
    facts = nvml.gpu_facts(uuid=UUID, pci_bus_id=BUS)
    assert facts == GpuFacts(
        source="nvml", driver_version="580.159.04", cuda_driver_version=13000, name="NVIDIA H200", uuid=UUID,
        pci_bus_id=BUS, sm_clock_app_mhz=1980, sm_clock_max_mhz=1980, mem_clock_app_mhz=3201,
        mem_clock_max_mhz=3201, power_limit_w=700.0, ecc_mode=1, ecc_mode_pending=1, mig_mode=0,
        mig_mode_pending=0, persistence_mode=1, vbios_version=None,
    )  # fmt: skip
    # found by its bus id where torch gives no UUID; on a CPU rank, the driver alone
    assert nvml.gpu_facts(uuid=None, pci_bus_id=BUS).uuid == UUID
    cpu = energy.rank_provenance(SimpleNamespace(type="cpu"))["gpu_facts"]
    assert cpu.driver_version == "580.159.04" and cpu.uuid is None


def test_without_pynvml_every_fact_is_none_and_the_record_says_no_nvml(with_nvml):
    with_nvml(None)  # `import pynvml` raises ImportError
    facts = nvml.gpu_facts(uuid=UUID, pci_bus_id=BUS)
    assert facts.source.startswith("no NVML") and "nvidia-ml-py" in facts.source
    assert all(value is None for name, value in facts.__dict__.items() if name != "source")
    assert nvml.energy_counter(uuid=UUID, pci_bus_id=BUS)[0] is None


def test_a_counter_difference_over_its_window_with_its_uncertainty_and_too_short_marked():
    counter = energy.Counter(boundary="gpu", device=UUID, method=energy.NVML_METHOD, read=lambda: 0.0,
                             wrap_j=None, period_s=energy.NVML_UPDATE_S)  # fmt: skip
    reading = energy.energy_reading(counter, 1000.0, 1350.0, 2.0)
    assert reading.energy_j == pytest.approx(350.0)
    assert reading.uncertainty_j == pytest.approx(350.0 * 2 * 0.1 / 2.0)  # energy × 2T ÷ window
    assert not reading.too_short
    assert energy.energy_reading(counter, 1000.0, 1100.0, 0.5).too_short


def test_the_gpu_counter_is_read_at_the_window_ends_in_joules(with_nvml, monkeypatch):
    with_nvml(fake_pynvml(energy_mj=[5_000_000, 5_000_000, 5_700_000]))  # probe, open, close
    monkeypatch.setattr(energy, "cuda_identity", lambda device: (UUID, BUS))
    clock = iter([10.0, 10.004, 12.0, 12.004])  # each read's start and end (s): a window of 2 s
    monkeypatch.setattr(energy.time, "perf_counter", lambda: next(clock))
    window = energy.open_energy_window(SimpleNamespace(type="cuda"), local_rank=1)
    (reading,) = window.close()
    assert (reading.boundary, reading.device, reading.method) == ("gpu", UUID, "nvml total energy counter")
    assert reading.energy_j == pytest.approx(700.0) and reading.window_s == pytest.approx(2.0)
    assert reading.uncertainty_j == pytest.approx(70.0) and not reading.too_short
    assert window.note == "RAPL: read by local rank 0 of this host"  # local rank 1 leaves RAPL to rank 0


def test_rapl_packages_are_read_by_local_rank_0_only_and_a_wrap_is_undone(with_nvml, powercap, monkeypatch):
    with_nvml(None)
    clock = iter([0.0, 0.0, 3.0, 3.0])
    monkeypatch.setattr(energy.time, "perf_counter", lambda: next(clock))
    window = energy.open_energy_window(SimpleNamespace(type="cpu"), local_rank=0)
    (powercap / "intel-rapl:0" / "energy_uj").write_text("156850\n")  # past max_energy_range_uj: wrapped
    (reading,) = window.close()  # package-0 only: its core subzone is inside it, psys is not a package
    assert (reading.boundary, reading.device, reading.method) == ("cpu-package", "package-0", "rapl energy_uj")
    assert reading.energy_j == pytest.approx((262143328850 - 262143000000 + 156850) / 1e6)
    assert reading.window_s == 3.0 and not reading.too_short
    assert window.note.startswith("no NVML")
    assert energy.open_energy_window(SimpleNamespace(type="cpu"), local_rank=1).counters == []


def reading(boundary: str, device: str, joules: float, window_s: float = 10.0) -> EnergyReading:
    period = energy.NVML_UPDATE_S if boundary == "gpu" else energy.RAPL_UPDATE_S
    return EnergyReading(boundary=boundary, device=device, method="m", energy_j=joules, window_s=window_s,
                         uncertainty_j=joules * 2 * period / window_s, too_short=window_s < 1)  # fmt: skip


def rank(number: int, host: str, *readings: EnergyReading, facts: GpuFacts | None = None) -> RankResult:
    return RankResult(rank=number, hostname=host, step_times_s=(), losses=(), peak_rss_bytes=0,
                      energy=readings, gpu_facts=facts)  # fmt: skip


def test_a_shared_gpu_and_a_host_s_packages_count_once_and_give_samples_per_joule():
    point = make_point(nodes=2, ranks_per_node=2, batch_size=16, steps=50)  # 4 ranks × 16 = 64 samples a step
    ranks = [
        rank(0, "a", reading("gpu", "GPU-1", 1000.0), reading("cpu-package", "package-0", 300.0)),
        rank(1, "a", reading("gpu", "GPU-1", 1001.0)),  # the same GPU as rank 0: counted once
        rank(2, "b", reading("gpu", "GPU-2", 1500.0), reading("cpu-package", "package-0", 200.0)),
        rank(3, "b", reading("gpu", "GPU-3", 1500.0), reading("cpu-package", "package-0", 250.0)),  # twice read
    ]
    figures = energy_figures(point, ranks)
    assert figures["energy_gpus"] == 3 and figures["energy_j"] == pytest.approx(4000.0)
    assert figures["energy_uncertainty_j"] == pytest.approx(4000.0 * 0.2 / 10.0)
    assert figures["cpu_package_energy_j"] == pytest.approx(500.0)  # (a, package-0) + (b, package-0)
    assert figures["samples_per_j"] == pytest.approx(64 * 50 / 4000.0)
    assert figures["samples_per_j_uncertainty"] == pytest.approx(64 * 50 / 4000.0 * 0.02)
    assert figures["energy_window_s"] == 10.0 and not figures["energy_too_short"]
    assert figures["energy_note"] == "3 GPU(s) by m; 2 CPU package(s) on 2 host(s) by m"


def test_a_window_under_a_second_keeps_its_energy_but_gives_no_samples_per_joule():
    figures = energy_figures(make_point(), [rank(0, "a", reading("gpu", UUID, 80.0, window_s=0.4))])
    assert figures["energy_j"] == 80.0 and figures["energy_too_short"]
    assert "samples_per_j" not in figures and "too short" in figures["energy_note"]


def test_with_neither_nvml_nor_rapl_the_point_says_not_measurable_and_why():
    no_nvml = GpuFacts(source="no NVML: pynvml (package nvidia-ml-py) not installed")
    figures = energy_figures(make_point(), [rank(0, "a", facts=no_nvml)])
    assert figures["energy_note"] == NO_NVML_NO_RAPL and "energy_j" not in figures
    on_cpu = energy_figures(make_point(), [rank(0, "a", facts=GpuFacts(source="nvml", driver_version="580"))])
    assert on_cpu["energy_note"] == "not measurable here: no GPU, no RAPL"


def test_provenance_names_the_versions_and_each_gpu_once_and_the_record_reads_back(tmp_path):
    h200 = GpuFacts(source="nvml", driver_version="580.159.04", uuid=UUID, power_limit_w=700.0)
    cuda = {"cuda_runtime_version": "13.0", "cudnn_version": 91900, "nccl_version": "2.28.9", "gpu_facts": h200}
    ranks = [replace(rank(r, "a", reading("gpu", UUID, 10.0)), **cuda) for r in range(2)]  # one GPU, 2 ranks
    provenance = collect_provenance(launcher="local", ranks=ranks, config_hash="h", start_time="", end_time="")
    assert (provenance.driver_version, provenance.cuda_runtime_version) == ("580.159.04", "13.0")
    assert (provenance.cudnn_version, provenance.nccl_version, provenance.nvml) == ("91900", "2.28.9", "nvml")
    assert provenance.gpus == (h200,)
    point = make_point()
    record = PointRecord(point_id=point.point_id, point=point, status="failed", reason="x", metrics=None,
                         provenance=provenance, ranks=tuple(ranks))  # fmt: skip
    write_record(tmp_path / "record.json", record)
    assert read_record(tmp_path / "record.json") == record
    # a record from before these fields reads with their defaults
    old = json.loads((tmp_path / "record.json").read_text())
    for name in ("driver_version", "cuda_runtime_version", "cudnn_version", "nccl_version", "gpus", "nvml"):
        del old["provenance"][name]
    for data in old["ranks"]:
        for name in ("cuda_runtime_version", "cudnn_version", "nccl_version", "gpu_facts", "energy", "energy_note"):
            del data[name]
    (tmp_path / "old.json").write_text(json.dumps(old))
    back = read_record(tmp_path / "old.json")
    assert back.provenance.gpus == () and back.ranks[0].energy == () and back.ranks[0].gpu_facts is None


def test_a_point_on_this_cpu_says_what_it_could_not_measure(tmp_path):
    record = run_point(make_point(), out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    nvml_here = importlib.util.find_spec("pynvml") is not None
    rapl_here = bool(energy.rapl_counters()[0])
    if nvml_here or rapl_here:
        pytest.skip("this host has NVML or readable RAPL; the note names what it read")
    assert record.metrics.energy_note == NO_NVML_NO_RAPL
    assert record.metrics.samples_per_j is None and record.metrics.energy_j is None
    assert record.ranks[0].gpu_facts.source.startswith("no NVML")
    assert record.provenance.nvml.startswith("no NVML") and record.provenance.driver_version is None


def with_energy(record: PointRecord, joules: float | None) -> PointRecord:
    """The record with its metrics' energy as the ranks' readings would give it (None: nothing readable)."""
    facts = GpuFacts(source="no NVML: pynvml (package nvidia-ml-py) not installed")
    readings = () if joules is None else (reading("gpu", UUID, joules),)
    ranks = [rank(0, "n0", *readings, facts=facts)]
    return replace(record, metrics=replace(record.metrics, **energy_figures(record.point, ranks)))


def test_the_report_shows_the_note_where_nothing_is_measurable_and_draws_samples_per_joule_where_it_is(
    tmp_path, capsys
):
    config = {"name": "r", "results_dir": str(tmp_path / "none"), "models": ["resnet8"], "datasets": ["cifar10"],
              "strategies": ["ddp"], "nodes": [1, 2]}  # fmt: skip
    plan = expand_sweep(sweep_config_from_mapping(config))
    write(plan, [with_energy(record_for(p, 100.0 * p.nodes), None) for p in plan.points])
    assert main(["-q", "report", "--config-json", json.dumps(plan.config.to_dict())]) == 0
    html = (plan.config.sweep_dir / "report.html").read_text()
    assert f"Energy: {NO_NVML_NO_RAPL}." in html and "<h3>Samples per joule</h3>" in html
    assert 'aria-label="Samples per joule' not in html and ">Samples per joule</text>" not in html
    measured = plan_of(tmp_path / "some", strategies=["ddp"], nodes=[1, 2])
    write(measured, [with_energy(record_for(p, 100.0 * p.nodes), 50.0 * p.nodes) for p in measured.points])
    table = build_table(measured)
    assert list(table["samples_per_j"]) == pytest.approx([p.global_batch_size * p.steps / (50.0 * p.nodes)
                                                          for p in measured.points])  # fmt: skip
    html = render_report(measured.config, table)
    assert 'aria-label="Samples per joule"' in html and NO_NVML_NO_RAPL not in html
    assert "samples/J" in html and "1 GPU(s) by m" in html


def test_compare_names_a_changed_driver_and_power_limit(tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    config = {"name": "c", "results_dir": str(tmp_path), "models": ["resnet8"], "datasets": ["cifar10"],
              "strategies": ["ddp"], "nodes": [1]}  # fmt: skip
    plan = expand_sweep(sweep_config_from_mapping(config))
    for driver, limit, speed in (("580.159.04", 700.0, 100.0), ("590.2", 600.0, 90.0)):
        gpu = GpuFacts(source="nvml", driver_version=driver, uuid=UUID, power_limit_w=limit)
        records = []
        for point in plan.points:
            record = record_for(point, speed)
            provenance = replace(record.provenance, driver_version=driver, cudnn_version="91900", gpus=(gpu,))
            records.append(replace(record, provenance=provenance))
        write(plan, records)
        args = ["-q", "report", "--config-json", json.dumps(plan.config.to_dict()), "--history", str(db)]
        assert main(args) == 0
    capsys.readouterr()
    assert main(["-q", "compare", "1", "2", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "provenance: changed: driver 580.159.04 → 590.2; GPU power limit 700 W → 600 W" in out
    assert main(["-q", "compare", "1", "2", "--db", str(db), "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["provenance_changes"]
    assert changes == ["driver 580.159.04 → 590.2", "GPU power limit 700 W → 600 W"]
    assert main(["-q", "compare", "1", "1", "--db", str(db)]) == 0
    assert "provenance: the same" in capsys.readouterr().out
