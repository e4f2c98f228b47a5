"""`ddlbench sample`: one round of the adaptive sweep, or its summary (workflow/adaptive.smk calls both).

    ddlbench sample --configfile S --round N [--out F]   # choose round N's points from rounds < N
    ddlbench sample --configfile S --summarize [--out F] # cost, savings and models once a round stopped

Rounds are <sweep>/adaptive/rounds/<N>.json; each round's short runs are measured in launches of several
points (`ddlbench run-group`), whose records are <sweep>/adaptive/launches/<launch id>.json, and the
points' records <sweep>/adaptive/points/<id>/record.json.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlbench.errors import DdlbenchError


def add_commands(commands: Any, add_sweep_options: Callable, read_sweep: Callable) -> None:
    sample = commands.add_parser("sample", help="one round of the adaptive sweep (sparse sampling), or its summary")
    add_sweep_options(sample)
    what = sample.add_mutually_exclusive_group(required=True)
    what.add_argument("--round", type=int, help="choose this round's points from the rounds before it")
    what.add_argument("--summarize", action="store_true", help="what the rounds measured, cost and predict")
    sample.add_argument("--out", type=Path, help="default: <sweep>/adaptive/rounds/<N>.json or sampling.json")
    sample.set_defaults(handler=lambda args: _sample(args, read_sweep))


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


def _sample(args: argparse.Namespace, read_sweep: Callable) -> int:
    from ddlbench.atomic import write_text_atomic
    from ddlbench.sampling.plan import plan_round
    from ddlbench.sampling.settings import adaptive_settings
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
