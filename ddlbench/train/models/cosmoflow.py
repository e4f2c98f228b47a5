"""A CosmoFlow-style 3-D CNN (Mathuriya et al. SC18; the MLPerf HPC CosmoFlow reference model).

Five convolution children, each a 3×3×3 convolution (32·2^i filters, as in MLPerf's configuration)
with its norm, a leaky ReLU and a 2×2×2 max-pool, then three dense children (128, 64, then one
output per regressed cosmological parameter). A 128³ volume ends at 512×4³ before the dense layers,
a 32³ one at 512×1³. The output is left linear (MLPerf scales a tanh to the parameters' range) so
that the loss is a plain mean squared error on whatever scale the targets have.
"""

from __future__ import annotations

from torch import nn

from ddlbench.train.models.resnet import NORMS, check_option, init_weights, make_norm

FIRST_FILTERS, CONV_LAYERS = 32, 5
DENSE = (128, 64)
# Keras's LeakyReLU default, which the reference implementation uses
NEGATIVE_SLOPE = 0.3


def build_cosmoflow(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "none") -> nn.Sequential:
    check_option("norm", norm, NORMS)
    channels, sides = sample_shape[0], list(sample_shape[1:])
    layers: list[nn.Module] = []
    for index in range(CONV_LAYERS):
        width = FIRST_FILTERS * 2**index
        # an axis already down to 1 is not pooled further, so volumes smaller than 32³ still build
        kernel = tuple(2 if side > 1 else 1 for side in sides)
        sides = [side // k for side, k in zip(sides, kernel, strict=True)]
        layers.append(
            nn.Sequential(
                nn.Conv3d(channels, width, 3, padding=1, bias=norm == "none"),
                make_norm(norm, width, dims=3),
                nn.LeakyReLU(NEGATIVE_SLOPE),
                nn.MaxPool3d(kernel, stride=kernel),
            )
        )
        channels = width
    flat = channels * sides[0] * sides[1] * sides[2]
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(flat, DENSE[0]), nn.LeakyReLU(NEGATIVE_SLOPE)))
    layers.append(nn.Sequential(nn.Linear(DENSE[0], DENSE[1]), nn.LeakyReLU(NEGATIVE_SLOPE)))
    layers.append(nn.Sequential(nn.Linear(DENSE[1], num_outputs)))
    return init_weights(nn.Sequential(*layers))
