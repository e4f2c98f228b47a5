"""The host allocator a point's ranks ran with, in its record, its table row and what compare names: glibc's
defaults and its tunables move a CPU pipeline's step by a quarter (docs/analytic.md, first touch), so two
runs that differ only there must say so."""

from __future__ import annotations

import os
import subprocess

import pandas as pd

from ddlbench.analysis.aggregate import record_row
from ddlbench.history.compare import provenance_changes
from ddlbench.history.store import run_provenance
from ddlbench.provenance import ALLOCATOR_ENV_NAMES, allocator_env_seen, allocator_summary
from ddlbench.records import read_record
from tests.conftest import BIN, make_point


def test_a_rank_keeps_the_allocators_variables_and_of_ld_preload_only_allocators():
    environ = {
        "MALLOC_TRIM_THRESHOLD_": "4294967296",
        "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:/opt/site/libhook.so",
        "MALLOC_ARENA_MAX": "",  # set but empty: glibc ignores it
        "NCCL_DEBUG": "WARN",
    }
    seen = allocator_env_seen(environ)
    assert seen == {
        "MALLOC_TRIM_THRESHOLD_": "4294967296",
        "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    }
    assert allocator_summary(seen) == "MALLOC_TRIM_THRESHOLD_=4294967296 LD_PRELOAD=libjemalloc.so.2"
    assert allocator_env_seen({"LD_PRELOAD": "/opt/site/libhook.so"}) == {}
    assert allocator_summary({}) == "glibc defaults"


def _run(tmp_path, name: str, extra: dict[str, str]):
    out = tmp_path / name / "record.json"
    environ = {key: value for key, value in os.environ.items() if key not in ALLOCATOR_ENV_NAMES}
    done = subprocess.run(
        [str(BIN / "ddlbench"), "run-point", "--spec", make_point(nodes=2).to_json(), "--out", str(out)],
        env={**environ, **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return read_record(out)


def test_two_runs_that_differ_only_in_the_allocator_say_so(tmp_path):
    plain = _run(tmp_path, "plain", {})
    kept = _run(tmp_path, "kept", {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"})
    assert plain.status == kept.status == "ok"
    assert [rank.allocator_env for rank in plain.ranks] == [{}, {}]
    assert plain.provenance.allocator == "glibc defaults"
    # each rank saw the variables its launcher passed on, and the point says it once for both
    wanted = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
    assert [rank.allocator_env for rank in kept.ranks] == [wanted, wanted]
    assert kept.provenance.allocator == "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296"
    # the table's column, the run's stored provenance and what compare names between the two
    before, after = (run_provenance(pd.DataFrame([record_row(r)])) for r in (plain, kept))
    assert provenance_changes(before, after) == [
        "host allocator glibc defaults → MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296"
    ]
