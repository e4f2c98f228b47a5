"""What every workflow does before Snakemake schedules anything: one preamble for the Snakefile,
workflow/adaptive.smk and workflow/calibrate.smk (workflow/rules/preamble.smk calls `prepare_workflow`).

The config is validated and planned (a sweep, or a calibration suite); with a site file (`--profile
slurm`) each point's allocation is computed; then the checks that would otherwise fail later, point by
point, are made once:

- SLURM, on the login node (outside an allocation): every point against the live cluster — partition,
  node count, time limit, CPUs, memory and GPUs per node, account (ddlbench.launch.slurm.check_resources)
  — so that a bad sweep is refused before anything is queued; and Snakemake's --jobs against the room
  the user's submit limits leave now (ddlbench.launch.limits.check_room), since the plugin counts a job
  sbatch refuses as failed;
- inside an allocation with DDLBENCH_PACK=1 (a sweep only): every point fits the allocation's nodes, a
  pinned one's node among them, since its points go to the dispatcher there (ddlbench.launch.inside);
- locally: every point's ranks × cores per rank against `--cores` (ddlbench.launch.cores.check_plan_cores),
  since Snakemake would quietly cap a job's threads and the ranks would share cores unseen. `--lint`
  parses the workflow with cores=1 whatever is asked and runs nothing, so it is not checked then;
- a sweep with a machine file: the points predicted not to fit or not to finish are listed with their
  figures, and with `predicted_misfits: skip` left unrun, each with a record saying so (foresee_misfits).

The adaptive sweep checks its sweep's full plan: a sampled point has the ranks, threads and allocation
of its configuration there, only fewer steps.

It sits above what it checks (the launch layer, the calibration suites of ddlbench.calibrate, the
adaptive settings), beside the orchestration that runs them (tests/test_layering.py states the layers).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch.admission import check_submission
from ddlbench.launch.cores import check_plan_cores
from ddlbench.launch.inside import PACK_VAR, packing_enabled
from ddlbench.launch.limits import check_room, read_limits
from ddlbench.launch.resources import Resources, calibration_job, load_site, snakemake_resources
from ddlbench.launch.slurm import allocation_hosts, query_cluster, query_queue
from ddlbench.launch.submission import plan_resources
from ddlbench.launch.submit_once import guard_sbatch
from ddlbench.provenance import host_memory_bytes

# what each workflow plans from its config, and how a refusal names that config
WORKFLOWS = {"sweep": "sweep config", "adaptive": "sweep config", "calibration": "calibration suite"}


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A workflow's plan, checked: what its rules read."""

    kind: str  # a key of WORKFLOWS
    plan: Any = None  # ddlbench.sweep.Plan of a sweep (Snakefile, adaptive.smk)
    suite: Any = None  # ddlbench.calibrate.suite.Suite (calibrate.smk)
    adaptive: Any = None  # ddlbench.config.adaptive.AdaptiveSettings (adaptive.smk)
    points: tuple[Any, ...] = ()  # what runs, or (adaptive) what the sampled points are drawn from
    # point id → Snakemake resources: its allocation's on SLURM; locally, where the sweep's machine file
    # predicts it, its memory on this host (mem_mb), which host_memory_mb bounds for the points run at once
    resources: dict[str, dict[str, Any]]
    # a sweep inside an allocation with DDLBENCH_PACK=1: its points go to the dispatcher (`ddlbench
    # run-packed`, ddlbench.launch.inside), one Snakemake job for all of them, each a job step there
    packed: bool = False
    # the calibrate_machine rule's job (a sweep with `calibrate:`, on SLURM): where the sweep's points run
    calibration_resources: dict[str, Any] = field(default_factory=dict)
    host_memory_mb: int | None = None  # this host's memory, MB: the local points' mem_mb together stay under it

    @property
    def what(self) -> str:
        return WORKFLOWS[self.kind]


def prepare_workflow(
    kind: str,
    config: Mapping[str, Any],
    *,
    site_file: str | None,
    cores: int | None,
    linting: bool = False,
    environ: Mapping[str, str] | None = None,
    jobs: int | None = None,
    dry_run: bool = False,
) -> Prepared:
    """Plan `config` as workflow `kind` and make the checks every workflow makes before it runs; a
    ddlbench.errors.DdlbenchError names the first problem (the preamble prints it in one line). `jobs`
    is Snakemake's --jobs: with a site file, at most that many jobs are queued at once. `dry_run`
    (Snakemake's -n): nothing is written, not even the records of points left unrun for their prediction."""
    if kind not in WORKFLOWS:
        raise ConfigError("workflow", f"{kind!r} is not a workflow; accepted: {', '.join(WORKFLOWS)}")
    prepared = _PLANNERS[kind](dict(config))
    environ = os.environ if environ is None else environ
    planned: dict[str, Resources] = {}
    calibration: Resources | None = None
    if site_file:
        site = load_site(site_file)
        config = prepared.plan.config if prepared.plan else None
        planned = plan_resources(prepared.points, site, sweep=config, environ=environ)
        calibration = _calibration_job(prepared, planned, site)
        if not environ.get("SLURM_JOB_ID"):  # on the login node, once, before any submission
            to_check = list(planned.items()) + ([("calibrate_machine", calibration)] if calibration else [])
            check_submission(to_check, account_required=True if site.require_account else None)
            if not linting and environ is os.environ:  # the plugin's sbatch outlives an outage, never submitting twice
                folder = prepared.plan.config.sweep_dir if prepared.plan else getattr(prepared.suite, "folder", None)
                guard_sbatch(Path(folder) / "logs" / "sbatch-guard.log" if folder else None)
            if jobs and planned and not linting:
                _check_queue_room(prepared, site, jobs=jobs)
    elif packing_enabled(environ):
        _check_packed(prepared, environ)
        return replace(prepared, packed=True)
    elif not linting:
        check_plan_cores(list(prepared.points), cores)
    host_bytes: dict[str, int] = {}
    if prepared.kind == "sweep" and not linting and not environ.get("SLURM_JOB_ID"):  # once, before any job
        foresee_misfits(prepared.plan, on_slurm=bool(site_file), write=not dry_run, host_bytes=host_bytes)
    resources = {point_id: snakemake_resources(allocation) for point_id, allocation in planned.items()}
    calibrating = snakemake_resources(calibration) if calibration else {}
    prepared = replace(prepared, resources=resources, calibration_resources=calibrating)
    if not site_file and prepared.plan is not None and getattr(prepared.plan.config, "alone", False):
        # one point at a time: each asks for the host's one `host` slot (registered by the preamble), and so
        # does the sweep's own calibration, whose timings a point beside it would disturb as much
        prepared = replace(
            prepared,
            resources={point.point_id: {"host": 1} for point in prepared.points},
            calibration_resources={"host": 1},
        )
    host = host_memory_bytes()
    if site_file or host is None or len(host_bytes) < len(prepared.points):
        return prepared
    # Locally, Snakemake runs points side by side as --cores allows; two that each fit alone may not fit
    # together (two single-rank gpt_large points, 11 and 14 GB predicted, on a 23 GB host: both ended by
    # the out-of-memory killer, 2026-12-02). Each point asks for its predicted memory, MB (2**20 bytes,
    # rounded up), at most the host's.
    host_mb = host // 2**20
    local = {
        point_id: {**prepared.resources.get(point_id, {}), "mem_mb": min(host_mb, -(-used // 2**20))}
        for point_id, used in host_bytes.items()
    }
    return replace(prepared, resources=local, host_memory_mb=host_mb)


def foresee_misfits(
    plan: Any,
    *,
    on_slurm: bool,
    say: Callable[[str], None] | None = None,
    write: bool = True,
    host_bytes: dict[str, int] | None = None,
) -> list[Any]:
    """The sweep's points predicted not to fit or not to finish (ddlbench.analysis.analytic.foresight), said
    on stderr with their figures; with `predicted_misfits: skip`, each without a record gets one saying it
    was not run (nothing measured is overwritten; `write` False: only said, as `ddlbench plan` does). On
    SLURM a node's ranks share its memory; locally every rank of a point shares this host's. `host_bytes`:
    filled with each point's predicted bytes on its host (ddlbench.analysis.analytic.foresight.foresee)."""
    from ddlbench.analysis.analytic.foresight import NOT_RUN, foresee
    from ddlbench.launch.runner import write_not_run_record
    from ddlbench.records import record_path

    config = plan.config
    say = say or (lambda line: sys.stderr.write(line + "\n"))
    sharing = (lambda point: point.ranks_per_node) if on_slurm else (lambda point: point.world_size)
    misfits, source = foresee(
        plan.points, config.machine_path, sweep_dir=config.sweep_dir, ranks_per_host=sharing, host_bytes=host_bytes
    )
    if not misfits:
        return []
    action = "left unrun, each with a record saying so" if config.predicted_misfits == "skip" else "run anyway"
    say(f"{len(misfits)} prediction(s) of point(s) that will not fit or not finish ({source}); {action} "
        f"(sweep key predicted_misfits: {config.predicted_misfits}):")  # fmt: skip
    points = plan.by_id()
    for misfit in misfits:
        say(f"  {misfit.point_id}: {misfit.text}")
        out = record_path(config.sweep_dir, misfit.point_id)
        if write and config.predicted_misfits == "skip" and not out.exists():
            reason = f"{NOT_RUN}{'not to fit' if misfit.kind == 'memory' else 'not to finish'}: {misfit.text}"
            write_not_run_record(points[misfit.point_id], out=out, status=misfit.status, reason=reason)
    return misfits


def _calibration_job(prepared: Prepared, planned: Mapping[str, Resources], site: Any) -> Resources | None:
    """The job that calibrates the machine before a sweep's points are predicted (its `calibrate:` suite),
    on the nodes the points run on; None for a sweep without one."""
    suite_path = getattr(prepared.plan.config, "calibrate", None) if prepared.plan else None
    if not suite_path or not planned:
        return None
    from ddlbench.calibrate.suite import load_suite

    return calibration_job(load_suite(Path(suite_path)).points, planned, site)


def _check_packed(prepared: Prepared, environ: Mapping[str, str]) -> None:
    """A sweep's points, packed into this allocation: each fits its nodes, a pinned one's node among them.
    Only a sweep is packed (the dispatcher runs a sweep's points, each on its own, by ddlbench.launch.inside)."""
    if prepared.kind != "sweep":
        raise DdlbenchError(
            f"{PACK_VAR}=1 packs a sweep's points (the Snakefile) into this allocation; the {prepared.kind} "
            f"workflow's points are not packed: run it here without {PACK_VAR} (each of its jobs then one srun "
            "step over the allocation), or from the login node with --profile slurm"
        )
    hosts = allocation_hosts(environ)
    for point in prepared.points:
        if point.nodes > len(hosts):
            raise ConfigError(
                "nodes", f"point {point.point_id} needs {point.nodes} nodes; this allocation has {len(hosts)}"
            )
        if point.node and point.node not in hosts:
            raise ConfigError("each_node", f"point {point.point_id} is pinned to {point.node}, not in this allocation")


def _check_queue_room(prepared: Prepared, site: Any, *, jobs: int) -> None:
    partition = getattr(prepared.plan.config, "slurm_partition", None) if prepared.plan else None
    limits = read_limits(query_cluster(), account=site.account, qos=site.qos, partition=partition or site.partition)
    if not limits.submit:
        return
    to_run = len(prepared.points)
    if prepared.kind == "sweep":  # a point with a record is not run again (a deleted record is how to rerun)
        from ddlbench.records import record_path

        sweep_dir = prepared.plan.config.sweep_dir
        to_run = sum(1 for point in prepared.points if not record_path(sweep_dir, point.point_id).exists())
    check_room(jobs=jobs, to_run=to_run, limits=limits, queue=query_queue())


def refusal(kind: str, error: Exception) -> str:
    """The one line a workflow prints when `prepare_workflow` refuses."""
    return f"ddlbench: invalid {WORKFLOWS.get(kind, 'workflow config')}: {error}\n"


def _sweep(config: dict[str, Any]) -> Prepared:
    from ddlbench.sweep import plan_sweep

    plan = plan_sweep(config)
    return Prepared(kind="sweep", plan=plan, points=plan.points, resources={})


def _adaptive(config: dict[str, Any]) -> Prepared:
    from ddlbench.config.adaptive import adaptive_settings
    from ddlbench.sweep import plan_sweep

    plan = plan_sweep(config)
    settings = adaptive_settings(plan.config.to_dict()["adaptive"])
    return Prepared(kind="adaptive", plan=plan, adaptive=settings, points=plan.points, resources={})


def _calibration(config: dict[str, Any]) -> Prepared:
    from ddlbench.calibrate.suite import load_suite

    suite = load_suite(raw=config) if config else load_suite()
    return Prepared(kind="calibration", suite=suite, points=suite.points, resources={})


_PLANNERS: dict[str, Callable[[dict[str, Any]], Prepared]] = {
    "sweep": _sweep,
    "adaptive": _adaptive,
    "calibration": _calibration,
}
