"""AlexNet (Krizhevsky et al. 2012) in its one-tower layout (as torchvision lays it out), without dropout.

Five convolution children (each with its norm, ReLU and following max-pool, if any) and three
classifier children. On inputs of at most 64 pixels the 11×11 stride-4 stem would leave almost
nothing to convolve, so a small-input variant uses a 3×3 stride-1 first convolution and 2×2 pools
(32×32 and 28×28 both end at 4×4) under the same five-plus-three layout and a 4096-wide classifier.
"""

from __future__ import annotations

from torch import nn

from ddlbench.train.models.resnet import NORMS, SMALL_INPUT_MAX_SIDE, check_option, init_weights, make_norm

WIDTHS = (64, 192, 384, 256, 256)
HIDDEN = 4096


def _padding(kernel: int) -> int:
    return 2 if kernel == 11 else kernel // 2  # the 11×11 stride-4 stem pads 2, as torchvision's does (224 → 55)


def _conv(
    in_channels: int, out_channels: int, kernel: int, stride: int, norm: str, pool: nn.Module | None
) -> nn.Sequential:
    layers = [
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=_padding(kernel), bias=norm == "none"),
        make_norm(norm, out_channels),
        nn.ReLU(),
    ]
    return nn.Sequential(*layers, *([pool] if pool is not None else []))


def build_alexnet(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "none") -> nn.Sequential:
    check_option("norm", norm, NORMS)
    channels, side = sample_shape[0], min(sample_shape[1:])
    small = sample_shape[1] <= SMALL_INPUT_MAX_SIDE
    kernels, first_stride, pooled_side = ((3, 5, 3, 3, 3), 1, 4) if small else ((11, 5, 3, 3, 3), 4, 6)
    layers: list[nn.Module] = []
    for index, (width, kernel) in enumerate(zip(WIDTHS, kernels, strict=True)):
        stride = first_stride if index == 0 else 1
        side = (side + 2 * _padding(kernel) - kernel) // stride + 1
        pool: nn.Module | None = None
        if index in (0, 1, 4) and small:
            # ceil mode only on an odd side (MNIST: 28 → 14 → 7 → 4), so it never drops a row; elsewhere
            # plain floor pooling, which spatial strategies split without an extra output row
            pool = nn.MaxPool2d(2, stride=2, ceil_mode=side % 2 == 1)
            side = (side + 1) // 2
        elif index in (0, 1, 4):
            pool = nn.MaxPool2d(3, stride=2)
            side = (side - 3) // 2 + 1
        layers.append(_conv(channels, width, kernel, stride, norm, pool))
        channels = width
    # the adaptive pool fixes the classifier's input whatever the image size (224 gives 6×6 already)
    flat = channels * pooled_side * pooled_side
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(pooled_side), nn.Flatten(), nn.Linear(flat, HIDDEN), nn.ReLU()))
    layers.append(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()))
    layers.append(nn.Sequential(nn.Linear(HIDDEN, num_outputs)))
    return init_weights(nn.Sequential(*layers))
