"""Shared fixtures: the repository root, tiny points and sweeps, and running the CLI as a user would."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddlbench.point import Point

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def pytest_configure(config):
    """The tests' own processes (pytest and its xdist workers) compute on one intra-op thread. What they
    compute in process (models' real backward passes, small models learning) is checked for its values,
    never timed, and it runs beside other workers, their ranks and SLURM's jobs: with torch's default of
    one thread per core, each parallel region waits at its barrier for a second thread the scheduler has
    given to someone else. Under two busy processes at nice 0, a small model learning `tokens_small` at
    nice 10 burned 37-43 CPU-s and did not end in 300 s on two threads; on one it ended in 108-116 s with
    10-11 CPU-s (torch 2.10 and 2.13, 2026-12-07). A point's ranks are not affected: the launcher gives them
    their point's threads (ddlbench.launch.command), and a test that needs other threads sets them."""
    try:
        import torch
    except ImportError:  # torch made unimportable (make torch-free)
        return
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _history_outside_the_repository(tmp_path_factory):
    """Sweeps that tests aggregate store their figures in a results database of the test session, never
    in the repository's results/ (tests that check the database name their own, --db or the env)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DDLBENCH_HISTORY", str(tmp_path_factory.mktemp("history") / "history.sqlite"))
        yield


@pytest.fixture(autouse=True)
def _no_site_launch_settings_left_behind():
    """A test that plans SLURM resources passes its site's launch settings on in the environment
    (ddlbench.launch.placement.pass_on); the next test starts without them."""
    yield
    os.environ.pop("DDLBENCH_LAUNCH_SETTINGS", None)


SLURM_MODULES = "test_slurm_"  # the modules of the tests marked slurm: one group under xdist
SLURM_NICE = int(os.environ.get("DDLBENCH_SLURM_NICE", "-5"))  # what tests/cluster/slurm.sh gives its daemons


def pytest_itemcollected(item):
    """A test marked slurm lives in a tests/test_slurm_*.py module, where `make test` runs it in the
    SLURM group (pytest_xdist_make_scheduler below)."""
    if item.get_closest_marker("slurm") and not item.path.name.startswith(SLURM_MODULES):
        raise pytest.UsageError(f"{item.nodeid} is marked slurm: move it into a tests/{SLURM_MODULES}*.py module")


def pytest_collection_modifyitems(config, items):
    """The SLURM tests first (a stable sort): the longest group, started before the others."""
    items.sort(key=lambda item: not item.path.name.startswith(SLURM_MODULES))


def pytest_runtest_setup(item):
    """The process that runs a SLURM test, and what it starts (Snakemake, ddlbench, sbatch), at the CPU
    priority of the test cluster's daemons and jobs (tests/cluster/slurm.sh: nice -5), where it may raise
    it (root, as in CI): the SLURM group is `make test`'s longest path and mostly waits, and the CPU-bound
    tests beside it then fill the time it leaves instead of slowing each of its steps."""
    if item.path.name.startswith(SLURM_MODULES) and os.getpriority(os.PRIO_PROCESS, 0) > SLURM_NICE:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, SLURM_NICE)


CPU_LOG_VAR = "DDLBENCH_TEST_CPU_LOG"  # a file: each test appends a JSON line of its wall and CPU seconds


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Where CI's minutes go, in CPU rather than wall seconds (wall time on a shared 2-core host says how
    long a test waited as much as what it cost): with $DDLBENCH_TEST_CPU_LOG set, each test appends its
    wall seconds, the pytest process's own CPU seconds (user + system, all its threads) and those of the
    processes it started and waited for (RUSAGE_CHILDREN: the CLI, its ranks, Snakemake; not SLURM's
    jobs, which slurmd starts), from setup to teardown; with the venv it ran in and when it ended (Unix s)."""
    path = os.environ.get(CPU_LOG_VAR)
    if not path:
        return (yield)
    import json
    import resource
    import time

    def cpu(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    wall, own, children = time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    result = yield
    line = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - wall, 3),
        "own_cpu_s": round(cpu(resource.RUSAGE_SELF) - own, 3),
        "children_cpu_s": round(cpu(resource.RUSAGE_CHILDREN) - children, 3),
        "venv": Path(sys.prefix).name,  # .venv or .venv-floor: CI runs some tests in both
        "ended": round(time.time(), 1),
    }
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")
    return result


@pytest.hookimpl(optionalhook=True)  # xdist's hook: inert where xdist is not installed
def pytest_xdist_make_scheduler(config, log):
    """How `pytest -n N` (what `make test` runs) shares the tests among its workers: a module's tests on
    one worker, one after another (some look for processes their own tests started), and every
    tests/test_slurm_*.py module as one group, so no two cluster tests run at once (they share the one
    test cluster, and the outage test stops its controller), while the CPU-bound tests run beside them.
    A hook of xdist's own: its xdist_group marks do not reach its scheduler under pytest 9.2, which
    made a node's id read-only. xdist hands out scopes with the most tests first (its loadscope reorder);
    off here, so that they go in collection order, the SLURM group first (pytest_collection_modifyitems):
    with it on, the SLURM group (38 tests) started 272 s into a CI run, after larger modules, on the
    critical path."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class SlurmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "slurm" if Path(path).name.startswith(SLURM_MODULES) else path

    return SlurmTogether(config, log)


@pytest.fixture
def repo() -> Path:
    return REPO


def make_point(**overrides) -> Point:
    """A point small enough to train in a second or two on one CPU core."""
    fields = dict(
        model="resnet8",
        dataset="cifar10",
        strategy="ddp",
        nodes=1,
        ranks_per_node=1,
        batch_size=8,
        threads=1,
        repetition=0,
        warmup_steps=1,
        steps=3,
        seed=0,
        learning_rate=0.05,
        timeout_s=120.0,
        model_options=(("norm", "batch"),),
        # correctness tests run 2-4 ranks on 2-core CI machines: sharing cores is allowed there and
        # recorded; the tests of the refusal itself set oversubscribe=False
        oversubscribe=True,
    )
    fields.update(overrides)
    return Point(**fields)


@pytest.fixture
def horovod_installed() -> None:
    """Skip where Horovod is not importable (`make horovod` installs it), unless DDLBENCH_REQUIRE_HOROVOD=1
    (CI sets it), where that is a failure."""
    if importlib.util.find_spec("horovod") is None:
        if os.environ.get("DDLBENCH_REQUIRE_HOROVOD") == "1":
            pytest.fail("DDLBENCH_REQUIRE_HOROVOD=1 but horovod is not installed; run `make horovod`")
        pytest.skip("horovod is not installed; run `make horovod`")


@pytest.fixture
def point_factory():
    return make_point


@pytest.fixture
def write_sweep(tmp_path):
    """Write a sweep YAML into tmp_path (results inside tmp_path too) and return its path."""

    def write(filename: str = "sweep.yaml", /, **config) -> Path:
        data = {"name": "tiny", "results_dir": str(tmp_path / "results")} | config
        path = tmp_path / filename
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 600):
    """Run the installed `ddlbench` console script in a subprocess."""
    return subprocess.run(
        [str(BIN / "ddlbench"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def cpu_machine_data(**changes) -> dict:
    """A minimal CPU machine file (2 cores, flat compute rates, one link, no collectives), with `changes` on top:
    what a model test needs to read a toy calibration's entries back and predict with them."""
    data = {
        "name": "cpu",
        "source": "measured",
        "device": {"kind": "cpu", "per_node": 2, "memory_bytes": 16e9, "threads_per_rank": 1},
        "compute": {"matmul_flop_per_s": {"fp32": {"value": 5e10}}, "conv_flop_per_s": {"fp32": {"value": 3e10}}},
        "links": {"intra_node": {"alpha_s": 2e-4, "beta_s_per_byte": 5e-10}},
        "collectives": [],
    }
    return data | changes


def tiny_operator_suite(tmp_path: Path, name: str, collectives: tuple[str, ...] = ("all_reduce",)) -> Path:
    """A calibration suite of seconds on two ranks: one small matmul, a few collective sizes and 4 operator
    shapes a kind (timed in turn by one rank and by both), written to tmp_path/suite.yaml."""
    suite = {
        "name": name,
        "results_dir": str(tmp_path / "results"),
        "ranks_per_node": 2,
        "precisions": ["fp32"],
        "matmul_sizes": [32],
        "conv_shapes": [],
        "memory_bytes": 4096,
        "collectives": list(collectives),
        "message_bytes": [64, 128, 256],
        "warmup": 0,
        "iterations": 2,
        "operators": {"samples": 4, "max_flop": 2.0e6, "max_elements": 65536},
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def leave_spawned_rank() -> None:
    """End a rank started by torch.multiprocessing.spawn once its results are written, as ddlbench's own worker
    ends (ddlbench.launch.worker._exit): past the interpreter's teardown, where a finished rank that used the
    profiler and gloo can still abort ("terminate called without an active exception", SIGABRT: a thread
    destroyed while joinable). CI saw it once on 2026-12-03, in test_meta_init's 4-rank fsdp case, after
    every rank had written its results."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_snakemake(*args: str, env: dict[str, str] | None = None, timeout: float = 900):
    """Run the real Snakemake on the repository's Snakefile, with the venv's bin first on PATH."""
    environ = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run(
        [str(BIN / "snakemake"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environ,
        timeout=timeout,
    )


def job_counts(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's job-count table (rule → jobs, and `total`), from a real or a dry run."""
    counts = {}
    for line in (result.stdout + result.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and not line.startswith(" "):
            counts[parts[0]] = int(parts[1])
    return counts
