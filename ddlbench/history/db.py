"""The results database: every sweep's figures and every certificate, in one SQLite file.

One row per run (a sweep's aggregated table, or a certificate) in `runs`: what it was (kind, name),
where (system, partition), which configuration (config_hash: the sweep's resolved config), when (date,
UTC ISO 8601), with what (ddlbench version, measurement version, git commit) and, for a certificate,
whether it passed. Its figures in `figures`, named as certificates name them (ddlbench.history.figures),
each with its unit, value, 95 % interval, n and basis, its node when per node, and for a certificate its
reference band and verdict. With each run its provenance (`provenance`, JSON: the software and cards its
records ran with, ddlbench.history.store.run_provenance), so that `compare` names what changed. A run
whose content was stored before (same kind, config hash and figures: an aggregate run again over the
same records) is not stored twice.

Where: one rule for every command, so that `history` and `compare` read what a sweep wrote: --db (the
`aggregate` step's --history), else $DDLBENCH_HISTORY, else history.sqlite in the sweep's `results_dir`
(`aggregate` and `certify` know their sweep; `history` and `compare` are told it with --configfile),
else in results/, the default `results_dir`, relative to the working directory like it.

Writers at once: each store is one `BEGIN IMMEDIATE` transaction (the duplicate check, the run and its
figures together), and a writer waits up to BUSY_TIMEOUT_S for another to finish; readers take no write
lock. So any number of sweeps may aggregate into one database at once and none loses a run, wherever
the filesystem's POSIX (fcntl) locks hold. They hold on a local disk. On a network filesystem they hold
as far as its locks do: GPFS and Lustre mounted with `flock` lock across hosts, Lustre with `localflock`
and NFS mounted `nolock` within one host only, and NFS's lock manager is known to lose locks (SQLite
warns that a database there can be corrupted). ddlbench writes only in `aggregate` and `certify`, which
run where Snakemake runs (local rules), never in a SLURM job: sweeps started from one login node write
from one host. Sweeps started from several hosts into one database on a network filesystem need its
locks to hold across hosts, or a database each ($DDLBENCH_HISTORY). The journal is SQLite's default
rollback journal: write-ahead logging needs shared memory between the writers, which no network
filesystem provides. A write to a database on a network filesystem logs a warning that says so.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddlbench.errors import DdlbenchError

log = logging.getLogger(__name__)

# 2: figures keep their per-launch values (`launches`); 3: runs keep their provenance (`provenance`). An older
# file is upgraded in place
SCHEMA_VERSION = 3
DB_NAME = "history.sqlite"
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another's transaction before giving up
# filesystems whose locks may not hold across hosts (a write there logs a warning)
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "beegfs", "ceph", "glusterfs", "fuse.sshfs")
RUN_FIELDS = (
    "kind", "name", "system", "partition", "config_hash", "date", "ddlbench_version", "measurement_version",
    "git_commit", "passed", "source",
)  # fmt: skip
RUN_COLUMNS = ", ".join(("id", *RUN_FIELDS, "provenance"))  # what a Run is read from
FIGURE_FIELDS = (
    "name", "unit", "kind", "value", "ci_low", "ci_high", "n", "basis", "node", "status", "reference", "lower",
    "upper", "passed", "launches",
)  # fmt: skip
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('sweep', 'certificate')),
    name TEXT NOT NULL, system TEXT NOT NULL, partition TEXT NOT NULL, config_hash TEXT NOT NULL,
    date TEXT NOT NULL, ddlbench_version TEXT NOT NULL, measurement_version INTEGER NOT NULL,
    git_commit TEXT, passed INTEGER, source TEXT, fingerprint TEXT NOT NULL UNIQUE, provenance TEXT
);
CREATE TABLE IF NOT EXISTS figures (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL, unit TEXT NOT NULL, kind TEXT, value REAL, ci_low REAL, ci_high REAL, n INTEGER,
    basis TEXT, node TEXT, status TEXT, reference REAL, lower REAL, upper REAL, passed INTEGER,
    launches TEXT
);
CREATE INDEX IF NOT EXISTS figures_by_run ON figures (run_id);
CREATE INDEX IF NOT EXISTS runs_by_place ON runs (system, partition, kind, date);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');
"""


@dataclass(frozen=True, kw_only=True)
class Run:
    id: int
    kind: str
    name: str
    system: str
    partition: str
    config_hash: str
    date: str
    ddlbench_version: str
    measurement_version: int
    git_commit: str | None
    passed: bool | None
    source: str | None
    figures: tuple[dict[str, Any], ...] = ()
    # the software and cards the run's records ran with (ddlbench.history.store.run_provenance); {} for runs
    # stored before schema 3
    provenance: dict[str, str] = field(default_factory=dict)


def history_path(db: str | Path | None = None, *, results_dir: str | Path = "results") -> Path:
    """The database: `db` when given, else $DDLBENCH_HISTORY, else history.sqlite in `results_dir`."""
    return Path(db or os.environ.get("DDLBENCH_HISTORY") or Path(results_dir) / DB_NAME)


def results_dir_of(configfile: str | Path | None) -> Path:
    """The `results_dir` of a sweep (or certification suite) file, the schema's default without one or
    where the file names none; only that key is read, so a certification suite's words pass."""
    from ddlbench.config.schema import sweep_schema

    default = Path(sweep_schema()["properties"]["results_dir"]["default"])
    if configfile is None:
        return default
    try:
        raw = yaml.safe_load(Path(configfile).read_text())
    except OSError as exc:
        raise DdlbenchError(f"--configfile: cannot read {str(configfile)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise DdlbenchError(f"--configfile: {configfile} is not valid YAML: {exc}") from None
    value = raw.get("results_dir") if isinstance(raw, dict) else None
    if value is not None and (not isinstance(value, str) or not value):
        raise DdlbenchError(f"--configfile: results_dir: {value!r} in {configfile} is not a folder name")
    return Path(value) if value else default


@contextmanager
def connect(db: str | Path | None = None, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """The database in one transaction (`BEGIN IMMEDIATE` to write), committed when the block ends;
    created with its schema on first use; refused by name when it is not ours or stays locked."""
    path = history_path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    if write:
        _warn_on_network_filesystem(path.resolve())
    connection = None
    try:
        try:
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            connection.execute("PRAGMA foreign_keys = ON")
            version = _schema_version(connection)
            if version is None:  # a new database (a concurrent creator's schema is kept: IF NOT EXISTS)
                connection.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}\nCOMMIT;")
                version = _schema_version(connection)
            if version is not None and int(version) < SCHEMA_VERSION:
                version = _upgrade(connection)
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise DdlbenchError(
                    f"{path} stayed locked for {BUSY_TIMEOUT_S:g} s by another writer ({exc}); on a network "
                    "filesystem, see docs/certify.md on where its locks hold"
                ) from None
            raise DdlbenchError(f"{path} cannot be opened as a results database: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise DdlbenchError(f"{path} is not a ddlbench results database: {exc}") from None
        if version is None or int(version) != SCHEMA_VERSION:
            raise DdlbenchError(f"{path} has schema version {version}; this ddlbench reads {SCHEMA_VERSION}")
        try:
            yield connection
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    finally:
        if connection is not None:
            connection.close()


def _upgrade(connection: sqlite3.Connection) -> str | None:
    """Version 1 → 2: figures gain `launches`; 2 → 3: runs gain `provenance`. Checked again under the write
    lock, so two processes that both found an old version upgrade it once."""
    connection.execute("BEGIN IMMEDIATE")
    version = int(_schema_version(connection) or 0)
    if version == 1:
        connection.execute("ALTER TABLE figures ADD COLUMN launches TEXT")
    if version in (1, 2):
        connection.execute("ALTER TABLE runs ADD COLUMN provenance TEXT")
        connection.execute(f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version'")
    connection.execute("COMMIT")
    return _schema_version(connection)


def _schema_version(connection: sqlite3.Connection) -> str | None:
    """The stored schema version; None for a database without ddlbench's tables yet."""
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return None
    return None if row is None else str(row[0])


@functools.cache
def _warn_on_network_filesystem(path: Path) -> None:
    """Once per database and process: say so when it sits on a filesystem whose locks may not hold."""
    kind = filesystem_of(path)
    if kind in NETWORK_FILESYSTEMS:
        log.warning(
            "the results database %s is on a %s filesystem: concurrent writers are safe only as far as its "
            "locks hold (docs/certify.md says where); write from one host, or give each host its own "
            "database with $DDLBENCH_HISTORY",
            path,
            kind,
        )


def filesystem_of(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding `path` (Linux: the longest mount point above it in
    /proc/self/mounts, or `mounts` given as that file's text); None where that cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def store_run(run: dict[str, Any], figures: list[dict[str, Any]], *, db: str | Path | None = None) -> tuple[int, bool]:
    """Store a run and its figures; (its id, whether it is new). `run` holds RUN_FIELDS, and may hold
    `provenance` (a dict of text; not part of the fingerprint: the same figures are the same run)."""
    missing = [field for field in RUN_FIELDS if field not in run]
    if missing:
        raise DdlbenchError(f"a history run needs {', '.join(missing)}")
    rows = [tuple(_plain(figure.get(field), field) for field in FIGURE_FIELDS) for figure in figures]
    fingerprint = hashlib.sha256(
        json.dumps([run["kind"], run["config_hash"], run["system"], run["partition"], rows], default=str).encode()
    ).hexdigest()
    with connect(db, write=True) as connection:  # the duplicate check and the insert in one transaction
        found = connection.execute("SELECT id FROM runs WHERE fingerprint = ?", (fingerprint,)).fetchone()
        if found:
            return int(found[0]), False
        values = [_plain(run[field]) for field in RUN_FIELDS]
        provenance = json.dumps(run["provenance"], sort_keys=True) if run.get("provenance") else None
        cursor = connection.execute(
            f"INSERT INTO runs ({', '.join(RUN_FIELDS)}, fingerprint, provenance) "
            f"VALUES ({', '.join('?' * len(RUN_FIELDS))}, ?, ?)",
            (*values, fingerprint, provenance),
        )
        run_id = int(cursor.lastrowid)
        connection.executemany(
            f"INSERT INTO figures (run_id, {', '.join(FIGURE_FIELDS)}) VALUES (?{', ?' * len(FIGURE_FIELDS)})",
            [(run_id, *row) for row in rows],
        )
    return run_id, True


def list_runs(
    *, db: str | Path | None = None, system: str | None = None, partition: str | None = None, kind: str | None = None
) -> list[Run]:
    """Runs, oldest first, filtered by place and kind; without their figures."""
    where, args = _filters(system=system, partition=partition, kind=kind)
    with connect(db) as connection:
        rows = connection.execute(f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY date, id", args)
        return [_run(row) for row in rows.fetchall()]


def load_run(run_id: int | str, *, db: str | Path | None = None) -> Run:
    """One run with its figures; an unknown id is refused with the ids there are."""
    try:
        key = int(run_id)
    except ValueError:
        raise DdlbenchError(f"run {run_id!r} is not a run id (an integer; `ddlbench history` lists them)") from None
    with connect(db) as connection:
        row = connection.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (key,)).fetchone()
        if row is None:
            count = connection.execute("SELECT count(*), min(id), max(id) FROM runs").fetchone()
            known = f"ids {count[1]}..{count[2]}" if count[0] else "none yet"
            raise DdlbenchError(
                f"no run {key} in {history_path(db)} (runs there: {known}; `ddlbench history` lists them)"
            )
        figures = connection.execute(
            f"SELECT {', '.join(FIGURE_FIELDS)} FROM figures WHERE run_id = ? ORDER BY rowid", (key,)
        ).fetchall()
    run = _run(row)
    return Run(**{**run.__dict__, "figures": tuple(_figure(values) for values in figures)})


def last_passing_certificate(
    system: str,
    partition: str,
    *,
    suite: str,
    measurement_version: int,
    db: str | Path | None = None,
    before_id: int | None = None,
) -> Run | None:
    """The baseline of a regression check: the newest certificate that passed of the same system,
    partition, suite (its name) and measurement version (before run `before_id`). Another suite's
    figures are other configurations, and another measurement version's figures mean other things."""
    where = "kind = 'certificate' AND passed = 1 AND system = ? AND partition = ? AND name = ?"
    where += " AND measurement_version = ?"
    args: list[Any] = [system, partition, suite, measurement_version]
    if before_id is not None:
        where += " AND id < ?"
        args.append(before_id)
    with connect(db) as connection:
        row = connection.execute(
            f"SELECT id FROM runs WHERE {where} ORDER BY date DESC, id DESC LIMIT 1", args
        ).fetchone()
    return load_run(row[0], db=db) if row else None


def _filters(**values: str | None) -> tuple[str, list[str]]:
    clauses = [(f"{name} = ?", value) for name, value in values.items() if value is not None]
    if not clauses:
        return "", []
    return " WHERE " + " AND ".join(clause for clause, _ in clauses), [value for _, value in clauses]


def _run(row: tuple[Any, ...]) -> Run:
    data = dict(zip(("id", *RUN_FIELDS, "provenance"), row, strict=True))
    data["passed"] = None if data["passed"] is None else bool(data["passed"])
    data["provenance"] = json.loads(data["provenance"]) if data["provenance"] else {}
    return Run(**data)


def _figure(values: tuple[Any, ...]) -> dict[str, Any]:
    figure = dict(zip(FIGURE_FIELDS, values, strict=True))
    figure["passed"] = None if figure["passed"] is None else bool(figure["passed"])
    figure["launches"] = json.loads(figure["launches"]) if figure["launches"] else []
    return figure


def _plain(value: Any, field: str = "") -> Any:
    """SQLite's types: numpy scalars as Python ones, booleans as 0/1, launches as a JSON list (None if none)."""
    if field == "launches":
        return json.dumps([float(v) for v in value]) if value else None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    return value
