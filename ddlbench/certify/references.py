"""Reference figures per `system:partition`, with tolerance bands: what a certificate is judged against.

A reference file (YAML) holds, per `system:partition`, per figure name (ddlbench.history.figures), one
reference in one of three forms:

    references_version: 1
    systems:
      mycluster:gpu:
        train/resnet8-cifar10-ddp-n1x1-b32-t1/samples_per_s:
          {value: 850.0, lower: -0.10, upper: null, unit: samples/s}   # tolerances as fractions
        machine/matmul_flop_per_s/fp32: [6.0e10, -0.2, 0.2, FLOP/s]    # ReFrame's (value, lower, upper, unit)
        machine/memory_bandwidth_bytes_per_s: {min: 1.0e10, unit: B/s} # absolute bounds (min, max or both)

Tolerances follow ReFrame's convention: the band is [value·(1 + lower), value·(1 + upper)] with
lower ≤ 0 ≤ upper (fractions), null for no bound on that side. Absolute bounds are taken as written;
a reference value may stand beside them (then the deviation is measured from it). ReFrame has only
the relative form (its issue #2857 asks for absolute thresholds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlbench.errors import ConfigError

REFERENCES_VERSION = 1
KEYS = ("value", "lower", "upper", "min", "max", "unit")


@dataclass(frozen=True, kw_only=True)
class Reference:
    """One figure's reference: its value (None with absolute bounds only), its band, its unit."""

    value: float | None
    low: float | None  # the band's lower end (None: unbounded)
    high: float | None
    unit: str
    form: str  # "relative" (ReFrame's fractions) or "absolute"
    lower: float | None = None  # the fractions as written (relative form)
    upper: float | None = None

    def holds(self, measured: float) -> bool:
        """Whether `measured` lies in the band, ends included."""
        return (self.low is None or measured >= self.low) and (self.high is None or measured <= self.high)

    def deviation(self, measured: float) -> float | None:
        """(measured − value) ÷ value, a fraction; None without a reference value (or at value 0)."""
        if self.value is None or self.value == 0:
            return None
        return (measured - self.value) / abs(self.value)

    def to_dict(self) -> dict[str, Any]:
        if self.form == "relative":
            return {"value": self.value, "lower": self.lower, "upper": self.upper, "unit": self.unit}
        out: dict[str, Any] = {"value": self.value} if self.value is not None else {}
        return out | {"min": self.low, "max": self.high, "unit": self.unit}


@dataclass(frozen=True, kw_only=True)
class ReferenceFile:
    path: str
    systems: dict[str, dict[str, Reference]]  # "system:partition" → figure name → reference

    def for_partition(self, system: str, partition: str) -> dict[str, Reference]:
        """The references of `system:partition`; an unknown system or partition is refused by name."""
        key = f"{system}:{partition}"
        if key in self.systems:
            return self.systems[key]
        known_systems = sorted({name.split(":", 1)[0] for name in self.systems})
        if system not in known_systems:
            raise ConfigError(
                "--system", f"{system!r} has no references in {self.path}; systems there: {', '.join(known_systems)}"
            )
        partitions = sorted(name.split(":", 1)[1] for name in self.systems if name.split(":", 1)[0] == system)
        raise ConfigError(
            "--partition",
            f"{partition!r} has no references for system {system!r} in {self.path}; its partitions: "
            + ", ".join(partitions),
        )


def load_references(path: str | Path) -> ReferenceFile:
    """Read and check a reference file; any malformed entry is refused with its key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError("--references", f"cannot read {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError("--references", f"{path} is not valid YAML{where}") from None
    return parse_references(raw, source=str(path))


def parse_references(raw: Any, *, source: str) -> ReferenceFile:
    if not isinstance(raw, Mapping) or set(raw) - {"references_version", "systems"}:
        raise ConfigError("", f"{source} must be a mapping with keys references_version and systems")
    if raw.get("references_version", REFERENCES_VERSION) != REFERENCES_VERSION:
        raise ConfigError(
            "references_version",
            f"{raw['references_version']!r} is not known; this ddlbench reads {REFERENCES_VERSION}",
        )
    systems = raw.get("systems")
    if not isinstance(systems, Mapping) or not systems:
        raise ConfigError("systems", f"{source} needs a non-empty mapping `systems` of system:partition entries")
    parsed: dict[str, dict[str, Reference]] = {}
    for name, figures in systems.items():
        where = f"systems.{name}"
        if not isinstance(name, str) or name.count(":") != 1 or not all(name.split(":")):
            raise ConfigError(where, "must be named system:partition (one colon, both parts non-empty)")
        if not isinstance(figures, Mapping) or not figures:
            raise ConfigError(where, "must map figure names to references")
        parsed[name] = {str(figure): _reference(entry, f"{where}.{figure}") for figure, entry in figures.items()}
    return ReferenceFile(path=source, systems=parsed)


def _reference(entry: Any, where: str) -> Reference:
    if isinstance(entry, list | tuple):
        if len(entry) != 4:
            raise ConfigError(
                where, f"a list reference is ReFrame's [value, lower, upper, unit]; got {len(entry)} items"
            )
        entry = dict(zip(("value", "lower", "upper", "unit"), entry, strict=True))
    if not isinstance(entry, Mapping):
        raise ConfigError(where, "must be a mapping {value, lower, upper, unit} or {min, max, unit}, or a list")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key; accepted: {', '.join(KEYS)}")
    unit = entry.get("unit")
    if not isinstance(unit, str) or not unit:
        raise ConfigError(f"{where}.unit", "every reference names its unit, e.g. samples/s")
    value = _number(entry, "value", where)
    relative = "lower" in entry or "upper" in entry
    absolute = "min" in entry or "max" in entry
    if relative and absolute:
        raise ConfigError(where, "give tolerances (lower, upper) or absolute bounds (min, max), not both")
    if relative:
        if value is None:
            raise ConfigError(f"{where}.value", "tolerances are fractions of a value; give the value")
        lower, upper = _number(entry, "lower", where), _number(entry, "upper", where)
        if lower is not None and not -1 <= lower <= 0:
            raise ConfigError(f"{where}.lower", f"{lower!r} is not a fraction in [-1, 0] (e.g. -0.1 for 10 % below)")
        if upper is not None and upper < 0:
            raise ConfigError(f"{where}.upper", f"{upper!r} is not a fraction >= 0 (e.g. 0.1 for 10 % above)")
        span = abs(value)
        return Reference(
            value=value,
            low=None if lower is None else value + lower * span,
            high=None if upper is None else value + upper * span,
            unit=unit,
            form="relative",
            lower=lower,
            upper=upper,
        )
    if not absolute:
        raise ConfigError(where, "gives no band: add lower/upper (fractions of value) or min/max (absolute)")
    low, high = _number(entry, "min", where), _number(entry, "max", where)
    if low is None and high is None:
        raise ConfigError(where, "min and max are both null: no band")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{where}.min", f"{low!r} is above max {high!r}")
    return Reference(value=value, low=low, high=high, unit=unit, form="absolute")


def _number(entry: Mapping[str, Any], key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}.{key}", f"{value!r} is not a finite number")
    return float(value)
