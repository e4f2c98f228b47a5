"""What a derived artefact was made from, written into it and checked where it is read.

A sweep's predictions (predictions.csv) and scaling models (models.json) are derived from its
configuration, its records and (predictions) its machine file. Each carries a stamp: the sweep's
configuration hash (SweepConfig.config_hash), the measurement version of the records it speaks of
(ddlbench.records.MEASUREMENT_VERSION), and what else it was made from: the machine file's sha256
(predictions) or the table's digest (models). The report compares the stamp with the table and config
it renders and refuses (and says why) an artefact whose stamp differs: stale models never stand beside
fresh measurements. Torch-free.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.config import SweepConfig
from ddlbench.records import MEASUREMENT_VERSION

STAMP_KEYS = ("config_hash", "measurement_version")


def sweep_stamp(config: SweepConfig) -> dict[str, Any]:
    """The stamp every derived artefact of `config` carries."""
    return {"config_hash": config.config_hash(), "measurement_version": MEASUREMENT_VERSION}


def table_digest(table: pd.DataFrame) -> str:
    """sha256 over the table's values, row by row and column by column (pandas' stable per-row hash of
    each column, in the table's order, with the column names): equal for the same table read back from
    its parquet file, different as soon as a record's figure, a point or a column changes."""
    digest = hashlib.sha256()
    for name in table.columns:
        digest.update(str(name).encode())
        column = table[name]
        if column.dtype == object:  # lists or dicts from JSON: hash their text
            column = column.map(repr)
        digest.update(pd.util.hash_pandas_object(column, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stale_reason(found: Mapping[str, Any], expected: Mapping[str, Any], *, what: str, remedy: str) -> str | None:
    """Why an artefact stamped `found` does not belong with `expected`, or None when it does."""
    missing = [key for key in expected if found.get(key) in (None, "")]
    if missing:
        return f"{what} carries no {', '.join(missing)} (written by an older ddlbench or by hand): not shown; {remedy}"
    differ = [key for key in expected if str(found[key]) != str(expected[key])]
    if not differ:
        return None
    detail = "; ".join(f"{key} {_short(found[key])} here, {_short(expected[key])} in the table" for key in differ)
    return f"{what} was made from something else ({detail}): not shown; {remedy}"


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 else text
