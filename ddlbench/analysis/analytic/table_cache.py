"""Model tables kept as JSON, so the login node predicts without torch.

A prediction needs the model table of its (model, dataset, options) (ddlbench.catalog.model_table), and
building one takes torch (ddlbench.train.introspect). `find_table` looks, in order:

1. in the tables shipped with the package (SHIPPED_DIR): every built-in model on every dataset it takes,
   at its default options. `write_shipped_tables` makes them again, after a model, a dataset or the
   introspection changed; a test (tests/test_login_no_torch.py) fails while they differ from what
   build_model_table computes now:
       python -m ddlbench.analysis.analytic.table_cache
2. in the sweep's folder, <sweep>/model-tables/ (SWEEP_TABLES): rank 0 of every point a sweep runs leaves
   its table there once it trained (`keep_sweep_table`, from ddlbench.launch.worker), so options other than
   the defaults are found after any point with them ran on a compute node;
3. built with torch, where torch can be imported; else a DdlbenchError names the table and how to get it
   (callers that predict on the side, as finishing a sweep does, then go on without predictions).

A table's file is its key's name, `<model>-<dataset>[-<option>=<value>...].json` (options resolved with
their defaults, sorted), holding ModelTable.to_json() with one layer or block per line. Every figure in it
is an int or a string, so JSON gives back exactly the table written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.catalog import DATASETS, MODELS
from ddlbench.catalog.model_table import ModelTable, resolve_request
from ddlbench.errors import DdlbenchError

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).with_name("model_tables")
SWEEP_TABLES = "model-tables"  # beside points/ in a sweep's folder
REGENERATE = "python -m ddlbench.analysis.analytic.table_cache"
_PLAIN = re.compile(r"^[a-z0-9_]+$")

Options = tuple[tuple[str, str], ...]


def table_key(model: str, dataset: str, options: Options) -> str:
    """A table's file name without `.json`: the model, the dataset and the sorted options; a hash of the
    options where one of them would not make a plain file name."""
    options = tuple(sorted(options))
    if all(_PLAIN.match(part) for pair in options for part in pair):
        return "-".join([model, dataset, *(f"{name}={value}" for name, value in options)])
    digest = hashlib.sha256(json.dumps(options).encode()).hexdigest()[:16]
    return f"{model}-{dataset}-{digest}"


def table_text(table: ModelTable) -> str:
    """The table's JSON, one layer or block per line (a change reads as a diff of rows)."""
    fields = []
    for name, value in table.to_json().items():
        if name in ("layers", "blocks"):
            rows = ",\n".join(f"  {json.dumps(row, separators=(',', ':'))}" for row in value)
            fields.append(f" {json.dumps(name)}: [\n{rows}\n ]")
        else:
            fields.append(f" {json.dumps(name)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_table(folder: Path, table: ModelTable) -> Path:
    """Write `table` into `folder` under its key's name, atomically; its path."""
    path = folder / f"{table_key(table.model, table.dataset, table.options)}.json"
    write_text_atomic(path, table_text(table))
    return path


def read_table(path: Path, model: str, dataset: str, options: Options) -> ModelTable | None:
    """The table in `path` where it is there and is the one asked for; None otherwise (a file that cannot
    be read, or holds another table, is passed over with a warning)."""
    try:
        table = ModelTable.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, DdlbenchError) as exc:
        log.warning("model table %s passed over: %s", path, exc)
        return None
    if (table.model, table.dataset, table.options) != (model, dataset, tuple(sorted(options))):
        log.warning("model table %s passed over: it holds %s on %s with %s", path, table.model, table.dataset,
                    dict(table.options))  # fmt: skip
        return None
    return table


def find_table(
    model: str, dataset: str, options: Mapping[str, str] | Options = (), *, sweep_dir: Path | None = None
) -> ModelTable:
    """The model table of (model, dataset, options): shipped, else kept in the sweep's folder, else built
    with torch (the module doc). Options are resolved with the model's defaults first."""
    resolved = resolve_request(model, dataset, dict(options))
    return _find(model, dataset, resolved, None if sweep_dir is None else Path(sweep_dir))


@functools.cache
def _find(model: str, dataset: str, options: Options, sweep_dir: Path | None) -> ModelTable:
    key = table_key(model, dataset, options)
    folders = [SHIPPED_DIR] if sweep_dir is None else [SHIPPED_DIR, sweep_dir / SWEEP_TABLES]
    for folder in folders:
        table = read_table(folder / f"{key}.json", model, dataset, options)
        if table is not None:
            return table
    try:
        from ddlbench.train.introspect import build_model_table  # torch
    except ImportError as exc:
        raise DdlbenchError(
            f"no model table of {model} on {dataset} with {_options_text(options)}, and torch cannot be imported "
            f"here ({exc}): {_how_to_get(model, options, sweep_dir)}"
        ) from None
    return build_model_table(model, dataset, dict(options))


def _how_to_get(model: str, options: Options, sweep_dir: Path | None) -> str:
    if dict(options) == MODELS.get(model).default_options():
        return f"the package should ship it; make the shipped tables again with `{REGENERATE}` where torch is"
    where = sweep_dir / SWEEP_TABLES if sweep_dir is not None else f"the sweep's {SWEEP_TABLES}/ folder"
    return f"run any point of the sweep with these options on a compute node: its rank 0 leaves the table in {where}"


def _options_text(options: Options) -> str:
    return ", ".join(f"{name}={value}" for name, value in options) or "no options"


def is_shipped(model: str, dataset: str, options: Options) -> bool:
    return (SHIPPED_DIR / f"{table_key(model, dataset, options)}.json").is_file()


def keep_sweep_table(sweep_dir: Path, model: str, dataset: str, options: Mapping[str, str] | Options) -> Path | None:
    """On a compute node, with torch: write the table of (model, dataset, options) into the sweep's folder
    unless it is shipped or already there. The path written, or None."""
    resolved = resolve_request(model, dataset, dict(options))
    if is_shipped(model, dataset, resolved):
        return None
    folder = Path(sweep_dir) / SWEEP_TABLES
    if (folder / f"{table_key(model, dataset, resolved)}.json").exists():
        return None
    from ddlbench.train.introspect import build_model_table  # torch: a rank has it already

    return write_table(folder, build_model_table(model, dataset, dict(resolved)))


def shipped_entries() -> Iterator[tuple[str, str, Options]]:
    """Every built-in model on every dataset of its input kind, at the model's default options."""
    for model in MODELS.names():
        spec = MODELS.get(model)
        for dataset in DATASETS.names():
            if DATASETS.get(dataset).input_kind == spec.input_kind:
                yield model, dataset, tuple(sorted(spec.default_options().items()))


def write_shipped_tables(folder: Path = SHIPPED_DIR) -> list[Path]:
    """Build every shipped entry's table with torch and write it into `folder`, removing the tables of
    entries that no longer exist; the paths written."""
    from ddlbench.train.introspect import build_model_table  # torch

    written = [write_table(folder, build_model_table(m, d, dict(o))) for m, d, o in shipped_entries()]
    for stale in set(folder.glob("*.json")) - set(written):
        stale.unlink()
    return written


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paths = write_shipped_tables()
    log.info("%d model tables written into %s", len(paths), SHIPPED_DIR)
