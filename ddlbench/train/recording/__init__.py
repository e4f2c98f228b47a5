"""Recording inside an iteration, on the rank: what each rank does during a measured step, and when.

The rank's thread marks the phases a strategy's step goes through (ddlbench.train.execution calls
`phase()` around the forward pass, backward and the optimizer step; the kernel around reading input),
and every collective it starts is stamped when issued, when it completes and while the thread waits
for it (ddlbench.train.recording.comms). From these intervals, per step, the figures of
`ddlbench.train.recording.recorder.StepAnatomy` are computed, each with its definition beside it.

One recorder per rank process (`current()`); it records only between `open_window()` and
`close_window()`, i.e. during the measured steps, so warm-up and setup cost nothing but a check. The
point's figures over its ranks, from the records, are computed in ddlbench.analysis.inside.
"""

from __future__ import annotations

from ddlbench.train.recording.recorder import PHASES, IterationRecorder, current, install, phase, wrap_in_phase

__all__ = ["PHASES", "IterationRecorder", "current", "install", "phase", "wrap_in_phase"]
