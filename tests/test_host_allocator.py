"""The sweep key `host_allocator` (ddlbench.launch.command.allocator_env): `retain` starts a point's ranks with glibc
told to keep what it frees, `system` leaves the environment's allocator alone; the points are different
configurations, the records say what each rank saw, a calibration records its policy and a prediction of the
other policy says so (docs/analytic.md, "The host allocator")."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import allocator_notes
from ddlbench.calibrate.suite import load_suite
from ddlbench.config import load_sweep_config
from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch.command import RETAIN_ENV, allocator_env, process_env
from ddlbench.provenance import ALLOCATOR_ENV_NAMES
from ddlbench.records import read_record
from ddlbench.sweep import expand_sweep
from tests.conftest import BIN, make_point

# a 64 MiB block taken as c10's CPU allocator takes a tensor's storage (posix_memalign, 64-byte aligned), filled,
# then freed: the resident set (/proc/self/statm) before and after the free, in pages
# (in the process's main thread, or in another one, as gloo's threads take their buffers)
HOLD = """
import ctypes, os, sys, threading
libc = ctypes.CDLL("libc.so.6")
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])
def hold():
    block = ctypes.c_void_p()
    assert libc.posix_memalign(ctypes.byref(block), 64, 64 * 2**20) == 0
    ctypes.memset(block, 1, 64 * 2**20)
    held = resident()
    libc.free(block)
    print(held - resident(), os.sysconf("SC_PAGE_SIZE"))
if sys.argv[1] == "thread":
    worker = threading.Thread(target=hold)
    worker.start()
    worker.join()
else:
    hold()
"""
BLOCK = 64 * 2**20


def _clean_environ() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ALLOCATOR_ENV_NAMES}


def _handed_back_bytes(point, where: str = "main", *, without: tuple[str, ...] = ()) -> int:
    """The bytes HOLD's block gave back, in a process started with `point`'s variables but those `without`."""
    environ = _clean_environ()
    started = {name: value for name, value in process_env(point, environ).items() if name not in without}
    done = subprocess.run(
        [sys.executable, "-c", HOLD, where],
        env={**environ, **started},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    pages, page = (int(x) for x in done.stdout.split())
    return pages * page


def test_retain_keeps_a_freed_block_and_system_hands_it_back():
    """What the key does, in a process started as a launcher starts a rank: with glibc's defaults a freed 64 MiB
    block is unmapped (its pages go back to the kernel, and the next block of that size is mapped anew and faults
    on each page at first touch: 2-3 ns an fp32 element here); with retain the heap keeps it resident."""
    system, retain = (_handed_back_bytes(make_point(host_allocator=policy)) for policy in ("system", "retain"))
    assert system >= 0.99 * BLOCK, system
    assert retain <= 0.01 * BLOCK, retain


def test_retain_keeps_a_block_another_thread_freed():
    """gloo's threads take the buffers of its collectives. glibc gives each thread past the first an arena of
    64 MiB heaps, which maps a block that size or larger anew whatever the mapping threshold: without one arena
    for all threads (MALLOC_ARENA_MAX=1) the block goes back to the kernel as with the system allocator."""
    system, retain = (_handed_back_bytes(make_point(host_allocator=p), "thread") for p in ("system", "retain"))
    assert system >= 0.99 * BLOCK, system
    assert retain <= 0.01 * BLOCK, retain
    spread = _handed_back_bytes(make_point(host_allocator="retain"), "thread", without=("MALLOC_ARENA_MAX",))
    assert spread >= 0.99 * BLOCK, spread


def test_retain_fills_only_what_the_environment_does_not_set_and_system_sets_nothing():
    point = make_point(host_allocator="retain")
    assert allocator_env(point, {}) == RETAIN_ENV
    own = {"MALLOC_TRIM_THRESHOLD_": "1048576"}
    assert allocator_env(point, own) == {k: v for k, v in RETAIN_ENV.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    assert allocator_env(make_point(), {}) == {}
    assert process_env(point, {})["OMP_NUM_THREADS"] == "1"
    with pytest.raises(DdlbenchError, match=r"'jemalloc' is not one of: retain, system"):
        allocator_env(make_point(host_allocator="jemalloc"), {})


def test_a_retain_points_ranks_record_the_variables_and_it_is_a_configuration_of_its_own(tmp_path):
    point = make_point(nodes=2, host_allocator="retain")
    assert point.point_id != make_point(nodes=2).point_id  # a different configuration
    assert "host_allocator" not in make_point().to_dict()  # a system point keeps the id it had before the key
    out = tmp_path / "record.json"
    done = subprocess.run(
        [str(BIN / "ddlbench"), "run-point", "--spec", point.to_json(), "--out", str(out)],
        env=_clean_environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = read_record(out)
    assert record.status == "ok"
    assert [rank.allocator_env for rank in record.ranks] == [RETAIN_ENV, RETAIN_ENV]


def test_the_sweep_and_the_suite_take_the_key_and_refuse_another_value(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    base = "name: a\nmodels: [resnet8]\ndatasets: [cifar10]\nstrategies: [ddp]\nnodes: [1]\nranks_per_node: [1]\n"
    base += "batch_size: [8]\nthreads: [1]\n"
    sweep.write_text(base + "host_allocator: retain\n")
    config = load_sweep_config(sweep)
    assert {point.host_allocator for point in expand_sweep(config).points} == {"retain"}
    sweep.write_text(base + "host_allocator: jemalloc\n")
    with pytest.raises(ConfigError, match=r"host_allocator.*(system|retain)"):
        load_sweep_config(sweep)
    suite = load_suite(raw={"collectives": ["all_reduce"], "host_allocator": "retain"})
    assert {point.host_allocator for point in suite.points} == {"retain"}
    assert {point.host_allocator for point in load_suite(raw={"collectives": ["all_reduce"]}).points} == {"system"}


def test_a_point_of_another_policy_than_the_calibrations_is_predicted_with_a_note():
    def machine(policy):
        data = {"name": "m", "source": "measured", "device": {"kind": "cpu"}, "compute": {}, "links": {}}
        return MachineModel.from_dict(data | ({"host_allocator": policy} if policy else {}))

    system = Setting(model="resnet8", dataset="cifar10", strategy="ddp", nodes=1, ranks_per_node=1, batch_size=8)
    retain = dataclasses.replace(system, host_allocator="retain")
    assert allocator_notes(retain, machine("retain")) == []
    assert allocator_notes(system, machine(None)) == []  # a calibration from before the key: the environment's
    (note,) = allocator_notes(retain, machine(None))
    assert "runs retain" in note and "calibrated with system" in note
    assert allocator_notes(system, machine("retain"))
