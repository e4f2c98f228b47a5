"""Predictions and the oracle's verdicts as text: a table for people, CSV and JSON for tools."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from ddlbench.analysis.analytic.oracle import Verdict
from ddlbench.analysis.analytic.predict import CSV_COLUMNS, PREDICTION_VERSION, Prediction

FORMATS = ("table", "csv", "json")


def _mb(value: float | None) -> str:
    return "?" if value is None else f"{value / 1e6:.4g}"


def _ms(value: float) -> str:
    return f"{value * 1e3:.4g}"


def predictions_csv(predictions: Sequence[Prediction]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for p in predictions:
        writer.writerow(p.to_dict())
    return out.getvalue()


def predictions_json(predictions: Sequence[Prediction], *, machine: str) -> str:
    return json.dumps(
        {
            "prediction_version": PREDICTION_VERSION,
            "machine": machine,
            "predictions": [p.to_dict() for p in predictions],
        },
        indent=1,
    )


def predictions_table(predictions: Sequence[Prediction], *, machine: str) -> str:
    header = (
        f"{'point':<44} {'step ms':>9} {'compute':>8} {'exp.comm':>8} {'hid.comm':>8} {'bubble':>8} "
        f"{'samples/s':>10} {'peak MB':>9} {'fits':>5} {'max b':>6}  bottleneck"
    )
    lines = [
        f"predicted on machine {machine!r}: times in ms per step "
        "(mean over ranks: compute + exposed comm + bubble = step), "
        "memory = the busiest rank's peak tensor memory",
        header,
        "-" * len(header),
    ]
    for p in predictions:
        fits = "?" if p.fits is None else ("yes" if p.fits else "NO")
        lines.append(
            f"{p.point_id[:44]:<44} {_ms(p.step_time_s):>9} {_ms(p.compute_s):>8} {_ms(p.comm_exposed_s):>8} "
            f"{_ms(p.comm_hidden_s):>8} {_ms(p.bubble_s):>8} {p.samples_per_s:>10.4g} {_mb(p.peak_memory_bytes):>9} "
            f"{fits:>5} {p.max_batch_size if p.max_batch_size is not None else '?':>6}  {p.bottleneck}"
        )
    sources = sorted({p.compute_source for p in predictions})
    lines.append(f"compute from: {'; '.join(sources)}")
    return "\n".join(lines) + "\n"


def verdicts_table(verdicts: Sequence[Verdict], *, model: str, dataset: str, machine: str) -> str:
    lines = [f"oracle for {model} on {dataset}, machine {machine!r} (fastest first; step in ms, peak in MB per rank)"]
    for v in verdicts:
        lines.append("")
        lines.append(f"{v.nodes} node(s), {v.world_size} ranks, global batch {v.global_batch_size}:")
        for c in v.ranked:
            s = c.setting
            label = f"{s.strategy} (split {s.split}, batch {s.batch_size}, micro {s.micro_batches})"
            if c.prediction is None:
                lines.append(f"  {label:<46} refused: {c.refused}")
                continue
            p = c.prediction
            mark = "*" if c is v.recommended else " "
            fits = "" if p.fits is not False else "  DOES NOT FIT"
            lines.append(
                f" {mark}{label:<46} {_ms(p.step_time_s):>9} ms  {p.samples_per_s:>9.4g} samples/s  "
                f"peak {_mb(p.peak_memory_bytes):>8} MB  bottleneck {p.bottleneck}{fits}"
            )
        lines.append(f"  recommended: {v.reason}")
    return "\n".join(lines) + "\n"


def verdicts_json(verdicts: Sequence[Verdict], *, machine: str) -> str:
    return json.dumps(
        {
            "machine": machine,
            "verdicts": [
                {
                    "nodes": v.nodes,
                    "world_size": v.world_size,
                    "global_batch_size": v.global_batch_size,
                    "recommended": v.recommended.setting.strategy if v.recommended else None,
                    "reason": v.reason,
                    "candidates": [
                        {"strategy": c.setting.strategy, "split": c.setting.split, "batch_size": c.setting.batch_size,
                         "micro_batches": c.setting.micro_batches, "refused": c.refused,
                         "prediction": c.prediction.to_dict() if c.prediction else None}
                        for c in v.ranked
                    ],
                }
                for v in verdicts
            ],
        },
        indent=1,
    )  # fmt: skip
