"""The point ids of a sweep, kept in its folder between runs of `ddlbench status`.

Expanding a 10,000-point sweep and hashing every point's spec into its id (ddlbench.point) takes about
half a second: most of a status that otherwise costs a stat per record. The ids are a pure function of
the validated config and of ddlbench's own code (ddlbench.sweep), so they are kept under a key made of
both: the config's canonical form, and the size and modification time of every source file of the
package (an edit or an upgrade of ddlbench changes it; stat of ~200 files, a few milliseconds). A key
that differs, or a file that cannot be read, means the sweep is expanded again and the file rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from ddlbench.atomic import write_text_atomic
from ddlbench.config import SweepConfig

log = logging.getLogger(__name__)

IDS_FILE = ".plan-ids.json"  # in the sweep folder
FORMAT = 1
_PACKAGE = Path(__file__).resolve().parents[1]  # the ddlbench package


def code_fingerprint(package: Path = _PACKAGE) -> str:
    """sha256 over (relative path, size, mtime ns) of the package's .py and .yaml files, in path order."""
    entries = []
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml")):
                path = os.path.join(root, name)
                stat = os.stat(path)
                entries.append(f"{os.path.relpath(path, package)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def plan_key(config: SweepConfig) -> str:
    """What the ids depend on: the config (its dataclass's repr: every field, in order) and the code."""
    return hashlib.sha256(f"{FORMAT}\n{config!r}\n{code_fingerprint()}".encode()).hexdigest()


def planned_point_ids(config: SweepConfig) -> list[str]:
    """The ids of the sweep's points in plan order (ddlbench.sweep.expand_sweep), from IDS_FILE in its
    folder when its key matches; else expanded, and kept there when the folder exists and can be written."""
    key = plan_key(config)
    path = config.sweep_dir / IDS_FILE
    try:
        data = json.loads(path.read_text())
        if data.get("key") == key and isinstance(data.get("ids"), list):
            return data["ids"]
    except (OSError, ValueError, AttributeError):
        pass
    from ddlbench.sweep import expand_sweep

    ids = [point.point_id for point in expand_sweep(config).points]
    if config.sweep_dir.is_dir():
        try:
            write_text_atomic(path, json.dumps({"key": key, "ids": ids}, separators=(",", ":")))
        except OSError as exc:
            log.debug("point ids not kept at %s: %s", path, exc)
    return ids
