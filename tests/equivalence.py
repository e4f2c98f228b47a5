"""The check every strategy passes: a real multi-rank run (local launcher, gloo) ends with the
parameters and losses of one process training the same model on the same global batches."""

from __future__ import annotations

from pathlib import Path

import torch

from ddlbench.launch.runner import run_point
from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.sweep import resolve_layout
from ddlbench.train.kernel import build_model
from ddlbench.validity import why_skipped
from tests.conftest import make_point
from tests.reference import train_reference


def layout_point(**fields) -> Point:
    """A test point whose split and micro-batches are resolved as a sweep would resolve them."""
    fields.setdefault("split", 0)
    fields.setdefault("micro_batches", 1)
    base = make_point(**{k: v for k, v in fields.items() if k not in ("split", "micro_batches")})
    values = {"strategy": base.strategy, "nodes": base.nodes, "ranks_per_node": base.ranks_per_node}
    layout = resolve_layout(values | {"split": fields["split"], "micro_batches": fields["micro_batches"]})
    return make_point(**(fields | layout))


def check_against_reference(
    tmp_path: Path,
    *,
    rtol: float,
    atol: float,
    shards: int = 1,
    min_change: float = 1e-3,
    **fields,
) -> PointRecord:
    """Run the point on real ranks, train the reference, and assert both end in the same place.

    `shards` cuts each global batch of the reference into that many equal slices whose gradients are
    averaged (what per-slice BatchNorm statistics give); 1 is one full-batch step. Every parameter
    must match within rtol/atol, training must have moved them by more than `min_change` (or the
    comparison would prove nothing), and the recorded first and last losses must match the
    reference's. Returns the record for further checks of facts and memory.
    """
    point = layout_point(**fields)
    reason = why_skipped(point)
    assert reason is None, f"the plan would skip this point: {reason}"
    params_path = tmp_path / "params.pt"
    record = run_point(point, out=tmp_path / "record.json", launcher="local", dump_params=params_path)
    failures = "; ".join(f"rank {f.rank}: {f.error_type}: {f.message}" for f in record.failures)
    assert record.status == "ok", f"{record.status}: {record.reason} {failures}"
    assert len(record.ranks) == point.world_size

    got = torch.load(params_path)
    want, want_losses = train_reference(point, shards=shards)
    reference_model = build_model(point)
    initial = reference_model.state_dict()
    names = [name for name, _ in reference_model.named_parameters()]
    missing = sorted(set(names) - set(got))
    assert not missing, f"the strategy's full_state_dict lacks {missing[:5]}"
    for name in names:
        torch.testing.assert_close(
            got[name].float(), want[name].float(), rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )
    moved = max((got[name] - initial[name]).abs().max().item() for name in names)
    assert moved > min_change, "training did not move the parameters; the comparison would prove nothing"
    assert abs(record.metrics.loss_first - want_losses[0]) <= 10 * atol + rtol * abs(want_losses[0]) * 10
    assert abs(record.metrics.loss_last - want_losses[-1]) <= 10 * atol + rtol * abs(want_losses[-1]) * 10
    return record
