"""What every column of the report is called, in which unit, and what it means: one mapping, read by the
HTML page (headings and their tooltips, server-rendered or drawn by the page's script) and the Markdown
summary alike, so a column is named the same everywhere.

Keys are the table's column names (ddlbench.analysis.aggregate) or, for figures the report derives,
the name the report gives them (tensor_peak_mib, cost_node_h, …). A key without an entry is shown
with its underscores turned into spaces, so a new Point field still gets a column.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlbench.analysis.keys import BASELINE_STRATEGY


@dataclass(frozen=True, kw_only=True)
class Column:
    """A column's heading, its unit ('' for counts, names and ratios) and a sentence on what it holds."""

    heading: str
    unit: str = ""
    description: str = ""

    @property
    def title(self) -> str:
        """The heading as shown: 'Throughput (samples/s)'."""
        return f"{self.heading} ({self.unit})" if self.unit else self.heading


_REPS = "median over repetitions of each repetition's window throughput (samples of the kept window ÷ its wall time)"
_STEP = "the median repetition's median step, with its 95 % CI over steps"
_PHASE = "median over kept steps of the mean over ranks, with its 95 % CI over steps"

COLUMNS: dict[str, Column] = {
    # what a point is
    "point_id": Column(heading="Point", description="the point's id: its axes, repetition and a hash of its settings"),
    "model": Column(heading="Model"),
    "dataset": Column(heading="Dataset"),
    "strategy": Column(heading="Strategy", description="parallelism strategy"),
    "strategy_options": Column(heading="Strategy options"),
    "model_options": Column(heading="Model options"),
    "nodes": Column(heading="Nodes"),
    "ranks_per_node": Column(heading="Ranks per node"),
    "split": Column(heading="Split", unit="ranks", description="ranks one model replica is split over"),
    "batch_size": Column(heading="Batch", unit="samples", description="per replica (per rank for data parallelism)"),
    "global_batch_size": Column(heading="Global batch", unit="samples", description="samples per optimizer step"),
    "micro_batches": Column(heading="Micro-batches"),
    "threads": Column(heading="Threads per rank"),
    "precision": Column(heading="Precision"),
    "channels_last": Column(heading="Channels last"),
    "compile": Column(heading="Compiled"),
    "loader_workers": Column(heading="Loader workers per rank"),
    "data_path": Column(heading="Data", description="the dataset's path, or synthetic"),
    "warmup_steps": Column(heading="Warm-up steps"),
    "steps": Column(heading="Measured steps"),
    "seed": Column(heading="Seed"),
    "learning_rate": Column(heading="Learning rate"),
    "timeout_s": Column(heading="Time limit", unit="s"),
    "oversubscribe": Column(heading="Oversubscribe allowed"),
    "trace_steps": Column(heading="Traced steps"),
    "repetition": Column(heading="Repetition"),
    "setting": Column(heading="Other settings", description="what else differs between configurations"),
    "scale": Column(heading="Scale", description="nodes × ranks per node (and batch per replica where it varies)"),
    # outcome
    "status": Column(heading="Status", description="ok, failed, oom (out of memory), timeout, or missing (no record)"),
    "reason": Column(heading="Reason"),
    "cause": Column(heading="Cause", description="the reason's kind: its exception type or its first clause"),
    "count": Column(heading="Points"),
    "examples": Column(heading="Example points"),
    "example_reason": Column(heading="Example reason"),
    "measurement_version": Column(heading="Measurement version"),
    "n_repetitions": Column(heading="Repetitions", description="successful repetitions taking part"),
    # throughput and time
    "samples_per_s": Column(heading="Throughput", unit="samples/s", description=f"global samples/s: {_REPS}"),
    "samples_per_s_steps": Column(
        heading="Throughput, median step", unit="samples/s", description=f"global samples/s of {_STEP}"
    ),
    "samples_per_s_point": Column(
        heading="Throughput, median step", unit="samples/s", description="global samples/s: the point's median step"
    ),
    "samples_per_s_overall": Column(
        heading="Window throughput", unit="samples/s", description="samples of the kept window ÷ its wall time"
    ),
    "step_time_s": Column(
        heading="Step time", unit="s", description="latest end − earliest start over ranks, median step with its CI"
    ),
    "step_time_ms": Column(
        heading="Step time", unit="ms", description="latest end − earliest start over ranks, median step with its CI"
    ),
    "step_time_median_ms": Column(heading="Step time, median", unit="ms", description="the point's median step"),
    "warmup_dropped_steps": Column(heading="Warm-up steps dropped", description="measured steps judged warming up"),
    "speedup": Column(
        heading="Speedup", unit="×", description="throughput ÷ that of the series' smallest node count (base nodes)"
    ),
    "scaling_efficiency": Column(heading="Scaling efficiency", description="speedup ÷ (nodes ÷ base nodes)"),
    "base_nodes": Column(heading="Base nodes", description="the series' smallest node count"),
    "base_samples_per_s": Column(heading="Base throughput", unit="samples/s"),
    "vs_baseline": Column(
        heading=f"vs {BASELINE_STRATEGY}",
        unit="×",
        description=f"throughput ÷ that of {BASELINE_STRATEGY} equal in everything but the strategy's own settings",
    ),
    "baseline_samples_per_s": Column(heading=f"{BASELINE_STRATEGY} throughput", unit="samples/s"),
    "cost_node_h": Column(
        heading="Cost", unit="node-h per 10⁶ samples", description="nodes ÷ throughput, in node-hours per million"
    ),
    "samples_per_j": Column(
        heading="Samples per joule",
        unit="samples/J",
        description="global samples of the measured window ÷ the GPUs' energy over it (NVML), each GPU counted "
        "once (a configuration's: its median repetition's)",
    ),
    "energy_j": Column(
        heading="GPU energy", unit="J", description="Σ over distinct GPUs of NVML's energy over the measured window"
    ),
    "winner": Column(heading="Best strategy", description="highest throughput at this scale (over launches)"),
    "runner_up": Column(heading="Runner-up"),
    "margin": Column(
        heading="Margin", unit="×", description="best ÷ runner-up throughput, geometric means over launches"
    ),
    "verdict": Column(
        heading="Verdict",
        description="from launches: Welch's t on log per-launch throughput within the cell; 'fastest' when the "
        "winner beats every other strategy at 0.05/(k−1) (k candidates), else every pair, Holm at 0.025",
    ),
    "basis": Column(heading="Basis", description="which throughput the comparison uses"),
    # memory and facts
    "tensor_peak_mib": Column(
        heading="Peak tensor memory", unit="MiB", description="highest tensor storages of any rank in a probed step"
    ),
    "peak_rss_mib": Column(heading="Peak RSS", unit="MiB", description="largest rank process's peak resident set"),
    "cuda_peak_mib": Column(heading="CUDA peak", unit="MiB", description="CUDA allocator's peak on GPUs"),
    "local_parameters_max": Column(heading="Parameters on the fullest rank"),
    "stages": Column(heading="Stages", description="pipeline or model-parallel stages"),
    "split_flops_share": Column(heading="Split FLOPs share", description="share of forward FLOPs really split"),
    "input_wait_s": Column(heading="Input wait", unit="s", description="longest host wait for a batch, per step"),
    "input_wait_share": Column(heading="Input wait share", unit="%", description="input wait ÷ step time"),
    "loss_first": Column(heading="First loss"),
    "loss_last": Column(heading="Last loss"),
    # inside the steps
    "phase_data_s": Column(heading="Data", unit="ms", description=f"waiting for the batch: {_PHASE}"),
    "phase_forward_s": Column(heading="Forward", unit="ms", description=f"forward pass and loss: {_PHASE}"),
    "phase_backward_s": Column(heading="Backward", unit="ms", description=_PHASE),
    "phase_update_s": Column(heading="Update", unit="ms", description=f"optimizer step: {_PHASE}"),
    "phase_other_s": Column(heading="Other", unit="ms", description=f"the rest of the step: {_PHASE}"),
    "phase_comm_exposed_s": Column(heading="Communication, exposed", unit="ms", description="blocked on it"),
    "phase_comm_hidden_s": Column(heading="Communication, hidden", unit="ms", description="in flight while computing"),
    "phase_exposed_p2p_s": Column(heading="Wait for neighbours", unit="ms", description="a pipeline stage's bubble"),
    "comm_overlap": Column(heading="Communication overlap", unit="%", description="Σ hidden ÷ Σ communication"),
    "update_gap_s": Column(heading="Update gap", unit="ms", description="one weight update's end to the next's start"),
    "straggler_rank": Column(heading="Straggler rank", description="the busiest rank, slowest in the most steps"),
    "straggler_host": Column(heading="Straggler host"),
    "straggler_slowest_steps": Column(heading="Slowest in", unit="steps"),
    "straggler_steps": Column(heading="Kept steps"),
    "straggler_wait_s": Column(heading="Wait for the straggler", unit="ms", description="lost by the other ranks"),
    "straggler_wait_share": Column(heading="Wait share", unit="%", description="that wait ÷ the step time"),
    "trace": Column(heading="Trace", description="Chrome/Perfetto timeline of the point (ui.perfetto.dev)"),
    # predictions (ddlbench.report.predicted)
    "measured_step_ms": Column(heading="Measured step", unit="ms"),
    "predicted_step_ms": Column(heading="Predicted step", unit="ms"),
    "time_accuracy": Column(heading="Time accuracy", unit="%", description="1 − |predicted − measured| ÷ measured"),
    "predicted_compute_ms": Column(heading="Predicted compute", unit="ms"),
    "predicted_comm_ms": Column(heading="Predicted exposed communication", unit="ms"),
    "predicted_bubble_ms": Column(heading="Predicted bubble", unit="ms"),
    "measured_peak_mb": Column(heading="Measured peak", unit="MB"),
    "predicted_peak_mb": Column(heading="Predicted peak", unit="MB"),
    "memory_accuracy": Column(heading="Memory accuracy", unit="%"),
    "bottleneck": Column(heading="Predicted bottleneck"),
    # health (a machine certificate, ddlbench.certify)
    "figure_name": Column(heading="Figure"),
    "node": Column(heading="Node"),
    "value": Column(heading="Measured", description="median, with its 95 % CI and n"),
    "band": Column(heading="Reference band", description="reference value and the range it must lie in"),
    "deviation": Column(heading="Deviation", unit="%", description="measured ÷ reference − 1"),
    "previous_value": Column(heading="Previous"),
    "change": Column(heading="Change", unit="%"),
    "previous_run": Column(heading="Previous run"),
}


def column(key: str) -> Column:
    """The column `key`, or one named after the key itself."""
    return COLUMNS.get(key) or Column(heading=key.replace("_", " ").capitalize())


def title(key: str) -> str:
    """The heading with its unit: 'Peak tensor memory (MiB)'."""
    return column(key).title
