"""The generic operator shapes an `operators` calibration point times, and the features a fit reads of them.

A model's step is made of a few kinds of operator (convolutions, norms, activations, pools, matrix
products) whose time on a CPU is not FLOPs ÷ one rate: a 16-channel convolution runs at a third of the
speed of a 256-channel one, a micro-batch of 4 pays every layer's fixed cost four times per sample, a
slab of half the rows has the same per-call overhead as the whole. So the calibration times each kind
of operator over a spread of shapes drawn at random (log-uniform in channels, rows, columns and batch,
from a fixed seed), and ddlbench.analysis.analytic.operators fits its time as a function of the shape. The
shapes are generic: they are drawn, not taken from any model, so a model the calibration never saw is
predicted from operators of other shapes (Zhang et al.'s per-operator regression in spirit; Justus et
al., "Predicting the computational cost of deep learning models", BigData 2018, regress per layer too).

Torch-free: the suite expands on a login node, and the fit reads the records there too.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

# operator kinds timed (the layer types each stands for: ddlbench.analysis.analytic.operators.KIND_OF_TYPE)
# slab_batch_norm2d: spatial parallelism's batch norm on a slab (ddlbench.train.strategies.halo.SlabBatchNorm:
# its statistics in plain tensor operations, shared over the group), timed over a group of one rank
# depthwise_conv2d: a convolution of groups = channels (MobileNet's); then a transformer's own layers over
# (batch, tokens, features): layer_norm, gelu, embedding (a lookup in a table of `out_channels` rows) and
# attention (causal scaled dot-product attention over `out_channels` heads, with the head split and merge
# around it, as ddlbench.train.models.gpt.CausalSelfAttention runs it); and tensor parallelism's Linears over
# (batch, tokens, features), column-wise and row-wise (torch's ColwiseParallel and RowwiseParallel, as
# ddlbench.train.strategies.tensor shards a block), on a mesh of the rank alone: DTensor's dispatch on every
# call with no peer to wait for. Each is drawn after the kinds that came before it, so that their draws from
# the seeded generator are what they were before it came. The volume kinds (VOLUME_KINDS) come after them, then
# linear shapes over a transformer's tokens (_draw_token_linear), classifier Linears, and full-resolution maps of
# few channels (_draw_broad_map), last of all.
OPERATOR_KINDS = (
    "conv2d",
    "batch_norm2d",
    "relu",
    "max_pool2d",
    "linear",
    "add",
    "slab_batch_norm2d",
    "depthwise_conv2d",
    "layer_norm",
    "gelu",
    "embedding",
    "attention",
    "tp_colwise_linear",
    "tp_rowwise_linear",
    "conv3d",
    "max_pool3d",
)
# a 3-D model's layers over (batch, channels, depth, height, width): a 3-D convolution and a 2×2×2 max pool
# (CosmoFlow's); drawn after every other kind and the wide and large draws (sample_shapes), so those draws are what
# they were before these came
VOLUME_KINDS = ("conv3d", "max_pool3d")
# the input channels a drawn convolution takes to stand for a model's first layer, whose backward computes no
# input gradient: an RGB image's 3, CosmoFlow's 4 redshift channels
FIRST_LAYER_CHANNELS = {"conv2d": 3, "conv3d": 4}
TOKEN_KINDS = ("layer_norm", "gelu", "embedding", "attention")  # (batch, tokens = height, features = in_channels)
# (batch, tokens = height, in_channels → out_channels features), a DTensor Linear on a one-rank mesh
TENSOR_PARALLEL_KINDS = ("tp_colwise_linear", "tp_rowwise_linear")


CONV_KINDS = ("conv2d", "depthwise_conv2d", "conv3d")
POOL_KINDS = ("max_pool2d", "max_pool3d")


@dataclass(frozen=True, kw_only=True)
class OperatorShape:
    """One operator call: `batch` samples of `in_channels` × height × width in (× depth for VOLUME_KINDS, 1
    otherwise); for conv2d `out_channels` filters of kernel × kernel (conv3d: kernel³) at `stride` with
    'same'-style padding kernel // 2 (depthwise_conv2d: one filter per channel, groups = in_channels =
    out_channels); for linear, in_channels → out_channels features over `height` rows per sample (1: an
    image model's head, a (batch, features) input; more: a transformer's tokens, (batch, tokens, features)),
    width 1; elementwise kinds keep the shape; pools halve every side."""

    kind: str
    batch: int
    in_channels: int
    height: int
    width: int
    out_channels: int = 0
    kernel: int = 1
    stride: int = 1
    depth: int = 1

    def _out(self, side: int) -> int:
        if self.kind in CONV_KINDS:
            return (side + 2 * (self.kernel // 2) - self.kernel) // self.stride + 1
        if self.kind in POOL_KINDS:
            return side // 2
        return side

    @property
    def out_height(self) -> int:
        return self._out(self.height)

    @property
    def out_width(self) -> int:
        return self._out(self.width)

    @property
    def out_depth(self) -> int:
        return self._out(self.depth) if self.kind in VOLUME_KINDS else 1

    @property
    def in_pixels(self) -> int:
        return self.depth * self.height * self.width

    @property
    def out_pixels(self) -> int:
        return self.out_depth * self.out_height * self.out_width

    @property
    def linear_weights(self) -> int:
        """A linear shape's weight elements (in × out features); 0 for every other kind."""
        return self.in_channels * self.out_channels if self.kind == "linear" else 0

    @property
    def forward_flop(self) -> int:
        """FlopCounterMode's count: 2 per multiply-add of a convolution or matrix product, 0 otherwise."""
        if self.kind == "conv2d":
            per = 2 * self.in_channels * self.out_channels * self.kernel**2
            return per * self.out_height * self.out_width * self.batch
        if self.kind == "conv3d":
            return 2 * self.in_channels * self.out_channels * self.kernel**3 * self.out_pixels * self.batch
        if self.kind == "depthwise_conv2d":
            return 2 * self.in_channels * self.kernel**2 * self.out_height * self.out_width * self.batch
        if self.kind == "linear" or self.kind in TENSOR_PARALLEL_KINDS:  # over `height` tokens (1: a head's)
            return 2 * self.in_channels * self.out_channels * self.batch * self.height
        if self.kind == "attention":  # two T×T products (the scores, then the weighted sum), as FlopCounterMode
            return 4 * self.height**2 * self.in_channels * self.batch
        return 0

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _channels(rng: random.Random, low: int, high: int) -> int:
    return (
        max(1, round(_log_uniform(rng, low, high) / 8) * 8) if high > 8 else max(1, round(_log_uniform(rng, low, high)))
    )


def sample_shapes(*, seed: int, per_kind: int, max_flop: float, max_elements: int) -> list[OperatorShape]:
    """`per_kind` shapes of each operator kind (more for convolutions, whose speed varies most), drawn
    log-uniformly: channels 8–512 (conv2d: 8–1024, output channels the input's, half or twice, or 3 input
    channels, as a first layer has), input side 2–64 rows and columns (conv2d: 1–8 one time in four;
    rows sometimes fewer than columns: a spatial slab), batch 1–64 (depthwise_conv2d: channels 8–1024, 3×3
    or 5×5; the token kinds: features 16–1024 over 8–512 tokens; the tensor-parallel Linears: 16–1024
    features in, 16–4096 out, over 8–512 tokens); a conv2d or
    linear above `max_flop` forward FLOPs, or any tensor above `max_elements`, is drawn again. Then
    WIDE_CONV_SHARE × `per_kind` wide conv2d shapes (_draw_wide_conv), up to WIDE_CONV_FLOP × `max_flop`; then
    large_count(`per_kind`) shapes of each of LARGE_KINDS on large maps (_draw_large), their largest tensor
    above `max_elements` and at most LARGE_ELEMENTS × `max_elements` (a conv2d up to WIDE_CONV_FLOP ×
    `max_flop`); then the VOLUME_KINDS, within the bounds and then on large volumes (_draw_volume); last
    TOKEN_LINEAR_SHARE × `per_kind` linear shapes over tokens (_draw_token_linear), up to WIDE_CONV_FLOP ×
    `max_flop`; then wide_linear_count(`per_kind`) classifier Linears whose weights are past the caches
    (_draw_wide_linear); then broad_map_count(`per_kind`) layers at full resolution on few channels
    (_draw_broad_map), within the bounds; last one_row_linear_count(`per_kind`) Linears on one row
    (_draw_one_row_linear)."""
    rng = random.Random(seed)
    shapes: list[OperatorShape] = []
    for kind in OPERATOR_KINDS:
        if kind in VOLUME_KINDS:
            continue  # drawn last, below
        count = 3 * per_kind if kind == "conv2d" else per_kind
        drawn = 0
        while drawn < count:
            shape = _draw(rng, kind)
            if _within(shape, max_flop, max_elements):
                shapes.append(shape)
                drawn += 1
    # then wide convolutions on small maps, as a deep stage holds them (WIDE_CONV_SHARE of per_kind more
    # conv2d shapes): their weights, not their pixels, set their time, and past a size the weight gradient's
    # GEMM slows per weight (here 1.6-1.9× between 768 and 1024 channels at 3×3), which shapes drawn over
    # 8-1024 channels rarely reach. Drawn after every kind, so the draws before them are what they were.
    drawn = 0
    while drawn < max(1, round(WIDE_CONV_SHARE * per_kind)):
        shape = _draw_wide_conv(rng)
        if _within(shape, WIDE_CONV_FLOP * max_flop, max_elements):
            shapes.append(shape)
            drawn += 1
    # then the early layers of a model on large images (an ImageNet-sized input: 56-224 a side), whose tensors
    # pass 32 MiB: each fresh allocation that large is mapped anew and faults on every page at first touch,
    # several times a pass over a cached one, which no shape within `max_elements` reaches (mobilenet_v2 on 224²
    # at batch 26: 10-31 M elements a tensor, its step 1.8× its prediction, docs/analytic.md).
    # Drawn last, so the draws before them are what they were.
    for kind in LARGE_KINDS:
        drawn = 0
        while drawn < large_count(per_kind):
            shape = _draw_large(rng, kind)
            if largest_elements(shape) > max_elements and _within(
                shape, WIDE_CONV_FLOP * max_flop, LARGE_ELEMENTS * max_elements
            ):
                shapes.append(shape)
                drawn += 1
    # then a 3-D model's layers (VOLUME_KINDS): volumes within the bounds (conv3d twice per_kind, as its speed
    # varies most), then large_count(per_kind) of each on large volumes (an input of 64-128 a side, CosmoFlow's
    # first layers), past `max_elements` as the large maps are
    for kind in VOLUME_KINDS:
        drawn = 0
        while drawn < (2 * per_kind if kind == "conv3d" else per_kind):
            shape = _draw_volume(rng, kind)
            if _within(shape, max_flop, max_elements):
                shapes.append(shape)
                drawn += 1
    for kind in VOLUME_KINDS:
        drawn = 0
        while drawn < large_count(per_kind):
            shape = _draw_volume(rng, kind, large=True)
            if largest_elements(shape) > max_elements and _within(
                shape, WIDE_CONV_FLOP * max_flop, LARGE_ELEMENTS * max_elements
            ):
                shapes.append(shape)
                drawn += 1
    # last, TOKEN_LINEAR_SHARE × `per_kind` more linear shapes over a transformer's tokens (_draw_token_linear):
    # a transformer calls its Linears on batch × tokens rows (1,024 on the twenty-ninth and thirtieth sets), the
    # linear draws above hold 1-256, and a fit of those extrapolated a forward of 214-292 GFLOP/s where the fastest
    # shape timed 155 (docs/analytic.md, "What the twenty-ninth and thirtieth sets show")
    drawn = 0
    while drawn < token_linear_count(per_kind):
        shape = _draw_token_linear(rng)
        if _within(shape, WIDE_CONV_FLOP * max_flop, max_elements):
            shapes.append(shape)
            drawn += 1
    # then wide_linear_count(`per_kind`) classifier Linears (_draw_wide_linear): weights past the caches
    # (WIDE_LINEAR_LEAST_WEIGHTS up to LARGE_ELEMENTS × `max_elements` elements) on the few rows of a classifier's
    # batch, which every linear draw above lacks: alexnet's 4,096² Linear at batch 8 ran its forward in 18 ms
    # here, its fit from those draws said 13 (docs/analytic.md, "A classifier's Linear past the caches")
    drawn = 0
    while drawn < wide_linear_count(per_kind):
        shape = _draw_wide_linear(rng)
        if WIDE_LINEAR_LEAST_WEIGHTS <= shape.linear_weights <= LARGE_ELEMENTS * max_elements and _within(
            shape, WIDE_CONV_FLOP * max_flop, max_elements
        ):
            shapes.append(shape)
            drawn += 1
    # after those, broad_map_count(`per_kind`) layers at full resolution on few channels (_draw_broad_map): the
    # sides of the large maps (56-224) within `max_elements`, where a CIFAR ResNet's first stage runs on a larger
    # image (16 channels on 160² at batch 2: 0.8 M elements), which no draw above has (the draws within the bounds
    # stop at 64 a side, the large maps start past `max_elements`): the forty-third set's resnet56 on 3×160² was
    # predicted 1.19-1.24× its measured step on every strategy (docs/analytic.md, "Full-resolution maps")
    for kind in BROAD_MAP_KINDS:
        drawn = 0
        while drawn < broad_map_count(per_kind) // len(BROAD_MAP_KINDS):
            shape = _draw_broad_map(rng, kind)
            if _within(shape, max_flop, max_elements):
                shapes.append(shape)
                drawn += 1
    # last, one_row_linear_count(`per_kind`) Linears on one row (_draw_one_row_linear), a pipeline's micro-batch of
    # one sample: the BLAS runs them as matrix-vector passes at half the time a weight of two rows, and the fit
    # gives them terms of their own (ddlbench.analysis.analytic.operators.single_row), which the two one-row
    # shapes the draws above held could not set (vgg's 25,088 → 4,096 Linear at one row fitted 2.3× its
    # backward). Their weights reach ONE_ROW_WEIGHTS × `max_elements`, past vgg's; drawn last, so the draws
    # before them are what they were.
    drawn = 0
    while drawn < one_row_linear_count(per_kind):
        shape = _draw_one_row_linear(rng, wide=drawn % 2 == 0)
        if shape.linear_weights <= ONE_ROW_WEIGHTS * max_elements and _within(
            shape, WIDE_CONV_FLOP * max_flop, max_elements
        ):
            shapes.append(shape)
            drawn += 1
    return shapes


# a one-row Linear's weights: at most this many times max_elements (134 M at the default), past vgg's 25,088 → 4,096
# (103 M; the wide Linears stop at LARGE_ELEMENTS times, 34 M)
ONE_ROW_WEIGHTS = 16


def one_row_linear_count(per_kind: int) -> int:
    """How many one-row Linears sample_shapes draws last: as many as the wide Linears (wide_linear_count; none
    for a quick calibration's few shapes), half of them a classifier's wide Linear."""
    return wide_linear_count(per_kind)


def _draw_one_row_linear(rng: random.Random, *, wide: bool) -> OperatorShape:
    """A Linear on one row: `wide`, a classifier's (_draw_wide_linear's features: 1,024-25,088 in, 1,000-4,096
    out), else a narrow one, 64-4,096 in and 8-1,000 out (a ResNet's or a CIFAR model's head)."""
    low_in, high_in, low_out, high_out = (1024, 25088, 1000, 4096) if wide else (64, 4096, 8, 1000)
    return OperatorShape(
        kind="linear",
        batch=1,
        in_channels=_channels(rng, low_in, high_in),
        out_channels=_channels(rng, low_out, high_out),
        height=1,
        width=1,
    )


def broad_map_count(per_kind: int) -> int:
    """How many full-resolution shapes of few channels sample_shapes draws last of all: large_count(`per_kind`)
    of each of BROAD_MAP_KINDS (none for a quick calibration's few shapes). A fit's local correction
    (ddlbench.analysis.analytic.operator_residuals) needs shapes near a model's layers to correct them."""
    return len(BROAD_MAP_KINDS) * large_count(per_kind)


def _draw_broad_map(rng: random.Random, kind: str) -> OperatorShape:
    """A layer at full resolution on few channels: side 56-224 (rows fewer one time in three: a spatial slab),
    channels 8-64, batch 1-8 (conv2d: output channels the input's, half or twice, one in ten a first layer of
    FIRST_LAYER_CHANNELS; 3×3, one in four 1×1; stride 2 one in five, as a stage's first convolution;
    depthwise_conv2d: 3×3, stride 2 one in five)."""
    width = max(2, round(_log_uniform(rng, 56, 224)))
    height = max(2, round(width * _log_uniform(rng, 0.25, 1.0))) if rng.random() < 1 / 3 else width
    batch = max(1, round(_log_uniform(rng, 1, 8)))
    channels = _channels(rng, 8, 64)
    if kind == "conv2d":
        first = rng.random() < 0.1
        out = max(8, int(channels * rng.choice((0.5, 1, 1, 2))))
        return OperatorShape(
            kind=kind,
            batch=batch,
            in_channels=FIRST_LAYER_CHANNELS["conv2d"] if first else channels,
            height=height,
            width=width,
            out_channels=out,
            kernel=1 if rng.random() < 0.25 else 3,
            stride=2 if rng.random() < 0.2 else 1,
        )
    if kind == "depthwise_conv2d":
        return OperatorShape(
            kind=kind,
            batch=batch,
            in_channels=channels,
            height=height,
            width=width,
            out_channels=channels,
            kernel=3,
            stride=2 if rng.random() < 0.2 else 1,
        )
    if kind == "max_pool2d":
        height, width = max(2, height - height % 2), max(2, width - width % 2)
    return OperatorShape(kind=kind, batch=batch, in_channels=channels, height=height, width=width)


# a classifier Linear's least weights (elements, 16 MiB in fp32): the size from which the calibration times a
# Linear with the caches emptied (operator_kernel.COLD_LINEAR_WEIGHTS)
WIDE_LINEAR_LEAST_WEIGHTS = 1 << 22


def wide_linear_count(per_kind: int) -> int:
    """How many classifier Linears sample_shapes draws last: twice large_count(`per_kind`) (none for a quick
    calibration's few shapes), so a linear fit's knot (ddlbench.analysis.analytic.operators.KNOTS) has shapes
    past it at small and large batches."""
    return 2 * large_count(per_kind)


def _draw_wide_linear(rng: random.Random) -> OperatorShape:
    """A classifier's Linear: 1,024-25,088 features in (vgg's 512×7², alexnet's 256×6²), 1,000-4,096 out, on
    the rows of a batch, 1-64 (past 16 rows its products outweigh its weights' traffic)."""
    return OperatorShape(
        kind="linear",
        batch=max(1, round(_log_uniform(rng, 1, 64))),
        in_channels=_channels(rng, 1024, 25088),
        out_channels=_channels(rng, 1000, 4096),
        height=1,
        width=1,
    )


TOKEN_LINEAR_SHARE = 1.0  # linear shapes over tokens, times per_kind


def token_linear_count(per_kind: int) -> int:
    """How many linear shapes over tokens sample_shapes draws last: TOKEN_LINEAR_SHARE × `per_kind`."""
    return round(TOKEN_LINEAR_SHARE * per_kind)


def _draw_token_linear(rng: random.Random) -> OperatorShape:
    """A transformer's Linear over (batch, tokens, features): features 64-5120 in and out, each drawn apart (a
    block's projections keep the width, its MLP widens 4× and narrows back: GPT-2 large's 1,280 → 5,120), tokens
    64-1024, batch 1-16."""
    return OperatorShape(
        kind="linear",
        batch=max(1, round(_log_uniform(rng, 1, 16))),
        in_channels=_channels(rng, 64, 5120),
        out_channels=_channels(rng, 64, 5120),
        height=max(64, round(_log_uniform(rng, 64, 1024))),
        width=1,
    )


def _draw_volume(rng: random.Random, kind: str, *, large: bool = False) -> OperatorShape:
    """A 3-D layer: channels 8-512 (conv3d: output channels the input's, half or twice; one in ten a first layer
    of FIRST_LAYER_CHANNELS; 3×3×3, one in five 1×1×1; stride 2 one in five), a cube of side 2-32 (a slab of
    fewer depth rows one time in three: spatial parallelism splits the depth), batch 1-16. `large`: side 48-128,
    channels 8-64 (conv3d: a first layer's one time in four), batch 1-4, 3×3×3 at stride 1 (CosmoFlow's first
    layers: 4 → 32 on 128³, 32 → 64 on 64³)."""
    if large:
        side = max(2, round(_log_uniform(rng, 48, 128)))
        batch = max(1, round(_log_uniform(rng, 1, 4)))
        channels = _channels(rng, 8, 64)
        if kind == "conv3d" and rng.random() < 0.25:
            channels = FIRST_LAYER_CHANNELS["conv3d"]
        depth = side
    else:
        side = max(2, round(_log_uniform(rng, 2, 32)))
        batch = max(1, round(_log_uniform(rng, 1, 16)))
        channels = _channels(rng, 8, 512)
        depth = max(1, round(side * _log_uniform(rng, 0.25, 1.0))) if rng.random() < 1 / 3 else side
    if kind == "max_pool3d":
        side, depth = max(2, side - side % 2), max(2, depth - depth % 2)
        return OperatorShape(kind=kind, batch=batch, in_channels=channels, height=side, width=side, depth=depth)
    first = not large and rng.random() < 0.1
    out = max(8, min(1024, int(max(channels, 8) * rng.choice((0.5, 1, 1, 2)))))
    kernel = 3 if large or rng.random() < 0.8 else 1
    stride = 2 if not large and rng.random() < 0.2 and min(side, depth) >= 4 else 1
    return OperatorShape(
        kind=kind,
        batch=batch,
        in_channels=FIRST_LAYER_CHANNELS["conv3d"] if first else channels,
        height=side,
        width=side,
        depth=depth,
        out_channels=out,
        kernel=kernel,
        stride=stride,
    )


LARGE_KINDS = ("conv2d", "batch_norm2d", "relu", "max_pool2d", "add", "depthwise_conv2d")
BROAD_MAP_KINDS = LARGE_KINDS  # the kinds drawn at full resolution on few channels too (_draw_broad_map)
LARGE_SHARE = 0.25
LARGE_ELEMENTS = 4  # their largest tensor: at most this many times max_elements
LARGE_LEAST = 8  # the fit's page knot needs this many shapes past it (ddlbench.analysis.analytic.operators)


def large_count(per_kind: int) -> int:
    """How many large-map shapes of each of LARGE_KINDS: LARGE_SHARE × `per_kind`, at least LARGE_LEAST; none
    under 2 × LARGE_LEAST per kind (a quick calibration's few shapes: fewer would cost seconds each and never be
    enough for the fit's knot)."""
    if per_kind < 2 * LARGE_LEAST:
        return 0
    return max(LARGE_LEAST, round(LARGE_SHARE * per_kind))


def largest_elements(shape: OperatorShape) -> int:
    """The elements of a shape's largest activation, input or output (a token kind's out_channels are an
    embedding's rows or attention's heads, not features: its output is as large as its input)."""
    elements = shape.batch * shape.in_channels * shape.in_pixels
    out_channels = shape.in_channels if shape.kind in TOKEN_KINDS else max(shape.out_channels, shape.in_channels)
    return max(elements, shape.batch * out_channels * shape.out_pixels)


def _draw_large(rng: random.Random, kind: str) -> OperatorShape:
    """A layer on a large map: channels 8-192 (conv2d's output the input's, a sixth, half, twice or six
    times, as MobileNet's expansions and projections; 1×1 one time in two, else 3×3), side 56-224, batch 1-32
    (depthwise_conv2d: 3×3, channels 16-576, stride 1: every draw's output as large as its input, so that the
    fit's page knot has enough shapes past it in both passes)."""
    side = max(2, round(_log_uniform(rng, 56, 224)))
    batch = max(1, round(_log_uniform(rng, 1, 32)))
    channels = _channels(rng, 8, 192)
    if kind == "conv2d":
        out = max(8, min(1152, int(channels * rng.choice((1 / 6, 0.5, 1, 2, 6)))))
        kernel = 1 if rng.random() < 0.5 else 3
        return OperatorShape(
            kind=kind, batch=batch, in_channels=channels, height=side, width=side, out_channels=out, kernel=kernel
        )
    if kind == "depthwise_conv2d":
        channels = _channels(rng, 16, 576)
        return OperatorShape(
            kind=kind, batch=batch, in_channels=channels, height=side, width=side, out_channels=channels, kernel=3
        )
    if kind == "max_pool2d":
        side -= side % 2
    return OperatorShape(kind=kind, batch=batch, in_channels=channels, height=side, width=side)


def _within(shape: OperatorShape, max_flop: float, max_elements: int) -> bool:
    """Whether a drawn shape is kept: at most `max_flop` forward FLOPs, no tensor above `max_elements`, and an
    output of at least one row and column."""
    table = shape.out_channels * shape.in_channels if shape.kind == "embedding" else 0  # its rows × features
    return (
        shape.forward_flop <= max_flop
        and max(largest_elements(shape), table) <= max_elements
        and shape.out_height >= 1
        and shape.out_width >= 1
        and shape.out_depth >= 1
    )


WIDE_CONV_SHARE = 0.5
# their FLOP cap, times max_flop: a deep stage's batch of small maps (1024 channels 3×3, 14 × 4×4: 4.2 GFLOP)
WIDE_CONV_FLOP = 4.0


def _draw_wide_conv(rng: random.Random) -> OperatorShape:
    """A conv2d of 512-2048 input channels, as many output channels, half or twice (256-2048), 3×3 (one in
    four 1×1), on a map of 1-8 columns (rows fewer one time in three: a spatial slab), batch 1-64."""
    channels = _channels(rng, 512, 2048)
    out = max(256, min(2048, int(channels * rng.choice((0.5, 1, 1, 2)))))
    width = max(1, round(_log_uniform(rng, 1, 8)))
    height = max(1, round(width * _log_uniform(rng, 0.25, 1.0))) if rng.random() < 1 / 3 else width
    return OperatorShape(
        kind="conv2d",
        batch=max(1, round(_log_uniform(rng, 1, 64))),
        in_channels=channels,
        height=height,
        width=width,
        out_channels=out,
        kernel=1 if rng.random() < 0.25 else 3,
        stride=1,
    )


def _draw(rng: random.Random, kind: str) -> OperatorShape:
    batch = max(1, round(_log_uniform(rng, 1, 64)))
    width = max(2, round(_log_uniform(rng, 2, 64)))
    # a slab: fewer rows than columns, one time in three
    height = max(1, round(width * _log_uniform(rng, 0.25, 1.0))) if rng.random() < 1 / 3 else width
    if kind == "linear":
        return OperatorShape(
            kind=kind,
            batch=max(1, round(_log_uniform(rng, 1, 256))),
            in_channels=_channels(rng, 16, 4096),
            out_channels=_channels(rng, 8, 4096),
            height=1,
            width=1,
        )
    channels = _channels(rng, 8, 512)
    if kind == "conv2d":
        # as in a model: output channels as many as the input's, half or twice (so that wide layers,
        # whose weights dominate their backward, are drawn as often as narrow ones); one in ten a first
        # layer (3 input channels); small maps (a deep layer's) as often as large ones
        first = rng.random() < 0.1
        kernel = 3 if rng.random() < 0.7 else 1
        channels = _channels(rng, 8, 1024)
        out = max(8, min(1024, int(channels * rng.choice((0.5, 1, 1, 2)))))
        if rng.random() < 0.25:
            width = max(1, round(_log_uniform(rng, 1, 8)))
            height = width
        return OperatorShape(
            kind=kind,
            batch=batch,
            in_channels=3 if first else channels,
            height=height,
            width=width,
            out_channels=out,
            kernel=kernel,
            stride=2 if rng.random() < 0.2 and height >= 4 else 1,
        )
    if kind in TENSOR_PARALLEL_KINDS:
        # a transformer block's Linears as a tensor-parallel rank holds them: features 16-1024 in, 16-4096
        # out (an MLP's first Linear widens 4×, its second narrows), tokens 8-512, batch 1-64
        return OperatorShape(
            kind=kind,
            batch=batch,
            in_channels=_channels(rng, 16, 1024),
            out_channels=_channels(rng, 16, 4096),
            height=max(8, round(_log_uniform(rng, 8, 512))),
            width=1,
        )
    if kind in TOKEN_KINDS:
        # a transformer's activations: features 16-1024, tokens 8-512, batch 1-64; an embedding table of
        # 64-65,536 rows; attention heads of 16, 32 or 64 features
        features = _channels(rng, 16, 1024)
        tokens = max(8, round(_log_uniform(rng, 8, 512)))
        rows = 0
        if kind == "embedding":
            rows = max(64, round(_log_uniform(rng, 64, 65536)))
        elif kind == "attention":
            rows = max(1, features // rng.choice((16, 32, 64)))
            features = rows * (features // rows)
        return OperatorShape(kind=kind, batch=batch, in_channels=features, height=tokens, width=1, out_channels=rows)
    if kind == "depthwise_conv2d":
        # as in MobileNet: 3×3 (one in five 5×5), channels 8-1024 (an expanded block's), stride 2 one in five
        channels = _channels(rng, 8, 1024)
        return OperatorShape(
            kind=kind,
            batch=batch,
            in_channels=channels,
            height=height,
            width=width,
            out_channels=channels,
            kernel=5 if rng.random() < 0.2 else 3,
            stride=2 if rng.random() < 0.2 and height >= 4 else 1,
        )
    if kind == "max_pool2d":
        height, width = max(2, height - height % 2), max(2, width - width % 2)
    return OperatorShape(kind=kind, batch=batch, in_channels=channels, height=height, width=width)
