"""Internal commands: what the workflows call, kept off `ddlbench --help`'s list (each has its --help).

- `run-point`: one point of a sweep (or a calibration point) through a launcher, writing its record;
- `run-group`: several points of one layout in one launch (the adaptive sweep's short runs);
- `run-packed`: inside a SLURM allocation, packed points as job steps: a packed job's plan (its job script
  calls it), or a sweep's points without a record planned into the allocation (Snakemake with DDLBENCH_PACK=1);
- `sample`: one round of the adaptive sweep, or its summary (workflow/adaptive.smk calls both):

    ddlbench sample --configfile S --round N [--out F]   # choose round N's points from rounds < N
    ddlbench sample --configfile S --summarize [--out F] # cost, savings and models once a round stopped

Rounds are <sweep>/adaptive/rounds/<N>.json; each round's short runs are measured in launches of several
points (`ddlbench run-group`), whose records are <sweep>/adaptive/launches/<launch id>.json, and the
points' records <sweep>/adaptive/points/<id>/record.json.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from ddlbench.cli.common import INTERNAL, LAUNCHERS, add_sweep_options, read_sweep
from ddlbench.errors import DdlbenchError

log = logging.getLogger("ddlbench")


def add_commands(commands: Any) -> None:
    run = commands.add_parser(
        "run-point",
        section=INTERNAL,
        summary="run one point of a sweep and write its record",
        description="Run one point of a sweep (given as JSON, or by its id in a sweep) on its ranks through a "
        "launcher, and write its record, whatever happens: a point that fails for a benchmark reason (out of "
        "memory, divergence, time limit) still writes one saying why. A calibration point's spec runs its "
        "microbenchmarks instead. The Snakefile runs it once per point.",
        example="ddlbench run-point --configfile sweep.yaml "
        '--point "$(ddlbench plan --configfile sweep.yaml --format ids | head -1)"',
    )
    run.add_argument("--spec", help="the point as JSON (as the Snakefile passes it)")
    run.add_argument("--point", help="a point id of the sweep given by --configfile (see `ddlbench plan`)")
    add_sweep_options(run)
    run.add_argument("--out", type=Path, help="record path (default: the point's place in the sweep's folder)")
    run.add_argument(
        "--launcher",
        default="auto",
        choices=LAUNCHERS,
        help="auto (srun inside a SLURM allocation, mpirun inside a PBS job, else local), local, srun, mpirun",
    )
    run.add_argument(
        "--hostfile",
        type=Path,
        help="hosts for --launcher mpirun (default: $DDLBENCH_HOSTFILE, $PBS_NODEFILE, else this host)",
    )
    run.add_argument("--dump-params", type=Path, help="save the final full model state here (for checks)")
    run.add_argument(
        "--cores",
        type=int,
        help="cores granted to the point (Snakemake's {threads}); a local launch needing more is refused",
    )
    run.add_argument(
        "--site",
        type=Path,
        help="a site file whose GPU binding and network variables the ranks get (default: those passed on by "
        "the submission, else none)",
    )
    run.set_defaults(handler=_run_point)

    group = commands.add_parser(
        "run-group",
        section=INTERNAL,
        summary="run several points of one layout in one launch, each with its own record",
        description="Run several points that share one layout (nodes, ranks, threads) one after the other in "
        "one launch, each writing its own record, and write the launch's record (what the launch cost): how "
        "the adaptive sweep measures its short runs.",
        example='ddlbench run-group --specs "$(cat specs.json)" --records-dir results/default/adaptive/points '
        "--out results/default/adaptive/launches/0-0.json",
    )
    group.add_argument("--specs", required=True, help="the points as a JSON list of point specs")
    group.add_argument("--records-dir", required=True, type=Path, help="each record at DIR/<point id>/record.json")
    group.add_argument("--out", required=True, type=Path, help="the launch's record (what the launch cost)")
    group.add_argument("--launch-id", default="launch", help="the launch's name in its record")
    group.add_argument("--launcher", default="auto", choices=LAUNCHERS, help="as for run-point")
    group.add_argument("--cores", type=int, help="cores granted to the launch (Snakemake's {threads})")
    group.set_defaults(handler=_run_group)

    packed = commands.add_parser(
        "run-packed",
        section=INTERNAL,
        summary="inside a SLURM allocation: run packed points as job steps (a packed job, or a sweep in salloc)",
        description="Inside a SLURM allocation: start packed points as job steps on nodes of their own, as "
        "earlier ones end, and write the allocation's summary. With --plan, the plan `ddlbench submit --pack` "
        "wrote for its allocation (its job script calls it); with a sweep (--configfile, --config-json), the "
        "sweep's points without a record, planned by the same rule into the allocation this runs in, up to "
        "SLURM's end time for it (Snakemake calls it so with DDLBENCH_PACK=1). Exit status 3 when some point "
        "was left unrun (its record says why), 128 + the signal's number when the allocation ended first.",
        example=[
            "ddlbench run-packed --plan results/default/packed/20250101T120000-0.plan.json",
            "salloc -N 4 --exclusive ddlbench run-packed --configfile sweep.yaml",
        ],
    )
    packed.add_argument("--plan", type=Path, help="the allocation's plan (written by submit --pack)")
    add_sweep_options(packed)
    packed.add_argument("--out", type=Path, help="with a sweep: a copy of the allocation's summary here")
    packed.set_defaults(handler=_run_packed)

    sample = commands.add_parser(
        "sample",
        section=INTERNAL,
        summary="one round of the adaptive sweep (sparse sampling), or its summary",
        description="Choose the points of one round of the adaptive sweep from what the rounds before it "
        "measured (where the model's band is widest per node-second), or say why to stop; or, once a round "
        "stopped, summarise the rounds: what they measured and cost, and the models. workflow/adaptive.smk "
        "calls it.",
        example=[
            "ddlbench sample --configfile sweep.yaml --round 0",
            "ddlbench sample --configfile sweep.yaml --summarize",
        ],
    )
    add_sweep_options(sample)
    what = sample.add_mutually_exclusive_group(required=True)
    what.add_argument("--round", type=int, help="choose this round's points from the rounds before it")
    what.add_argument("--summarize", action="store_true", help="what the rounds measured, cost and predict")
    sample.add_argument("--out", type=Path, help="default: <sweep>/adaptive/rounds/<N>.json or sampling.json")
    sample.set_defaults(handler=_sample)


def _run_point(args: argparse.Namespace) -> int:
    from ddlbench.launch.runner import Interrupted, run_point
    from ddlbench.point import Point
    from ddlbench.records import record_path
    from ddlbench.sweep import expand_sweep

    if args.site:
        from ddlbench.launch.placement import pass_on
        from ddlbench.launch.resources import load_site

        pass_on(load_site(args.site))

    if args.spec:
        if args.point or args.configfile or args.config_json:
            raise DdlbenchError("give either --spec, or --point with a sweep config, not both")
        try:
            spec = json.loads(args.spec)
            if isinstance(spec, dict) and spec.get("kind") == "calibration":  # workflow/calibrate.smk's points
                return _run_calibration_point(spec, args)
            point = Point.from_dict(spec)
        except (json.JSONDecodeError, TypeError) as exc:
            raise DdlbenchError(f"--spec is not a point: {exc}") from None
        if args.out is None:
            raise DdlbenchError("--out is required with --spec")
        out = args.out
    elif args.point:
        config = read_sweep(args)
        points = expand_sweep(config).by_id()
        if args.point not in points:
            raise DdlbenchError(
                f"no point {args.point!r} in sweep {config.name!r}; `ddlbench plan --format ids` lists them"
            )
        point = points[args.point]
        out = args.out or record_path(config.sweep_dir, point.point_id)
    else:
        raise DdlbenchError("run-point needs --spec JSON, or --point ID (with --configfile)")
    try:
        record = run_point(
            point,
            out=out,
            launcher=args.launcher,
            dump_params=args.dump_params,
            cores=args.cores,
            hostfile=args.hostfile,
        )
    except Interrupted as exc:
        log.error("point %s interrupted (%s); no record written", point.point_id, exc)
        return 143
    print(f"{record.point_id}: {record.status}{': ' + record.reason if record.reason else ''} -> {out}")
    return 0


def _run_group(args: argparse.Namespace) -> int:
    from ddlbench.launch.group import run_group
    from ddlbench.launch.runner import Interrupted
    from ddlbench.point import Point

    try:
        specs = json.loads(args.specs)
        if not isinstance(specs, list) or not all(isinstance(spec, dict) for spec in specs):
            raise TypeError(f"got {type(specs).__name__}, need a list of point mappings (Point.to_dict)")
        points = [Point.from_dict(spec) for spec in specs]
    except (json.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
        raise DdlbenchError(f"--specs is not a JSON list of points: {exc}") from None
    outs = [args.records_dir / point.point_id / "record.json" for point in points]
    try:
        launch = run_group(
            points, outs=outs, launch_out=args.out, launch_id=args.launch_id, launcher=args.launcher, cores=args.cores
        )
    except Interrupted as exc:
        log.error("group launch %s interrupted (%s); its launch record is not written", args.launch_id, exc)
        return 143
    for span in launch.points:
        print(f"{span.point_id}: {span.status}{' (run again alone)' if span.alone else ''}")
    print(f"launch {launch.launch_id}: {launch.wall_s:.1f} s wall, {launch.node_s:.1f} node-s -> {args.out}")
    return 0


def _run_calibration_point(spec: dict, args: argparse.Namespace) -> int:
    from ddlbench.launch.calibration import run_calibration_point
    from ddlbench.train.calibration.point import CalibrationPoint

    if args.out is None:
        raise DdlbenchError("--out is required with --spec")
    record = run_calibration_point(
        CalibrationPoint.from_dict(spec), out=args.out, launcher=args.launcher, cores=args.cores
    )
    print(f"{record.point_id}: {record.status}{': ' + record.reason if record.reason else ''} -> {args.out}")
    return 0


def _run_packed(args: argparse.Namespace) -> int:
    from ddlbench.launch.allocation import run_allocation
    from ddlbench.launch.inside import pass_on_profile_site, run_inside, site_margin_s

    if args.plan and (args.configfile or args.config_json or args.out):
        raise DdlbenchError("give either --plan, or a sweep (--configfile, --config-json) with --out, not both")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    if args.plan:
        return run_allocation(args.plan)
    pass_on_profile_site()
    return run_inside(read_sweep(args), margin_s=site_margin_s(), out=args.out)


def adaptive_dir(config) -> Path:
    return Path(config.sweep_dir) / "adaptive"


def read_rounds(folder: Path, upto: int | None = None) -> list[dict[str, Any]]:
    """Rounds 0, 1, … (before `upto`), up to the first that stopped."""
    rounds = []
    number = 0
    while upto is None or number < upto:
        path = folder / "rounds" / f"{number}.json"
        if not path.exists():
            if upto is None:
                break
            raise DdlbenchError(f"round {number} has not been chosen yet ({path} is missing)")
        rounds.append(json.loads(path.read_text()))
        if rounds[-1]["stop"]:
            break
        number += 1
    return rounds


def read_launches(folder: Path, rounds: list[dict[str, Any]]):
    """The launch records of `rounds`, each required (a round's launches are measured before the next)."""
    from ddlbench.launches import read_launch

    launches = []
    for entry in rounds:
        for launch in entry.get("launches", []):
            path = folder / "launches" / f"{launch['id']}.json"
            if not path.exists():
                raise DdlbenchError(f"round {entry['round']}'s launch {launch['id']} has no record at {path}")
            launches.append(read_launch(path))
    return launches


def read_sampled(folder: Path, rounds: list[dict[str, Any]]):
    from ddlbench.point import Point
    from ddlbench.records import read_record

    records = []
    for entry in rounds:
        for spec in entry["points"]:
            point = Point.from_dict(spec)
            path = folder / "points" / point.point_id / "record.json"
            if not path.exists():
                raise DdlbenchError(f"round {entry['round']}'s point {point.point_id} has no record at {path}")
            records.append(read_record(path))
    return records


def _sample(args: argparse.Namespace) -> int:
    from ddlbench.atomic import write_text_atomic
    from ddlbench.config.adaptive import adaptive_settings
    from ddlbench.sampling.plan import plan_round
    from ddlbench.sampling.summary import summarize
    from ddlbench.sweep import expand_sweep

    config = read_sweep(args)
    settings = adaptive_settings(config.to_dict()["adaptive"])
    plan = expand_sweep(config)
    folder = adaptive_dir(config)
    if args.summarize:
        rounds = read_rounds(folder)
        if not rounds or not rounds[-1]["stop"]:
            raise DdlbenchError(
                f"the adaptive sweep has not stopped yet ({len(rounds)} round(s) in {folder / 'rounds'})"
            )
        result = summarize(plan.points, rounds, read_sampled(folder, rounds), read_launches(folder, rounds), settings)
        out = args.out or folder / "sampling.json"
    else:
        if args.round < 0:
            raise DdlbenchError(f"--round {args.round}: rounds count from 0")
        earlier = read_rounds(folder, args.round)
        if earlier and earlier[-1]["stop"]:
            raise DdlbenchError(
                f"round {earlier[-1]['round']} already stopped the adaptive sweep: {earlier[-1]['why']}"
            )
        records = read_sampled(folder, earlier)
        result = plan_round(args.round, plan.points, records, settings, read_launches(folder, earlier))
        out = args.out or folder / "rounds" / f"{args.round}.json"
    write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    print(f"written: {out}")
    return 0
