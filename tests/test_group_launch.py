"""Several points in one launch, for real: each keeps its own record and trains exactly as it would alone;
a failure costs only its own point; the launch's record says what the whole launch cost."""

from __future__ import annotations

import itertools
import os
from datetime import datetime

import pytest

from ddlbench.config import sweep_config_from_mapping
from ddlbench.errors import DdlbenchError
from ddlbench.launch.group import check_layout, run_group
from ddlbench.launch.runner import run_point
from ddlbench.launches import read_launch
from ddlbench.sweep import expand_sweep
from ddlbench.train.faults import ENV_VAR

SWEEP = {
    "name": "group",
    "results_dir": "/tmp/unused",
    "models": ["resnet8"],
    "datasets": ["cifar10"],
    "strategies": ["ddp"],
    "nodes": [1],
    "ranks_per_node": [1],
    "batch_size": [4, 8, 16],
    "threads": [1],
    "warmup_steps": 2,
    "steps": 3,
    "repetitions": 1,
    "timeout_s": 120,
}


def points_of(**changes):
    return list(expand_sweep(sweep_config_from_mapping(SWEEP | changes)).points)


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def losses(record) -> list[float]:
    return [loss for rank in record.ranks for loss in rank.losses]


@pytest.mark.slow
def test_points_in_one_launch_train_as_they_would_alone_and_keep_their_own_records(tmp_path):
    points = points_of()
    outs = [tmp_path / "group" / p.point_id / "record.json" for p in points]
    launch = run_group(points, outs=outs, launch_out=tmp_path / "launch.json", launch_id="r0-l0", launcher="local")
    assert read_launch(tmp_path / "launch.json") == launch
    assert [span.point_id for span in launch.points] == [p.point_id for p in points]
    assert not any(span.alone for span in launch.points)
    from ddlbench.records import read_record

    grouped = [read_record(out) for out in outs]
    assert [r.status for r in grouped] == ["ok"] * 3
    # each span lies inside the launch, one after another, and the launch's cost is nodes × its wall time
    spans = [(when(r.provenance.start_time), when(r.provenance.end_time)) for r in grouped]
    assert when(launch.start_time) <= spans[0][0] and spans[-1][1] <= when(launch.end_time)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert launch.node_s == pytest.approx(launch.nodes * launch.wall_s)
    assert launch.wall_s >= sum((end - start).total_seconds() for start, end in spans)
    # the last point, run after two others in the same processes, trains exactly as it does alone
    alone = run_point(points[-1], out=tmp_path / "alone" / "record.json", launcher="local")
    assert alone.status == "ok" and losses(alone) == losses(grouped[-1]) and len(losses(alone)) == 5


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["oom", "kill"])
def test_a_failing_point_costs_only_itself(tmp_path, monkeypatch, fault):
    from ddlbench.records import read_record

    points = points_of()
    monkeypatch.setitem(os.environ, ENV_VAR, f"{fault}@-b8-")
    outs = [tmp_path / p.point_id / "record.json" for p in points]
    launch = run_group(points, outs=outs, launch_out=tmp_path / "launch.json", launch_id="r0-l0", launcher="local")
    records = {r.point.batch_size: r for r in (read_record(out) for out in outs)}
    assert records[4].status == "ok" and records[16].status == "ok"
    alone = {span.point_id: span.alone for span in launch.points}
    # the point after the failure is run again alone; so is a rank killed without a word (its own rerun
    # then records the failure, as a point launched alone would)
    assert alone[points[2].point_id] and not alone[points[0].point_id]
    if fault == "oom":
        assert records[8].status == "oom" and not alone[points[1].point_id]
    else:
        assert records[8].status == "failed" and "without reporting an error" in records[8].reason
        assert alone[points[1].point_id]
    assert {span.point_id for span in launch.points} == {p.point_id for p in points}


def test_points_of_different_layouts_cannot_share_a_launch():
    mixed = points_of(threads=[1, 2], batch_size=[4])
    with pytest.raises(DdlbenchError, match="differ in threads"):
        check_layout(mixed)
    with pytest.raises(DdlbenchError, match="at least one point"):
        check_layout([])
    one = points_of(batch_size=[4])
    with pytest.raises(DdlbenchError, match="lists a point twice"):
        check_layout(one + one)


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        ('{"a": 1}', "got dict, need a list of point mappings"),
        ("not json", "Expecting value"),
        ('[{"model": "resnet8"}]', "missing 12 required keyword-only arguments"),
        ("[]", "at least one point"),
    ],
)
def test_bad_specs_are_refused_with_what_is_wrong(tmp_path, capsys, specs, says):
    from ddlbench.cli import main

    code = main(["run-group", "--specs", specs, "--records-dir", str(tmp_path), "--out", str(tmp_path / "l.json")])
    assert code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "l.json").exists()
