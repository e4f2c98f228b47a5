"""Compute time of a layer from its shape: per-operator regressions fitted to a calibration's timings of
generic operators (the machine file's `operator_timings`, ddlbench.analysis.machine.operator_timings).

A layer's time on a CPU is not its FLOPs ÷ one rate: every call pays a fixed cost (Python, the
dispatcher, the autograd node, oneDNN's reorders into and out of its blocked layout), small channel
counts leave the vector units idle, and memory traffic grows with the activations, not the FLOPs. So
each operator kind's forward and backward time is a sum of such costs, with non-negative coefficients
fitted over the calibration's shapes (Lawson & Hanson's NNLS, `solve`): first on relative residuals,
then reweighted a few times by 1/√(t·t̂) (least squares on the log ratio, to first order: a shape twice
too slow weighs as one twice too fast; on relative residuals alone the fits came out 12–66 % low in
geometric mean over their own shapes, conv backward 1.49×), and last scaled by the geometric mean of
t / t̂ over those shapes (the smearing correction: what is left of that bias, 10–24 %, goes); throughout,
each shape weighs as its time relative to the median shape's (`time_weights`: a step's relative error is
its layers' errors weighted by their time, and the many small draws had set the per-FLOP terms):

    conv2d, linear, depthwise_conv2d:
                     t = c0 + c0'·[N > 1] + c1·F + c2·F/C_in + c3·F/C_out + c4·F/P_out + c5·F/N
                         + c6·E_in + c7·E_out + c8·W + [W > K]·(c9·W + c10·F)   (K: conv2d's knot)
                         + c11·F·(⌈C_in⌉_L·⌈C_out⌉_L / (C_in·C_out) − 1)   (L: conv2d's lanes)
    elementwise:     t = c0 + c1·E_in + c2·E_out + c3·N·C + c4·C
    layer_norm, gelu, embedding:  the same + c5·W (an embedding's table: its backward writes a gradient as large)
    attention:       t = c0 + c0'·[N > 1] + c1·F + c2·F/T + c3·E_in + c4·E_out + c5·F/D,  F = 4·N·T²·C
    every kind, last:    + [A > K_A]·c_A·A   (A: the elements the pass allocates, K_A: the kind's page knot)

with F the FLOPs of the pass (backward: the input gradient's where autograd computes one, plus the
weights'), C channels (features), P output pixels per sample, N the batch (a linear layer: the rows),
E elements of the input and output, W weight elements, D an attention head's features (F/D = 4·N·H·T²: its
scores, whose softmax costs the same at any head width). Each F/x term is an efficiency lost as x
shrinks (a vector lane, a blocked tile or a batch loop left part empty); the E and W terms are the
traffic of reading and writing them; c0 the call; K a weight size past which each weight and FLOP cost
more (a convolution's weights outgrowing a cache), one of KNOTS or none, whichever fits the calibration's
shapes best (its wide draws reach past it). ⌈C⌉_L is C rounded up to a multiple of L, the fp32 lanes of the
vector unit whose blocks oneDNN lays channels out in (nChw16c on AVX-512, nChw8c on AVX2): a convolution of 24
channels pays for 32 (at 224² and batch 2 here, 24 → 24 channels ran at 83 GFLOP/s where 16 → 16 ran at 114 and
48 → 48 at 170); L one of LANES or none, whichever fits the calibration's shapes best, as the knot (a first
layer's 3 input channels are read unblocked: its output's alone are rounded). A is what the pass allocates
(forward its output, backward its input's gradient), K_A a size past which each of its elements costs more: a
fresh allocation of 32 MiB or more is mapped anew and every page faults on first touch (glibc's mmap threshold;
PAGE_KNOTS), one of PAGE_KNOTS or none, chosen the same way for the kinds whose calibration draws large maps (none
for the others: a zero regressor). A layer is then the sum of its calls. Kinds:
conv2d, batch_norm2d, relu, max_pool2d (every 2-D pool), linear, add (a residual sum: binary
elementwise, also what a copy of a tensor costs within a factor of 1.5), slab_batch_norm2d (spatial
parallelism's batch norm, its statistics in plain tensor operations: several times a fused one), and
depthwise_conv2d (groups = channels, MobileNet's: F = 2·C·k²·P·N, each filter over one channel; other
grouped convolutions have no kind, and the roofline costs them); and a transformer's layer_norm, gelu,
embedding and attention over T tokens of C features (attention: the causal scaled dot-product attention
with its head split and merge, what a CausalSelfAttention row of a model table holds beside its Linear rows);
and tensor parallelism's tp_colwise_linear and tp_rowwise_linear, a Linear over (batch, tokens, features)
sharded by torch's ColwiseParallel or RowwiseParallel on a mesh of the rank alone, fitted on the linear
regressors over its rows (batch × tokens): their call costs hold DTensor's dispatch, which a tensor-parallel
rank pays on every sharded Linear (ddlbench.analysis.analytic.splits.tensor_parallel_rows). Over volumes
(C, D, H, W: CosmoFlow's), conv3d (F = 2·C_in·C_out·k³·P·N with P = D·H·W, on conv2d's regressors, oneDNN's
3-D kernels fitted apart from its 2-D ones) and max_pool3d, with large volumes drawn for their page knots; a
volume's LeakyReLU or ReLU is a relu over D·H·W pixels. Until they came (2026-12-05) the roofline costed every
volume layer, and cosmoflow's steps were predicted at 0.72-0.76 of the measured (the third scoring set).

Last, each fit carries a local correction (ddlbench.analysis.analytic.operator_residuals): its residuals at the
calibration's shapes, of which those near a call (in e-folds of batch, channels, pixels and kernel) correct the
call's time, where the one law over every shape misses a region of them alike (resnet56's 16-64-channel layers on
3×160², fitted 1.2-1.5× their timings by the law alone). Each fit reports its leave-one-out error over the
calibration's own shapes (what a shape it did not time is predicted to), which a prediction's notes repeat.
Torch-free; numpy only when fitting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ddlbench.analysis.analytic.operator_residuals import LocalCorrection, fit_correction, shape_features
from ddlbench.analysis.machine.fit import nnls
from ddlbench.train.calibration.operator_shapes import (
    CONV_KINDS,
    FIRST_LAYER_CHANNELS,
    LARGE_KINDS,
    LARGE_LEAST,
    OPERATOR_KINDS,
    TENSOR_PARALLEL_KINDS,
    TOKEN_KINDS,
    VOLUME_KINDS,
    OperatorShape,
)

CONV_TYPES = ("Conv2d",)
KIND_OF_TYPE = {
    "Conv2d": "conv2d",
    "BatchNorm2d": "batch_norm2d",
    "SlabBatchNorm2d": "slab_batch_norm2d",  # a BatchNorm2d on a spatial slab (ddlbench.analysis.analytic.layer_splits)
    "ReLU": "relu",
    "ReLU6": "relu",
    # one elementwise pass each way over the same elements as a ReLU's (leaky_relu and its backward against
    # clamp_min and threshold_backward); CosmoFlow's activation
    "LeakyReLU": "relu",
    "MaxPool2d": "max_pool2d",
    "AvgPool2d": "max_pool2d",
    "AdaptiveAvgPool2d": "max_pool2d",
    "AdaptiveMaxPool2d": "max_pool2d",
    "Linear": "linear",
    "Conv3d": "conv3d",  # over volumes (C, D, H, W): pixels D·H·W, kernel elements k³
    "MaxPool3d": "max_pool3d",
    "LayerNorm": "layer_norm",
    "GELU": "gelu",
    "Embedding": "embedding",
    "CausalSelfAttention": "attention",  # its scaled dot-product attention; q, k, v and out are Linear rows
    # a tensor-parallel rank's sharded Linears: not a module's type, the rows the tensor model makes of a
    # block's Linears (ddlbench.analysis.analytic.splits.model_tensor), at the shape the rank holds
    "TpColwiseLinear": "tp_colwise_linear",
    "TpRowwiseLinear": "tp_rowwise_linear",
}
FREE_TYPES = ("Identity", "Flatten", "Dropout", "Dropout2d")  # views or no-ops in training (dropout: none here)
KINDS = OPERATOR_KINDS  # what the calibration times (ddlbench.train.calibration.operator_shapes)
# the kinds fitted on the FLOP and weight regressors
WEIGHTED = ("conv2d", "linear", "depthwise_conv2d", *TENSOR_PARALLEL_KINDS, "conv3d")
LINEAR_KINDS = ("linear", *TENSOR_PARALLEL_KINDS)
# an attention's features per head where its table row does not say (a table written before rows kept them):
# GPT-2's and most models' 64
DEFAULT_HEAD_FEATURES = 64


@dataclass(frozen=True, kw_only=True)
class OpCall:
    """One operator call's shape, per the basis functions' needs (no batch: `batch` is given apart)."""

    kind: str
    in_channels: int
    out_channels: int
    in_pixels: int  # per sample (1 for linear)
    out_pixels: int
    kernel_elements: int = 1  # k² of a convolution
    rows: int = 1  # a linear layer's rows per sample (tokens), 1 for images
    input_grad: bool = True  # whether backward computes the input's gradient (not a model's first layer)
    weight_elements: int = 0  # an embedding's table (its backward writes a gradient as large)
    head_features: int = 0  # an attention's features per head (0: unknown, costed as DEFAULT_HEAD_FEATURES)


# weight sizes (elements: 4, 8, 16, 32 and 64 MiB in fp32) one of which a weighted kind's fit may take as the
# size past which each weight costs more (the weight gradient's GEMM slowing once the weights outgrow a cache:
# here 1.6-1.9× per weight between 768 and 1024 channels at 3×3); fit_kind keeps the one, or none, that fits
# the calibration's shapes best, with at least KNOT_SAMPLES shapes on either side
KNOTS = (2.0**20, 2.0**21, 2.0**22, 2.0**23, 2.0**24)
KNOT_SAMPLES = LARGE_LEAST  # the calibration draws at least as many large maps (operator_shapes.large_count)
# the kinds whose calibration draws weights past the caches: wide convolutions (operator_shapes.WIDE_CONV_SHARE)
# and a classifier's Linears (operator_shapes._draw_wide_linear, timed with the caches emptied: alexnet's 4,096²
# weight at 8 rows took 14.3 ms forward so, 10.3 ms timed over and over; docs/analytic.md)
KNOTTED = ("conv2d", "linear")
# fp32 lanes of a vector register (AVX2: 8, AVX-512: 16), the channel blocks of oneDNN's layouts: one of them, or
# none, is a conv2d fit's `lanes` (the calibration draws channels in multiples of 8, so both kinds of shape occur)
LANES = (8, 16)
LANED = ("conv2d",)
# elements of the tensor a pass allocates (forward: its output; backward: its input's gradient) past which each
# of them costs more: the pages of a fresh allocation of 32 MiB or more (glibc's largest mmap threshold, where
# PyTorch's CPU allocator gets its memory) are mapped anew at every allocation and fault on first touch, 2-3 ns
# an fp32 element here, several times a cached pass over it (a ReLU6's forward 0.3-0.4 ns an element up to 4.8 M
# elements, 2.6-3.2 past 9.6 M); one of PAGE_KNOTS or none, per kind, as the weights' knot; for the kinds whose
# calibration draws large maps (operator_shapes.LARGE_KINDS)
PAGE_KNOTS = (2.0**21, 2.0**22, 2.0**23, 2.0**24)
PAGE_KNOTTED = (*LARGE_KINDS, *VOLUME_KINDS)


def weight_elements(call: OpCall) -> int:
    """A weighted kind's weight elements (a depthwise filter sees one channel)."""
    fan_in = 1 if call.kind == "depthwise_conv2d" else call.in_channels
    return fan_in * call.out_channels * call.kernel_elements


def allocated_elements(call: OpCall, batch: float, direction: str) -> float:
    """The elements of the tensor a pass allocates: forward its output, backward its input's gradient (none
    where it computes none)."""
    n = batch * call.rows
    if direction == "forward":
        return n * call.out_channels * call.out_pixels
    return n * call.in_channels * call.in_pixels if call.input_grad else 0.0


WEIGHTED_TERMS = 13  # a weighted kind's regressors per kernel (_basis: oneDNN's, then torch's own)


def native_path(call: OpCall, batch: float, threads: int) -> bool:
    """Whether torch runs a CPU fp32 conv2d with its own im2col + GEMM kernel (slow_conv2d) rather than
    oneDNN's: PyTorch's ConvParams::use_mkldnn (aten/src/ATen/native/Convolution.cpp) keeps its own for a
    1×1, stride-1 convolution of fewer than 16 samples on one thread ("THNN is faster when single-threaded"),
    and for one sample of at most 20,480 input elements with a kernel of at most 3 a side. Checked under
    torch's profiler with torch 2.13 (a 1×1 at 15 samples and one thread: slow_conv2d; at 16, or on two
    threads, or at stride 2: oneDNN). The two take different times for the same FLOPs: the tenth set's
    calibration timed its 35 such shapes at 0.64-0.69× a fit of all shapes (median), so the fit gives their
    FLOPs terms of their own."""
    if call.kind != "conv2d":
        return False
    n = batch * call.rows
    one_by_one = call.kernel_elements == 1 and call.in_pixels == call.out_pixels
    if one_by_one and n < 16 and threads == 1:
        return True
    return n <= 1 and call.kernel_elements <= 9 and call.in_channels * call.in_pixels <= 20480


def single_row(call: OpCall, batch: float) -> bool:
    """Whether a Linear's call has one row (a batch of one sample without tokens: a pipeline's micro-batch of
    one). torch calls the same addmm and mm as for more rows, but the BLAS runs a one-row product as a
    matrix-vector pass over the weights, at half the time a weight of two rows' product: timed alone on one
    pinned thread here (torch 2.13), forward 0.19-0.22 ns a weight at one row against 0.40-0.47 at two, backward
    0.44-0.51 against 1.19-1.29, at 4,096², 9,216 × 4,096, 9,448 × 3,376 and 25,088 × 4,096 (vgg's first
    classifier Linear). A fit of every row count put that one at one row at 1.7× its forward and 2.3× its
    backward (34 and 107 ms against 20 and 47: the thirteen terms' weight costs are set by the many-row shapes),
    so the one-row calls get the terms of their own that torch's own convolution kernel gets (native_path), where
    the fit had ONE_ROW_LEAST one-row shapes or more to set them (the calibration draws them since 2026-12-08:
    operator_shapes.one_row_linear_count; a machine file timed before has two, and keeps one set of terms)."""
    return call.kind == "linear" and batch * call.rows <= 1


ONE_ROW_LEAST = 8  # one-row Linear shapes a fit needs to give them terms of their own (single_row)


def basis(
    call: OpCall,
    batch: float,
    direction: str,
    knot: float = 0.0,
    page_knot: float = 0.0,
    threads: int = 1,
    lanes: int = 0,
    rows_apart: bool = True,
) -> list[float]:
    """The regressors of the module docstring for one call at `batch` samples (a weighted kind's two before
    the last: its weights and FLOPs where its weights exceed `knot` elements, 0 without a knot; every kind's
    last: the elements it allocates where they exceed `page_knot`, 0 without one). `threads`: the fit's
    threads per rank, which choose a convolution's kernel (native_path); `lanes`: the channel block a weighted
    kind's padding regressor rounds to (0: none, the regressor 0); `rows_apart`: a one-row Linear takes the
    second set of terms (single_row)."""
    allocated = allocated_elements(call, batch, direction)
    own = _basis(call, batch, direction, knot, threads, lanes, rows_apart)
    return [*own, allocated if 0 < page_knot < allocated else 0.0]


def padding_share(call: OpCall, lanes: int) -> float:
    """The share of a convolution's multiply-adds its channel blocks add: ⌈C_in⌉·⌈C_out⌉ / (C_in·C_out) − 1, each
    rounded up to a multiple of `lanes` (a first layer's input, read unblocked, not rounded); 0 without lanes."""
    if lanes <= 0:
        return 0.0

    def blocked(channels: int) -> int:
        return -(-channels // lanes) * lanes

    c_in = blocked(call.in_channels) if call.input_grad else call.in_channels
    return c_in * blocked(call.out_channels) / (call.in_channels * call.out_channels) - 1.0


def _basis(
    call: OpCall, batch: float, direction: str, knot: float, threads: int, lanes: int = 0, rows_apart: bool = True
) -> list[float]:
    n = batch * call.rows
    e_in = n * call.in_channels * call.in_pixels
    e_out = n * call.out_channels * call.out_pixels
    if call.kind in WEIGHTED:
        weights = weight_elements(call)
        flop = 2.0 * weights * call.out_pixels * n
        if direction == "backward":
            flop *= 2.0 if call.input_grad else 1.0
        above = 1.0 if 0 < knot < weights else 0.0
        own = [
            1.0,
            1.0 if n > 1 else 0.0,  # oneDNN takes another path for more than one sample (≈ 60 µs more here)
            flop,
            flop / call.in_channels,
            flop / call.out_channels,
            flop / call.out_pixels,
            flop / max(n, 1e-9),
            e_in,
            e_out,
            float(weights),
            above * weights,
            above * flop,
            flop * padding_share(call, lanes),
        ]
        # torch's own kernel (native_path; conv2d only) and a Linear's one-row product (single_row) are other
        # codes: the same terms, fitted apart (the second WEIGHTED_TERMS regressors; 0 for every other call)
        if native_path(call, batch, threads) or (rows_apart and single_row(call, batch)):
            return [0.0] * WEIGHTED_TERMS + own
        return own + [0.0] * WEIGHTED_TERMS
    if call.kind == "attention":  # tokens T = in_pixels, features C: F = 4·N·T²·C, two T×T products
        flop = 4.0 * n * call.in_pixels**2 * call.in_channels
        # F/D = 4·N·H·T², four per score of H = C/D heads: a score's softmax (its exponential, the running
        # maximum and sum, the causal mask) costs the same whatever a head's width D, so narrow heads pay more
        # per FLOP
        scores = flop / (call.head_features or DEFAULT_HEAD_FEATURES)
        return [1.0, 1.0 if n > 1 else 0.0, flop, flop / call.in_pixels, e_in, e_out, scores]
    if call.kind in TOKEN_KINDS:
        return [1.0, e_in, e_out, n * call.in_channels, float(call.in_channels), float(call.weight_elements)]
    return [1.0, e_in, e_out, n * call.in_channels, float(call.in_channels)]


@dataclass(frozen=True, kw_only=True)
class OpFit:
    """One kind and direction: t = coefficients · basis (seconds), with its leave-one-out error."""

    kind: str
    direction: str
    coefficients: tuple[float, ...]
    scale: tuple[float, ...]  # each regressor was divided by this before fitting
    samples: int
    loo_error_median: float  # |predicted − measured| / measured for shapes left out one at a time
    loo_error_mean: float
    knot: float = 0.0  # weight elements past which the two regressors before the last count (0: none; KNOTS)
    page_knot: float = 0.0  # allocated elements past which the last regressor counts (0: none; PAGE_KNOTS)
    threads: int = 1  # per rank, as the calibration timed it (a convolution's kernel depends on it)
    lanes: int = 0  # the channel block the padding regressor rounds to (0: none; LANES)
    rows_apart: bool = False  # one-row Linears have terms of their own (single_row; ONE_ROW_LEAST shapes or more)
    left_out: int = 0  # shapes left out as far outliers (fit_kind)
    # what the fit missed near each shape, which corrects a call near them (operator_residuals; None: nothing
    # lowered the leave-one-out error)
    correction: LocalCorrection | None = None

    def seconds(self, call: OpCall, batch: float, *, allocates: bool = True) -> float:
        """`allocates=False`: the pass writes into memory already held (a copy into a bucket, an add into
        .grad), so the page term, the faults of a fresh allocation's first touch, is left out."""
        page_knot = self.page_knot if allocates else 0.0
        x = basis(call, batch, self.direction, self.knot, page_knot, self.threads, self.lanes, self.rows_apart)
        seconds = sum(c * v / s for c, v, s in zip(self.coefficients, x, self.scale, strict=True))
        return seconds * self.correction.factor(call, batch) if self.correction is not None else seconds


@dataclass(frozen=True, kw_only=True)
class OperatorModel:
    """Every kind's fits from one calibration entry (a precision, threads, ranks timing at once)."""

    precision: str
    threads: int
    ranks_per_node: int
    fits: Mapping[tuple[str, str], OpFit]
    point_id: str = ""

    def seconds(self, call: OpCall, batch: float, *, allocates: bool = True) -> tuple[float, float] | None:
        forward, backward = self.fits.get((call.kind, "forward")), self.fits.get((call.kind, "backward"))
        if forward is None or backward is None:
            return None
        return forward.seconds(call, batch, allocates=allocates), backward.seconds(call, batch, allocates=allocates)

    def describe(self) -> str:
        """The fits' leave-one-out median errors (a kind's with its local correction where it has one), in words."""

        def error(fit: OpFit) -> float:
            return fit.correction.loo_error_median if fit.correction is not None else fit.loo_error_median

        worst = max(self.fits.values(), key=error)
        corrected = sum(fit.correction is not None for fit in self.fits.values())
        return (
            f"operator fits ({self.ranks_per_node} rank(s) × {self.threads} thread(s) at once, {self.precision}): "
            f"leave-one-out median error {_pct(_median([error(f) for f in self.fits.values()]))}, "
            f"worst {worst.kind} {worst.direction} {_pct(error(worst))}; {corrected} of {len(self.fits)} fits "
            "corrected locally"
        )


def _pct(value: float) -> str:
    return f"{100 * value:.0f} %"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def call_of_sample(sample: Mapping[str, Any]) -> OpCall:
    """The OpCall of one calibration sample (ddlbench.train.calibration.operator_shapes.OperatorShape's fields)."""
    kind = str(sample["kind"])
    h, w, k, stride = (
        int(sample["height"]),
        int(sample["width"]),
        int(sample.get("kernel") or 1),
        int(sample.get("stride") or 1),
    )
    c_in = int(sample["in_channels"])
    # an image's or a volume's shape, its output sides as the kernel computes them (a record made before volumes
    # has no depth: 1)
    shape = OperatorShape(
        kind=kind,
        batch=1,
        in_channels=c_in,
        height=h,
        width=w,
        depth=int(sample.get("depth") or 1),
        kernel=k,
        stride=stride,
    )
    if kind in CONV_KINDS:
        return OpCall(
            kind=kind,
            in_channels=c_in,
            out_channels=int(sample.get("out_channels") or c_in),
            in_pixels=shape.in_pixels,
            out_pixels=shape.out_pixels,
            kernel_elements=k ** (3 if kind in VOLUME_KINDS else 2),
            input_grad=c_in != FIRST_LAYER_CHANNELS.get(kind),  # the kernel's first-layer inputs
        )
    if kind in LINEAR_KINDS:  # height: tokens, the rows per sample (1: a head's)
        return OpCall(
            kind=kind, in_channels=c_in, out_channels=int(sample["out_channels"]), in_pixels=1, out_pixels=1, rows=h
        )
    if kind in TOKEN_KINDS:  # height: tokens; out_channels: an embedding's rows (or attention's heads)
        rows = int(sample.get("out_channels") or 0)  # an embedding's table rows, or attention's heads
        return OpCall(
            kind=kind,
            in_channels=c_in,
            out_channels=c_in,
            in_pixels=h,
            out_pixels=h,
            weight_elements=rows * c_in if kind == "embedding" else 0,
            head_features=c_in // rows if kind == "attention" and rows else 0,
        )
    pixels = {"in_pixels": shape.in_pixels, "out_pixels": shape.out_pixels}  # a pool halves every side
    return OpCall(kind=kind, in_channels=c_in, out_channels=c_in, **pixels)


REWEIGHTINGS = 4  # iterations of 1/√(t·t̂) weights after the first fit (converged by then on these timings)
# each shape weighs in the fit as its time to this power (relative to the median shape's): 1, as its seconds
TIME_WEIGHT = 1.0


def time_weights(y):
    """Each shape's weight in the fit: (t / median t)^TIME_WEIGHT. A model's step is the sum of its layers'
    times, so its relative error is the time-weighted mean of its layers' relative errors; a fit weighing every
    shape alike is set by the many small ones the draws hold (three in four conv2d draws take under 5 M
    multiply-adds), where a call's fixed costs dominate, and its per-FLOP terms then missed the large shapes
    (a 32 → 32 3×3 convolution on 34² maps at batch 34: 13.7 ps a multiply-add forward measured, 26.2 fitted;
    resnet56's backward at batch 22 predicted 252 ms against 136 measured, on the eighth scoring set's second
    run). Weighed by their time, the large shapes set the per-FLOP terms and the small ones the call's."""
    import numpy as np

    return (y / float(np.median(y))) ** TIME_WEIGHT


def solve(x, y):
    """Non-negative coefficients c of t ≈ x·c (see the module docstring) minimising Σ u·log²(t / t̂) with u
    the shapes' time_weights: relative residuals first, then REWEIGHTINGS passes weighting each shape by
    √u / √(t·t̂) (the log ratio, to first order), then c scaled so that the u-weighted geometric mean of
    t / (x·c) over the shapes is 1."""
    import numpy as np

    u = time_weights(y)
    root = np.sqrt(u)
    coefficients = nnls(x / y[:, None] * root[:, None], root)  # relative residuals, each shape by its weight
    for _ in range(REWEIGHTINGS):
        fitted = np.maximum(x @ coefficients, 1e-3 * y)
        weight = root / np.sqrt(y * fitted)
        coefficients = nnls(x * weight[:, None], y * weight)
    fitted = np.maximum(x @ coefficients, 1e-12)
    return coefficients * float(np.exp(np.sum(u * np.log(y / fitted)) / np.sum(u)))


def fit_kind(
    kind: str,
    direction: str,
    samples: Sequence[Mapping[str, Any]],
    *,
    offset_s: float = 0.0,
    floor_s: float = 1e-6,
    threads: int = 1,
    local: bool = True,
) -> OpFit | None:
    """The NNLS fit of one kind and direction over the samples of that kind (None with fewer than 4).
    `offset_s` is taken off every time first (the autograd engine's cost per backward() call), leaving
    at least `floor_s` (what one autograd node costs: a backward is never free).

    A shape the fit of all the others misses by far (its leave-one-out log error more than OUTLIER_SPREADS
    robust spreads from their median: 1.4826 × the median absolute deviation) is left out and the fit made
    again, the farthest first, at most OUTLIER_SHARE of the shapes: a time weighs in the fit as its length, so
    one glitch of a long shape sets every per-FLOP term (the twentieth set's calibration timed a 16 → 96 1×1
    convolution on 192² at batch 9 at 237 ms, 20.6 ms in the calibration before, and every conv2d forward it
    predicted came out 5-20 % long). The fit counts what it left out (`left_out`)."""

    rows = [s for s in samples if s["kind"] == kind and s.get(f"{direction}_s") is not None]
    if len(rows) < 4:
        return None
    fit, far = _fit_rows(kind, direction, rows, offset_s=offset_s, floor_s=floor_s, threads=threads, local=local)
    left_out = 0
    while far is not None and left_out < int(OUTLIER_SHARE * len(rows)):
        rows = rows[:far] + rows[far + 1 :]
        left_out += 1
        fit, far = _fit_rows(kind, direction, rows, offset_s=offset_s, floor_s=floor_s, threads=threads, local=local)
    return fit if not left_out else replace(fit, left_out=left_out)


# a shape whose leave-one-out log error lies past this many robust spreads of all shapes' is left out (fit_kind),
# at most this share of a kind's shapes
OUTLIER_SPREADS = 6.0
OUTLIER_SHARE = 0.02


def _fit_rows(
    kind: str,
    direction: str,
    rows: list[Mapping[str, Any]],
    *,
    offset_s: float,
    floor_s: float,
    threads: int,
    local: bool = True,
) -> tuple[OpFit, int | None]:
    """fit_kind's fit over `rows`, and the index of the row its leave-one-out errors put farthest past
    OUTLIER_SPREADS robust spreads (None: none is)."""
    import numpy as np

    y = np.array([max(float(s[f"{direction}_s"]) - offset_s, floor_s) for s in rows])

    calls, batches = [call_of_sample(s) for s in rows], [float(s["batch"]) for s in rows]
    rows_apart = sum(single_row(c, b) for c, b in zip(calls, batches, strict=True)) >= ONE_ROW_LEAST

    def design(knot: float, page_knot: float, lanes: int = 0):
        x = np.array(
            [
                basis(c, b, direction, knot, page_knot, threads, lanes, rows_apart)
                for c, b in zip(calls, batches, strict=True)
            ],
            dtype=float,
        )
        scale = x.max(axis=0)
        scale[scale <= 0] = 1.0
        return x / scale, scale

    u = time_weights(y)

    def misfit(x) -> float:
        return float(np.sum(u * np.log(y / np.maximum(x @ solve(x, y), 1e-12)) ** 2))

    def best_of(above_of, candidates, trial_design, current):
        """The knot (or lanes) among `candidates` (or none: 0) whose fit leaves the least weighted squared log
        error over the shapes, with at least KNOT_SAMPLES shapes on either side of it (`above_of(candidate)`
        counts those past it); and its design."""
        best, chosen, chosen_design = misfit(current[0]), 0.0, current
        for candidate in candidates:
            above = above_of(candidate)
            if above < KNOT_SAMPLES or len(y) - above < KNOT_SAMPLES:
                continue
            trial = trial_design(candidate)
            if (error := misfit(trial[0])) < best:
                best, chosen, chosen_design = error, candidate, trial
        return chosen, chosen_design

    knot = page_knot = 0.0
    lanes = 0
    x, scale = design(0.0, 0.0)
    if kind in KNOTTED:  # the weights' knot first, then (with it) the lanes, then the allocation's knot
        weights = np.array([weight_elements(c) for c in calls])
        knot, (x, scale) = best_of(lambda k: int(np.sum(weights > k)), KNOTS, lambda k: design(k, 0.0), (x, scale))
    if kind in LANED:  # "past" the lanes: the shapes they pad

        def padded(candidate: int) -> int:
            return sum(padding_share(c, candidate) > 0 for c in calls)

        chosen, (x, scale) = best_of(padded, LANES, lambda lanes: design(knot, 0.0, lanes), (x, scale))
        lanes = int(chosen)
    if kind in PAGE_KNOTTED:
        allocated = np.array([allocated_elements(c, b, direction) for c, b in zip(calls, batches, strict=True)])
        page_knot, (x, scale) = best_of(
            lambda k: int(np.sum(allocated > k)), PAGE_KNOTS, lambda k: design(knot, k, lanes), (x, scale)
        )
    errors, logs = [], []
    for index in range(len(y)):
        keep = np.arange(len(y)) != index
        coefficients = solve(x[keep], y[keep])
        predicted = max(float(x[index] @ coefficients), 1e-12)
        errors.append(abs(predicted - y[index]) / y[index])
        logs.append(math.log(predicted / y[index]))
    distance = np.abs(np.array(logs) - np.median(logs))
    spread = 1.4826 * float(np.median(distance))
    farthest = int(np.argmax(distance))
    far = farthest if spread > 0 and distance[farthest] > OUTLIER_SPREADS * spread else None
    coefficients = solve(x, y)
    correction = None
    if local:
        residuals = np.log(y / np.maximum(x @ coefficients, 1e-12))
        features = [shape_features(c, b) for c, b in zip(calls, batches, strict=True)]
        correction = fit_correction(features, residuals, -np.array(logs))
    fit = OpFit(
        kind=kind,
        direction=direction,
        coefficients=tuple(float(c) for c in coefficients),
        scale=tuple(float(s) for s in scale),
        samples=len(y),
        loo_error_median=float(np.median(errors)),
        loo_error_mean=float(np.mean(errors)),
        knot=knot,
        page_knot=page_knot,
        threads=threads,
        lanes=lanes,
        rows_apart=rows_apart,
        correction=correction,
    )
    return fit, far


def fit_operator_model(entry: Mapping[str, Any], *, local: bool = True) -> OperatorModel:
    """Every kind's forward and backward fit from one `operator_timings` entry of a machine file (`local`: with
    each fit's local correction, operator_residuals)."""
    samples = entry.get("samples") or []
    engine = entry.get("autograd_call_s") or {}
    offset = float(engine.get("value") or 0.0)
    one, five = (float((engine.get(key) or {}).get("value") or 0.0) for key in ("chain1_s", "chain5_s"))
    # one autograd node's cost, the floor of a backward's own time: from the chains, at least a twentieth of the
    # one-node chain's call (0.5-1.5 µs here; a share of a measured time, so it moves with the host's speed)
    node = max((five - one) / 4, one / 20, 1e-12)
    fits = {}
    threads = int(entry.get("threads", 1))
    for kind in KINDS:
        for direction in ("forward", "backward"):
            backward = direction == "backward"
            fit = fit_kind(
                kind,
                direction,
                samples,
                offset_s=offset if backward else 0.0,
                floor_s=node,
                threads=threads,
                local=local,
            )
            if fit is not None:
                fits[(kind, direction)] = fit
    return OperatorModel(
        precision=str(entry.get("precision", "fp32")),
        threads=threads,
        ranks_per_node=int(entry.get("ranks_per_node", 1)),
        fits=fits,
        point_id=str(entry.get("point_id", "")),
    )


def layer_call(
    layer_type: str,
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    weight_shape: Sequence[int],
    *,
    input_grad: bool = True,
    head_features: int = 0,
) -> OpCall | None:
    """The OpCall of a model-table layer (one sample's shapes), or None for a type without a kind;
    `head_features`: an attention's features per head (the table row's)."""
    kind = KIND_OF_TYPE.get(layer_type)
    if kind is None:
        return None
    if kind in LINEAR_KINDS:
        rows = math.prod(input_shape[:-1]) if len(input_shape) > 1 else 1
        return OpCall(
            kind=kind,
            in_channels=int(input_shape[-1]),
            out_channels=int(output_shape[-1]),
            in_pixels=1,
            out_pixels=1,
            rows=rows,
            input_grad=input_grad,
        )
    if kind in TOKEN_KINDS:  # (tokens, features) per sample; an embedding's input is its token ids
        features = int(output_shape[-1]) if kind == "embedding" else int(input_shape[-1])
        tokens = math.prod(output_shape[:-1]) if len(output_shape) > 1 else 1
        return OpCall(
            kind=kind,
            in_channels=features,
            out_channels=features,
            in_pixels=int(tokens),
            out_pixels=int(tokens),
            weight_elements=math.prod(weight_shape) if kind == "embedding" else 0,
            head_features=head_features if kind == "attention" else 0,
        )
    # a volume's layer, (C, D, H, W); or an activation on a head's features, (C,)
    if kind in VOLUME_KINDS or (kind == "relu" and len(input_shape) in (1, 4)):
        if len(input_shape) != len(output_shape) or (kind in VOLUME_KINDS and len(input_shape) != 4):
            return None
        extra = {}
        if kind == "conv3d":
            if len(weight_shape) != 5 or weight_shape[1] != input_shape[0]:
                return None  # a grouped 3-D convolution: none of the calibration's
            extra = {"kernel_elements": int(math.prod(weight_shape[2:])), "input_grad": input_grad}
        return OpCall(
            kind=kind,
            in_channels=int(input_shape[0]),
            out_channels=int(output_shape[0]),
            in_pixels=int(math.prod(input_shape[1:])),
            out_pixels=int(math.prod(output_shape[1:])),
            **extra,
        )
    if len(input_shape) != 3 or len(output_shape) != 3:
        return None  # not a 2-D image layer (a sequence, a volume of a kind with none): the roofline costs it
    extra: dict = {}
    if kind == "conv2d":
        groups = input_shape[0] // weight_shape[1] if len(weight_shape) == 4 and weight_shape[1] else 1
        if groups > 1 and groups == input_shape[0] == output_shape[0]:
            kind = "depthwise_conv2d"  # one filter per channel (MobileNet's)
        elif groups != 1:
            return None  # grouped otherwise (a channel multiplier, ResNeXt's groups): none of the calibration's
        k = weight_shape[2] * weight_shape[3] if len(weight_shape) == 4 else 1
        extra = {"kernel_elements": int(k), "input_grad": input_grad}
    return OpCall(
        kind=kind,
        in_channels=int(input_shape[0]),
        out_channels=int(output_shape[0]),
        in_pixels=int(input_shape[1] * input_shape[2]),
        out_pixels=int(output_shape[1] * output_shape[2]),
        **extra,
    )


def elementwise_call(elements_per_sample: int, *, channels: int = 1) -> OpCall:
    """A binary elementwise pass (an add, or a copy: a cat, a clone, a zero fill) over a tensor."""
    pixels = max(1, elements_per_sample // max(1, channels))
    return OpCall(kind="add", in_channels=channels, out_channels=channels, in_pixels=pixels, out_pixels=pixels)
