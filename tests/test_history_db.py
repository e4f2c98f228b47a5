"""The results database: `history` and `compare` find the database a sweep stored into, by the same
rule; writers at once (real processes) lose nothing; a database that stays locked is refused in a line."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import yaml

from ddlbench.cli import main
from ddlbench.config import sweep_config_from_mapping
from ddlbench.errors import DdlbenchError
from ddlbench.history import db as history_db
from ddlbench.history.db import filesystem_of, list_runs, load_run, results_dir_of, store_run
from ddlbench.sweep import expand_sweep
from tests.test_aggregate import record_for, write

RUNS_PER_WRITER = 40
FIGURES_PER_RUN = 30


def run_fields(name: str, config_hash: str) -> dict:
    return {
        "kind": "sweep", "name": name, "system": "local", "partition": "local", "config_hash": config_hash,
        "date": "2026-01-01T00:00:00Z", "ddlbench_version": "0", "measurement_version": 1, "git_commit": None,
        "passed": None, "source": None,
    }  # fmt: skip


def figures_of(writer: int, run: int) -> list[dict]:
    return [
        {"name": f"train/x/{k}", "unit": "samples/s", "value": float(writer * 10_000 + run * 100 + k), "n": 8}
        for k in range(FIGURES_PER_RUN)
    ]


def _writer(db: str, writer: int, start, out: str) -> None:
    """One process storing RUNS_PER_WRITER runs of its own, each preceded by the run both writers store;
    writes (id, new) per store and when it stored first and last."""
    start.wait()
    shared, own = [], []
    began = time.monotonic()
    for run in range(RUNS_PER_WRITER):
        shared.append(store_run(run_fields("shared", "same"), figures_of(9, 0), db=db))
        own.append(store_run(run_fields(f"w{writer}", f"h{writer}-{run}"), figures_of(writer, run), db=db))
    Path(out).write_text(json.dumps({"shared": shared, "own": own, "span": [began, time.monotonic()]}))


def test_two_processes_storing_at_once_lose_nothing(tmp_path):
    db = tmp_path / "history.sqlite"
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(2)  # both writers imported and ready, then released together (however busy the host)
    outs = [tmp_path / f"writer{writer}.json" for writer in (1, 2)]
    writers = [
        spawn.Process(target=_writer, args=(str(db), w, start, str(out))) for w, out in zip((1, 2), outs, strict=True)
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=300)
    assert [process.exitcode for process in writers] == [0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    (first, last), (second_first, second_last) = (result["span"] for result in results)
    assert first < second_last and second_first < last, "the writers did not overlap: nothing was tested"
    runs = list_runs(db=db)
    assert len(runs) == 2 * RUNS_PER_WRITER + 1  # every own run, and the shared one once
    shared_ids = {run_id for result in results for run_id, _ in result["shared"]}
    assert len(shared_ids) == 1 and sum(new for result in results for _, new in result["shared"]) == 1
    own = {run_id for result in results for run_id, new in result["own"] if new}
    assert len(own) == 2 * RUNS_PER_WRITER
    with sqlite3.connect(db) as connection:
        counts = dict(connection.execute("SELECT run_id, count(*) FROM figures GROUP BY run_id").fetchall())
    assert set(counts.values()) == {FIGURES_PER_RUN} and set(counts) == own | shared_ids
    one = load_run(results[1]["own"][7][0], db=db)
    assert one.name == "w2" and [figure["value"] for figure in one.figures] == [
        figure["value"] for figure in figures_of(2, 7)
    ]


def test_writers_waiting_for_the_lock_store_the_same_content_once(tmp_path):
    """Three writers of one run wait while another holds the lock: the duplicate check is in the write's
    transaction, so one stores it and two find it (checked before waiting, all three would insert it)."""
    db = tmp_path / "history.sqlite"
    store_run(run_fields("first", "a"), figures_of(1, 0), db=db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    results: list[tuple[int, bool]] = []

    def store() -> None:
        results.append(store_run(run_fields("same", "c"), figures_of(3, 3), db=db))

    threads = [threading.Thread(target=store) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # each has read the schema and waits at BEGIN IMMEDIATE
    holder.execute("ROLLBACK")
    holder.close()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(new for _, new in results) == [False, False, True] and len({run_id for run_id, _ in results}) == 1
    assert [run.name for run in list_runs(db=db)] == ["first", "same"]


def test_a_database_that_stays_locked_is_refused_in_one_line(tmp_path, monkeypatch):
    db = tmp_path / "history.sqlite"
    store_run(run_fields("first", "a"), figures_of(1, 0), db=db)
    monkeypatch.setattr(history_db, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, mid-transaction
    try:
        with pytest.raises(DdlbenchError, match=r"history.sqlite stayed locked for 0.2 s by another writer"):
            store_run(run_fields("second", "b"), figures_of(1, 1), db=db)
        assert [run.name for run in list_runs(db=db)] == ["first"]  # readers are not held up
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store_run(run_fields("second", "b"), figures_of(1, 1), db=db)
    assert [run.name for run in list_runs(db=db)] == ["first", "second"]


def test_another_file_is_refused_as_not_a_results_database(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("not a database at all, but long enough to have a header " * 4)
    with pytest.raises(DdlbenchError, match="is not a ddlbench results database"):
        list_runs(db=path)


def tiny_sweep(results_dir: str) -> dict:
    return {"name": "found", "results_dir": results_dir, "models": ["resnet8"], "datasets": ["cifar10"],
            "strategies": ["ddp"], "nodes": [1, 2]}  # fmt: skip


def aggregate(config: dict, values: tuple[float, float]) -> None:
    """Records of the sweep at these throughputs, finished as its Snakemake step does (no --history)."""
    plan = expand_sweep(sweep_config_from_mapping(config))
    write(plan, [record_for(point, value) for point, value in zip(plan.points, values, strict=True)])
    assert main(["-q", "report", "--config-json", json.dumps(plan.config.to_dict())]) == 0


def history_json(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert main(["-q", "history", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_history_and_compare_read_the_database_the_sweep_stored_into(tmp_path, monkeypatch, capsys):
    """The rule: --db, else $DDLBENCH_HISTORY, else the --configfile's results_dir, else results/."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DDLBENCH_HISTORY")
    # a sweep with the default results_dir: found with no option at all
    aggregate(tiny_sweep("results"), (100.0, 150.0))
    assert [run["name"] for run in history_json(capsys)] == ["found"]
    # a sweep with its own results_dir: found through its file, and compared there
    elsewhere = tmp_path / "scratch" / "out"
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(tiny_sweep(str(elsewhere))))
    aggregate(tiny_sweep(str(elsewhere)), (100.0, 150.0))
    aggregate(tiny_sweep(str(elsewhere)), (130.0, 150.0))
    runs = history_json(capsys, "--configfile", str(sweep_file))
    assert len(runs) == 2 and (elsewhere / "history.sqlite").exists()
    ids = [str(run["id"]) for run in runs]
    assert main(["-q", "compare", *ids]) == 2  # results/ holds one run
    assert "no run 2 in results/history.sqlite" in capsys.readouterr().err
    assert main(["-q", "compare", ids[0], "3", "--configfile", str(sweep_file)]) == 2  # the message names the db
    assert f"no run 3 in {elsewhere / 'history.sqlite'} (runs there: ids 1..2" in capsys.readouterr().err
    assert len(history_json(capsys)) == 1  # results/ still holds only the first sweep
    assert len(history_json(capsys, "--db", str(elsewhere / "history.sqlite"))) == 2
    # $DDLBENCH_HISTORY: where the sweep stores, and so where --configfile looks too
    monkeypatch.setenv("DDLBENCH_HISTORY", str(tmp_path / "shared.sqlite"))
    aggregate(tiny_sweep(str(elsewhere)), (90.0, 150.0))
    assert len(history_json(capsys, "--configfile", str(sweep_file))) == 1


def test_results_dir_of_reads_only_that_key_and_refuses_what_is_not_a_folder(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "certify", "nodes": [1, "partition"], "results_dir": "out"}))
    assert results_dir_of(suite) == Path("out")  # a certification suite's words are not a sweep's
    suite.write_text(yaml.safe_dump({"name": "certify"}))
    assert results_dir_of(suite) == results_dir_of(None) == Path("results")
    suite.write_text(yaml.safe_dump({"results_dir": 3}))
    with pytest.raises(DdlbenchError, match=r"--configfile: results_dir: 3 in .* is not a folder name"):
        results_dir_of(suite)
    with pytest.raises(DdlbenchError, match="--configfile: cannot read"):
        results_dir_of(tmp_path / "missing.yaml")


def test_the_history_command_refuses_a_missing_sweep_file_in_one_line(tmp_path, capsys):
    assert main(["-q", "history", "--configfile", str(tmp_path / "missing.yaml")]) == 2
    assert "--configfile: cannot read" in capsys.readouterr().err


def test_the_filesystem_is_the_one_of_the_longest_mount_point_above_the_path():
    mounts = (
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /home nfs4 rw,vers=4.2 0 0\n"
        "lustre@o2ib:/scratch /scratch lustre rw,flock 0 0\n"
        "/dev/sdb1 /home/local\\040disk xfs rw 0 0\n"
    )
    assert filesystem_of(Path("/home/ana/results/history.sqlite"), mounts) == "nfs4"
    assert filesystem_of(Path("/home/local disk/history.sqlite"), mounts) == "xfs"
    assert filesystem_of(Path("/scratch/ana/history.sqlite"), mounts) == "lustre"
    assert filesystem_of(Path("/scratchy/history.sqlite"), mounts) == "ext4"


def test_a_version_1_database_is_upgraded_in_place_and_keeps_its_runs(tmp_path):
    """Schema 2 adds each figure's per-launch values, 3 each run's provenance; a file of schema 1 (neither
    column) keeps its runs, reads them without launches or provenance, and stores new runs with both."""
    path = tmp_path / "old.sqlite"
    old_schema = (
        history_db._SCHEMA.replace(",\n    launches TEXT", "")
        .replace(", provenance TEXT", "")
        .replace(f"'schema_version', '{history_db.SCHEMA_VERSION}'", "'schema_version', '1'")
    )
    assert "launches" not in old_schema and "provenance" not in old_schema
    with sqlite3.connect(path) as connection:
        connection.executescript(old_schema)
        connection.execute(
            "INSERT INTO runs (kind, name, system, partition, config_hash, date, ddlbench_version, "
            "measurement_version, fingerprint) VALUES ('sweep', 'old', 'local', 'cpu', 'h', 'd', 'v', 3, 'f')"
        )
        connection.execute(
            "INSERT INTO figures (run_id, name, unit, value) VALUES (1, 'train/x/samples_per_s', 'samples/s', 9.0)"
        )
    (old,) = list_runs(db=path)
    assert load_run(old.id, db=path).figures[0]["launches"] == [] and old.provenance == {}
    run = {"kind": "sweep", "name": "new", "system": "local", "partition": "cpu", "config_hash": "h2",
           "date": "d2", "ddlbench_version": "v", "measurement_version": 4, "git_commit": None, "passed": None,
           "source": None}  # fmt: skip
    new_id, _ = store_run(
        run | {"provenance": {"driver_version": "580.159.04"}},
        [{"name": "train/x/samples_per_s", "unit": "samples/s", "value": 10.0, "launches": (9.5, 10.0, 10.5)}],
        db=path,
    )
    assert load_run(new_id, db=path).figures[0]["launches"] == [9.5, 10.0, 10.5]
    assert load_run(new_id, db=path).provenance == {"driver_version": "580.159.04"}
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "3"
