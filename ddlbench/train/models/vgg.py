"""VGG (Simonyan & Zisserman 2015), configurations A (VGG-11), B (VGG-13), D (VGG-16) and E (VGG-19),
without dropout.

One child per convolution (with its norm, ReLU and the max-pool that follows it, if any) and one per
classifier layer, so a pipeline can cut between any two layers. Dropout is left out: benchmarks
compare distributed runs with a single-process reference, which random masks would make diverge.
"""

from __future__ import annotations

from torch import nn

from ddlbench.train.models.resnet import NORMS, SMALL_INPUT_MAX_SIDE, check_option, init_weights, make_norm

POOL = 0  # marks a 2×2 max-pool in a configuration
CONFIGURATIONS: dict[str, tuple[int, ...]] = {
    "A": (64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL),
    "B": (64, 64, POOL, 128, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL),
    "D": (64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512, 512, 512, POOL),
    "E": (64, 64, POOL, 128, 128, POOL, 256, 256, 256, 256, POOL, 512, 512, 512, 512, POOL, 512, 512, 512, 512, POOL),
}


def build_vgg(*, configuration: str, sample_shape: tuple[int, ...], num_outputs: int, norm: str) -> nn.Sequential:
    check_option("norm", norm, NORMS)
    plan = CONFIGURATIONS[configuration]
    channels, side = sample_shape[0], min(sample_shape[1:])
    layers: list[nn.Module] = []
    for position, width in enumerate(plan):
        if width == POOL:
            continue
        # a norm makes the convolution's bias redundant (torchvision keeps it; it is 0.003% of VGG-16)
        block: list[nn.Module] = [nn.Conv2d(channels, width, 3, padding=1, bias=norm == "none"), make_norm(norm, width)]
        block.append(nn.ReLU())
        followed_by_pool = position + 1 < len(plan) and plan[position + 1] == POOL
        # ceil mode only on an odd side (MNIST's 7), so no row is lost; elsewhere plain floor pooling, which
        # spatial strategies split without an extra output row. A 1×1 map is not pooled further.
        if followed_by_pool and side > 1:
            block.append(nn.MaxPool2d(2, stride=2, ceil_mode=side % 2 == 1))
            side = (side + 1) // 2
        layers.append(nn.Sequential(*block))
        channels = width
    if sample_shape[1] <= SMALL_INPUT_MAX_SIDE:
        # the CIFAR VGGs' classifier: 512 wide on the 512×1×1 map (64-pixel inputs leave 2×2: average it)
        hidden, first = 512, [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 512)]
    else:
        hidden, first = 4096, [nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(channels * 7 * 7, 4096)]
    layers.append(nn.Sequential(*first, nn.ReLU()))
    layers.append(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()))
    # wrapped like every other child, so a strategy that swaps submodules always finds a parent to swap in
    layers.append(nn.Sequential(nn.Linear(hidden, num_outputs)))
    return init_weights(nn.Sequential(*layers))


def build_vgg11(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_vgg(configuration="A", sample_shape=sample_shape, num_outputs=num_outputs, norm=norm)


def build_vgg13(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_vgg(configuration="B", sample_shape=sample_shape, num_outputs=num_outputs, norm=norm)


def build_vgg16(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_vgg(configuration="D", sample_shape=sample_shape, num_outputs=num_outputs, norm=norm)


def build_vgg19(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_vgg(configuration="E", sample_shape=sample_shape, num_outputs=num_outputs, norm=norm)
