"""The rank side of a calibration: a calibration point (`point`), the microbenchmarks one rank runs for
it (`kernels`: compute and collectives; `layer_timing_kernel`: a model's blocks; `operator_kernel`:
generic operators over drawn shapes, `operator_shapes`), the rank's entry (`ranks`, which the worker
calls) and what the ranks and the point record (`records`).

Only the kernels and `ranks` import torch; the point, the shapes and the records stay torch-free, since
suites expand and machine files are fitted on a login node. The suite and its orchestration are
ddlbench.calibrate; the fits into a machine file, ddlbench.analysis.machine.
"""
