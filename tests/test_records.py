"""Records: round trip, atomic writes, schema versions; statistics as numpy computes them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddlbench.records import (
    Metrics,
    PointRecord,
    Provenance,
    RankFailure,
    RankResult,
    RecordError,
    Stats,
    read_record,
    write_record,
)
from tests.conftest import make_point


def sample_record(status="ok") -> PointRecord:
    point = make_point(nodes=2)
    ranks = tuple(
        RankResult(
            rank=r,
            hostname=f"n{r}",
            step_times_s=(0.1, 0.2, 0.3),
            losses=(2.3, 2.2, 2.1, 2.0),
            peak_rss_bytes=10**8,
        )
        for r in range(2)
    )
    return PointRecord(
        point_id=point.point_id,
        point=point,
        status=status,
        reason=None if status == "ok" else "rank 1 on n1: InjectedFault: boom",
        metrics=Metrics(
            step_time_s=Stats.of([0.1, 0.2, 0.3]),
            samples_per_s=Stats.of([160.0, 80.0, 53.3]),
            samples_per_s_overall=80.0,
            global_batch_size=16,
            peak_rss_bytes=10**8,
            cuda_peak_allocated_bytes=None,
            cuda_peak_reserved_bytes=None,
            loss_first=2.3,
            loss_last=2.0,
        )
        if status == "ok"
        else None,
        provenance=Provenance(
            ddlbench_version="0.1.0",
            git_commit="abc",
            git_dirty=False,
            python_version="3.11.7",
            torch_version="2.13.0",
            backend="gloo",
            launcher="local",
            hostnames=("n0", "n1"),
            cpu_model="cpu",
            gpu_model=None,
            slurm_job_id="42",
            config_hash=point.spec_hash,
            start_time="t0",
            end_time="t1",
        ),
        ranks=ranks,
        failures=()
        if status == "ok"
        else (
            RankFailure(
                rank=1,
                hostname="n1",
                error_type="InjectedFault",
                message="boom",
                traceback="tb",
                out_of_memory=False,
                time=1.0,
            ),
        ),
    )


@pytest.mark.parametrize("status", ["ok", "failed"])
def test_record_round_trip(tmp_path, status):
    record = sample_record(status)
    path = tmp_path / "points" / record.point_id / "record.json"
    write_record(path, record)
    assert read_record(path) == record
    assert json.loads(path.read_text())["schema_version"] == PointRecord.SCHEMA_VERSION
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]  # no temporary file left behind


def test_unknown_schema_version_is_refused(tmp_path):
    path = tmp_path / "record.json"
    write_record(path, sample_record())
    data = json.loads(path.read_text()) | {"schema_version": 99}
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="schema version 99 is not supported"):
        read_record(path)


def test_truncated_record_is_a_clear_error(tmp_path):
    path = tmp_path / "record.json"
    path.write_text('{"schema_version": 1, "point_id"')
    with pytest.raises(RecordError, match="cannot read record"):
        read_record(path)


@pytest.mark.parametrize(
    "values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.random.default_rng(0).random(101))]
)
def test_stats_match_numpy(values):
    stats = Stats.of(values)
    assert stats.median == pytest.approx(np.percentile(values, 50))
    assert stats.p5 == pytest.approx(np.percentile(values, 5))
    assert stats.p95 == pytest.approx(np.percentile(values, 95))
    assert stats.mean == pytest.approx(np.mean(values))
    assert (stats.min, stats.max, stats.n) == (min(values), max(values), len(values))
