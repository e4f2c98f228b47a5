"""The oracle: every strategy that can run a model at a node count, ranked by predicted step time.

For each node count the candidates are the zoo's strategies that accept the model's family, each at one
layout a user would try first, all at the same global batch (Point.global_batch_size, so their samples/s
compare; a layout whose replicas do not divide it is refused with why):
- data-parallel (ddp, horovod, zero2, fsdp): one replica per rank, batch = global / ranks;
- pipelines (gpipe, 1f1b, interleaved_1f1b) and model_parallel: one replica over all ranks, batch =
  global; micro-batches 2 × stages (Narayanan et al.: the bubble (S−1)/(m+S−1) is a third at m = 2S),
  capped by the batch;
- tensor, filter, channel, spatial: one replica over all ranks;
- hybrids (dp_pp, dp_tp, dp_filter, dp_spatial): the inner split within a node (ranks_per_node), data
  parallel across nodes — the placement both ParaDL and Megatron recommend.
A candidate the catalog refuses (ddlbench.validity: divisibility, too little of the model split, too
few blocks) is listed with why. Among those that fit in memory the fastest is recommended; the line
of explanation names its step's largest part and how far ahead of the runner-up it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import Prediction, TableSource, introspected_table, predict
from ddlbench.catalog import MODELS, STRATEGIES
from ddlbench.validity import why_skipped

DATA_PARALLEL = ("ddp", "horovod", "zero2", "fsdp")
WHOLE_WORLD = ("gpipe", "1f1b", "interleaved_1f1b", "model_parallel", "tensor", "filter", "channel", "spatial")
HYBRIDS = ("dp_pp", "dp_tp", "dp_filter", "dp_spatial")
PIPELINED = ("gpipe", "1f1b", "interleaved_1f1b", "dp_pp")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    setting: Setting
    prediction: Prediction | None
    refused: str | None  # why the catalog would not run it


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One node count: every candidate ranked, the recommendation and its one-line reason."""

    nodes: int
    world_size: int
    global_batch_size: int
    ranked: tuple[Candidate, ...]  # runnable and fitting first, by predicted step time
    recommended: Candidate | None
    reason: str


def candidates(
    model: str, dataset: str, *, nodes: int, ranks_per_node: int, global_batch: int, threads: int, precision: str
) -> list[Setting]:
    """Each strategy at its first layout, batch_size = global_batch ÷ its replicas (Point.replicas); where
    that does not divide, the setting runs another global batch and `_refusal` says so."""
    family = MODELS.get(model).family
    world = nodes * ranks_per_node
    out = []
    for name in STRATEGIES.names():
        if family not in STRATEGIES.get(name).families:
            continue
        if name in DATA_PARALLEL:
            split = 1
        elif name in WHOLE_WORLD:
            split = world
        else:
            split = ranks_per_node if nodes > 1 else max(1, world // 2)
        layout = Setting(model=model, dataset=dataset, strategy=name, nodes=nodes, ranks_per_node=ranks_per_node,
                         batch_size=1, threads=threads, split=split, precision=precision)  # fmt: skip
        batch = max(1, global_batch // layout.replicas)
        stages = split * (2 if name == "interleaved_1f1b" else 1)
        micro = 1
        if name in PIPELINED:
            micro = min(batch, 2 * stages)
            while micro > 1 and batch % micro:
                micro -= 1
            if name == "interleaved_1f1b" and micro % split:
                micro = split
        out.append(replace(layout, batch_size=batch, micro_batches=micro))
    return out


def _refusal(setting: Setting, global_batch: int) -> str | None:
    if setting.global_batch_size != global_batch:
        return (
            f"global batch {global_batch} does not divide over {setting.replicas} replicas: "
            f"batch {setting.batch_size} per replica would run {setting.global_batch_size}"
        )
    return why_skipped(setting)


def consult(
    model: str,
    dataset: str,
    machine: MachineModel,
    *,
    nodes: Sequence[int],
    ranks_per_node: int | None = None,
    global_batch: int | None = None,
    threads: int = 1,
    precision: str = "fp32",
    memory_per_device: int | None = None,
    strategies: Sequence[str] | None = None,
    tables: TableSource = introspected_table,
) -> list[Verdict]:
    """The oracle's verdict for each node count."""
    rpn = ranks_per_node or machine.per_node
    verdicts = []
    for n in nodes:
        world = n * rpn
        batch = global_batch or MODELS.get(model).default_batch_size * world
        ranked: list[Candidate] = []
        for setting in candidates(
            model, dataset, nodes=n, ranks_per_node=rpn, global_batch=batch, threads=threads, precision=precision
        ):
            if strategies and setting.strategy not in strategies:
                continue
            refused = _refusal(setting, batch)
            prediction = None
            if refused is None:
                try:
                    prediction = predict(
                        setting, machine, tables=tables, memory_per_device=memory_per_device, search_batch=False
                    )
                except (ValueError, LookupError) as exc:
                    refused = f"not modelled: {exc}"
            ranked.append(Candidate(setting=setting, prediction=prediction, refused=refused))
        ranked.sort(key=_rank_key)
        fitting = [c for c in ranked if c.prediction is not None and c.prediction.fits is not False]
        best = fitting[0] if fitting else None
        verdicts.append(
            Verdict(
                nodes=n,
                world_size=world,
                global_batch_size=batch,
                ranked=tuple(ranked),
                recommended=best,
                reason=explain(best, fitting[1:2], ranked),
            )
        )
    return verdicts


def _rank_key(candidate: Candidate) -> tuple[int, float]:
    p = candidate.prediction
    if p is None:
        return (2, 0.0)
    return (1 if p.fits is False else 0, p.step_time_s)


def explain(best: Candidate | None, runner_up: Sequence[Candidate], ranked: Sequence[Candidate]) -> str:
    if best is None or best.prediction is None:
        too_big = [c.setting.strategy for c in ranked if c.prediction is not None and c.prediction.fits is False]
        if too_big:
            return f"nothing fits in memory ({', '.join(too_big)} would need more); add nodes or cut the batch"
        return "no strategy can run this model at this size"
    p = best.prediction
    parts = {"compute": p.compute_s, "exposed communication": p.comm_exposed_s, "pipeline bubble": p.bubble_s}
    largest = max(parts, key=parts.get)
    line = (
        f"{p.strategy}: {p.step_time_s * 1e3:.3g} ms per step ({p.samples_per_s:.4g} samples/s), "
        f"{parts[largest] / p.step_time_s:.0%} of it {largest}"
    )
    if runner_up and runner_up[0].prediction is not None:
        other = runner_up[0].prediction
        ahead = other.step_time_s / p.step_time_s - 1
        line += f"; {ahead:.0%} faster than {other.strategy}" if ahead >= 0.01 else f"; within 1 % of {other.strategy}"
    return line
