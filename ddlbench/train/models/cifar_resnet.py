"""CIFAR-style ResNets (He et al. 2016, §4.2): depth 6n+2, stages of 16/32/64 channels.

Built as one flat nn.Sequential (stem, blocks, head) so that pipeline and model-parallel strategies
can cut it between top-level children.
"""

from __future__ import annotations

from torch import Tensor, nn

from ddlbench.train.models.init import finish_model


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        # GroupNorm normalises each sample alone, so a split batch computes what the whole batch does
        return nn.GroupNorm(min(8, channels), channels)
    raise ValueError(f"unknown norm {kind!r}; accepted: batch, group")


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (1×1 projection when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(norm, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, out_channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                _norm(norm, out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def build_cifar_resnet(*, blocks_per_stage: int, in_channels: int, num_classes: int, norm: str) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), _norm(norm, 16), nn.ReLU())
    ]
    channels = 16
    for stage, width in enumerate((16, 32, 64)):
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(channels, width, stride, norm))
            channels = width
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)))
    return finish_model(nn.Sequential(*layers))  # PyTorch's default initialisation, module by module


def build_resnet8(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_cifar_resnet(blocks_per_stage=1, in_channels=sample_shape[0], num_classes=num_outputs, norm=norm)


def build_resnet20(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_cifar_resnet(blocks_per_stage=3, in_channels=sample_shape[0], num_classes=num_outputs, norm=norm)


def build_resnet56(*, sample_shape: tuple[int, ...], num_outputs: int, norm: str = "batch") -> nn.Sequential:
    return build_cifar_resnet(blocks_per_stage=9, in_channels=sample_shape[0], num_classes=num_outputs, norm=norm)
