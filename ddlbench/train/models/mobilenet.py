"""MobileNetV2 (Sandler et al. 2018, table 2), width multiplier 1.0, without dropout.

Children: the stem, the 17 inverted residual blocks, the 1×1 convolution to 1280 channels, and the
head (average pool, flatten, linear). On inputs of at most 64 pixels the stem and the first stride-2
bottleneck stage keep stride 1 (the usual CIFAR adaptation), so 32×32 ends at 4×4 instead of 1×1.
"""

from __future__ import annotations

from torch import Tensor, nn

from ddlbench.train.models.resnet import NORMS, SMALL_INPUT_MAX_SIDE, check_option, init_weights, make_norm

# (expansion t, output channels c, repeats n, first stride s), as in table 2 of the paper
INVERTED_RESIDUALS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
STEM_CHANNELS, LAST_CHANNELS = 32, 1280


def _conv_norm_relu6(
    in_channels: int, out_channels: int, kernel: int, stride: int, groups: int, norm: str
) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
        make_norm(norm, out_channels),
        nn.ReLU6(),
    ]


class InvertedResidual(nn.Module):
    """1×1 expansion, 3×3 depthwise, linear 1×1 projection; a residual when the shape is kept."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int, norm: str) -> None:
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += _conv_norm_relu6(in_channels, hidden, 1, 1, 1, norm)
        layers += _conv_norm_relu6(hidden, hidden, 3, stride, hidden, norm)
        # the projection stays linear: a ReLU on the narrow bottleneck destroys information (§3.2)
        layers += [nn.Conv2d(hidden, out_channels, 1, bias=False), make_norm(norm, out_channels)]
        self.layers = nn.Sequential(*layers)
        # the residual as a child of its own, as ResNet's blocks hold theirs: the model table then shows the sum
        # its forward adds (ddlbench.analysis.analytic.compute.residual_sums), which it priced at nothing before
        self.shortcut = nn.Identity() if stride == 1 and in_channels == out_channels else None

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(x)
        return self.shortcut(x) + out if self.shortcut is not None else out


def build_mobilenet_v2(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    check_option("norm", norm, NORMS[:2])
    small = sample_shape[1] <= SMALL_INPUT_MAX_SIDE
    layers: list[nn.Module] = [
        nn.Sequential(*_conv_norm_relu6(sample_shape[0], STEM_CHANNELS, 3, 1 if small else 2, 1, norm))
    ]
    channels = STEM_CHANNELS
    for stage, (expansion, width, repeats, stride) in enumerate(INVERTED_RESIDUALS):
        if small and stage == 1:
            stride = 1
        for index in range(repeats):
            layers.append(InvertedResidual(channels, width, stride if index == 0 else 1, expansion, norm))
            channels = width
    layers.append(nn.Sequential(*_conv_norm_relu6(channels, LAST_CHANNELS, 1, 1, 1, norm)))
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(LAST_CHANNELS, num_outputs)))
    return init_weights(nn.Sequential(*layers))
