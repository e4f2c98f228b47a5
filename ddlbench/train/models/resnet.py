"""ImageNet ResNets (He et al. 2016, table 1): 18 with basic blocks, 50 and 152 with bottlenecks.

Built as one flat nn.Sequential (stem, one child per residual block, head) so that pipeline
strategies can cut between residual blocks. Layers are plain modules (no functional convolutions,
norms or pools, no in-place activations) because spatial, filter and channel strategies swap those
submodules for distributed versions, and a swapped submodule must see what the original saw.

This module also holds the small rules the other CNNs of the zoo share (norm choice, GroupNorm
group count, weight initialisation), so that every CNN normalises and initialises alike.
"""

from __future__ import annotations

from torch import Tensor, nn

from ddlbench.train.models.init import ModelT, finish_model

NORMS = ("batch", "group", "none")
STEMS = ("auto", "imagenet", "cifar")
# Above this many pixels a side the ImageNet stem (and, in VGG/AlexNet, the ImageNet classifier) is
# used; CIFAR-sized inputs would be shrunk to almost nothing by the 4× downsampling of that stem.
SMALL_INPUT_MAX_SIDE = 64
_MAX_GROUPS = 32  # Wu & He 2018 use 32 groups


def group_count(channels: int) -> int:
    """GroupNorm groups for `channels`: the largest divisor of it not above 32 (32 for all powers of two ≥ 32)."""
    return next(groups for groups in range(min(_MAX_GROUPS, channels), 0, -1) if channels % groups == 0)


def make_norm(kind: str, channels: int, *, dims: int = 2) -> nn.Module:
    """The normalisation after a convolution: BatchNorm, GroupNorm (per sample, so a split batch computes
    what the whole batch does) or nothing."""
    if kind == "batch":
        return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm3d(channels)
    if kind == "group":
        return nn.GroupNorm(group_count(channels), channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; accepted: {', '.join(NORMS)}")


def check_option(name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")


def init_cnn_module(name: str, module: nn.Module) -> bool:
    """He-normal convolutions (fan-out, as torchvision does) with zero biases; the InitRule of every CNN here.

    PyTorch's default convolution init shrinks activations layer after layer, which leaves a deep
    network without normalisation (VGG-16, norm=none) barely trainable. Norms (unit scale, zero shift,
    reset statistics) and linear layers keep PyTorch's default, their own reset_parameters().
    """
    if not isinstance(module, nn.Conv2d | nn.Conv3d):
        return False
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return True


def init_weights(model: ModelT) -> ModelT:
    """Attach the CNNs' initialisation (`init_cnn_module`, module by module: ddlbench.train.models.init)
    and draw it, unless the model is on the meta device (shapes only)."""
    return finish_model(model, init_cnn_module)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions around a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int, norm: str, widen: int = 1) -> None:
        super().__init__()
        if widen != 1:
            raise ValueError(f"a basic block has no inner width to widen (widen={widen})")
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm(norm, width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.norm2 = make_norm(norm, width)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(in_channels, width, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (carrying the stride, as torchvision's "v1.5" does), 1×1 expand ×4 (ResNet-50/152).
    A wide one (Zagoruyko & Komodakis 2016, as torchvision's wide_resnet50_2) has `widen` times the inner
    width; its output stays width × 4."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int, norm: str, widen: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        inner = width * widen
        self.conv1 = nn.Conv2d(in_channels, inner, 1, bias=False)
        self.norm1 = make_norm(norm, inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False)
        self.norm2 = make_norm(norm, inner)
        self.conv3 = nn.Conv2d(inner, out_channels, 1, bias=False)
        self.norm3 = make_norm(norm, out_channels)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(in_channels, out_channels, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.relu(self.norm2(self.conv2(out)))
        out = self.norm3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int, norm: str) -> nn.Module:
    # projection shortcut (option B of the paper) only where the shape changes
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), make_norm(norm, out_channels)
    )


def _stem(in_channels: int, kind: str, norm: str) -> nn.Sequential:
    if kind == "cifar":
        return nn.Sequential(nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), make_norm(norm, 64), nn.ReLU())
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
        make_norm(norm, 64),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
    )


def build_resnet(
    *,
    block: type[BasicBlock] | type[Bottleneck],
    blocks_per_stage: tuple[int, int, int, int],
    sample_shape: tuple[int, ...],
    num_outputs: int,
    norm: str,
    stem: str,
    widen: int = 1,
) -> nn.Sequential:
    check_option("norm", norm, NORMS[:2])  # a ResNet this deep needs its normalisation
    check_option("stem", stem, STEMS)
    if stem == "auto":
        stem = "cifar" if sample_shape[1] <= SMALL_INPUT_MAX_SIDE else "imagenet"
    layers: list[nn.Module] = [_stem(sample_shape[0], stem, norm)]
    channels = 64
    for stage, (count, width) in enumerate(zip(blocks_per_stage, (64, 128, 256, 512), strict=True)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            layers.append(block(channels, width, stride, norm, widen))
            channels = width * block.expansion
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_outputs)))
    return init_weights(nn.Sequential(*layers))


# He et al. 2016, table 1: the block, the blocks per stage and the inner widening of each model; the wide
# ResNet-50-2 (Zagoruyko & Komodakis 2016, torchvision's layout) is ResNet-50's with bottlenecks twice as wide
LAYOUTS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int], int]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2), 1),
    "resnet34": (BasicBlock, (3, 4, 6, 3), 1),
    "resnet50": (Bottleneck, (3, 4, 6, 3), 1),
    "resnet101": (Bottleneck, (3, 4, 23, 3), 1),
    "resnet152": (Bottleneck, (3, 8, 36, 3), 1),
    "wide_resnet50_2": (Bottleneck, (3, 4, 6, 3), 2),
    "wide_resnet101_2": (Bottleneck, (3, 4, 23, 3), 2),
}


def _builder(name: str):
    block, blocks_per_stage, widen = LAYOUTS[name]

    def build(
        *, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch", stem: str = "auto"
    ) -> nn.Sequential:
        return build_resnet(
            block=block,
            blocks_per_stage=blocks_per_stage,
            sample_shape=sample_shape,
            num_outputs=num_outputs,
            norm=norm,
            stem=stem,
            widen=widen,
        )

    build.__name__ = build.__qualname__ = f"build_{name}"
    build.__doc__ = f"{name}: {blocks_per_stage} {block.__name__}s per stage" + (f", {widen}× wide" * (widen > 1))
    return build


build_resnet18 = _builder("resnet18")
build_resnet34 = _builder("resnet34")
build_resnet50 = _builder("resnet50")
build_resnet101 = _builder("resnet101")
build_resnet152 = _builder("resnet152")
build_wide_resnet50_2 = _builder("wide_resnet50_2")
build_wide_resnet101_2 = _builder("wide_resnet101_2")
