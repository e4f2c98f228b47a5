"""Records know what produced them: another measurement version is flagged by plan and status."""

from __future__ import annotations

import dataclasses
import json

from ddlbench.config import load_sweep_config
from ddlbench.launch.status import summarize, sweep_status
from ddlbench.records import MEASUREMENT_VERSION, read_record, record_path, write_record
from ddlbench.sweep import expand_sweep
from tests.conftest import run_cli
from tests.test_records import sample_record


def write_records(sweep_file, versions):
    plan = expand_sweep(load_sweep_config(sweep_file))
    for point, version in zip(plan.points, versions, strict=False):
        record = dataclasses.replace(sample_record(), point_id=point.point_id, point=point, measurement_version=version)
        write_record(record_path(plan.config.sweep_dir, point.point_id), record)
    return plan


def test_a_record_without_a_version_is_version_1_and_new_ones_carry_the_current(tmp_path):
    path = tmp_path / "record.json"
    data = sample_record().to_dict()
    del data["measurement_version"]
    path.write_text(json.dumps(data))
    assert read_record(path).measurement_version == 1
    write_record(path, dataclasses.replace(sample_record(), measurement_version=MEASUREMENT_VERSION))
    assert read_record(path).measurement_version == MEASUREMENT_VERSION


def test_status_and_plan_flag_records_of_another_version(write_sweep):
    sweep = write_sweep(models=["resnet8"], datasets=["cifar10"], nodes=[1, 2], strategies=["ddp"])
    plan = write_records(sweep, [MEASUREMENT_VERSION - 1, MEASUREMENT_VERSION])
    statuses = sweep_status(plan, queue=[], jobs_index={}, sweep_dir=plan.config.sweep_dir)
    assert [status.other_version for status in statuses] == [True, False]
    assert f"1 of version {MEASUREMENT_VERSION - 1}" in summarize(statuses)

    listed = run_cli("plan", "--configfile", str(sweep))
    assert listed.returncode == 0, listed.stderr
    assert f"records of another measurement version: 1 of version {MEASUREMENT_VERSION - 1}" in listed.stdout
    status = run_cli("status", "--configfile", str(sweep), "--no-queue")
    assert status.returncode == 0, status.stderr
    assert f"[measurement version {MEASUREMENT_VERSION - 1}]" in status.stdout


def test_records_of_this_version_raise_no_flag(write_sweep):
    sweep = write_sweep(models=["resnet8"], datasets=["cifar10"], nodes=[1], strategies=["ddp"])
    write_records(sweep, [MEASUREMENT_VERSION])
    listed = run_cli("plan", "--configfile", str(sweep))
    assert "measurement version" not in listed.stdout
