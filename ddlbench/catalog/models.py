"""The model zoo's entries: the project's own implementations of the models the seeds benchmark.

Block counts are the top-level children of the built nn.Sequential (tests check them against the
built model); they bound how many pipeline stages a model can be cut into.
"""

from __future__ import annotations

from ddlbench.catalog import MODELS, ModelSpec

_CNN_NORMS = ("batch", "group")  # GroupNorm makes a split batch compute what the whole batch does
# "auto" picks the CIFAR stem (3×3, stride 1, no max-pool) for inputs of at most 64 pixels a side,
# the ImageNet stem (7×7 stride 2 + 3×3 max-pool) above; either can be forced.
_STEMS = ("auto", "imagenet", "cifar")

# CIFAR-style ResNets (He et al. 2016, section 4.2): depth 6n+2, three stages of 16/32/64 channels (projection
# shortcuts where the shape changes, so a few thousand parameters above the paper's zero-padded ones).
for _depth, _parameters in ((8, "78k"), (20, "272k"), (56, "856k")):
    MODELS.register(
        ModelSpec(
            name=f"resnet{_depth}",
            builder=f"ddlbench.train.models.cifar_resnet:build_resnet{_depth}",
            family="cnn2d",
            input_kind="image2d",
            default_batch_size=32,
            description=f"CIFAR ResNet-{_depth} (n={(_depth - 2) // 6}), {_parameters} parameters on CIFAR-10",
            blocks=1 + 3 * (_depth - 2) // 6 + 1,
            parameters=_parameters,
            options={"norm": _CNN_NORMS},
        )
    )

# ImageNet ResNets (He et al. 2016, table 1): basic blocks for 18 and 34, bottlenecks for 50, 101 and 152; and
# the wide ones (Zagoruyko & Komodakis 2016, torchvision's layout: the bottlenecks twice as wide inside).
_WIDE = "bottlenecks twice as wide inside; "
for _name, _title, _note, _blocks, _parameters in (
    ("resnet18", "ResNet-18", "", 8, "11.7M"),
    ("resnet34", "ResNet-34", "", 16, "21.8M"),
    ("resnet50", "ResNet-50", "", 16, "25.6M"),
    ("resnet101", "ResNet-101", "", 33, "44.5M"),
    ("resnet152", "ResNet-152", "", 50, "60.2M"),
    ("wide_resnet50_2", "Wide ResNet-50-2", _WIDE, 16, "68.9M"),
    ("wide_resnet101_2", "Wide ResNet-101-2", _WIDE, 33, "126.9M"),
):
    MODELS.register(
        ModelSpec(
            name=_name,
            builder=f"ddlbench.train.models.resnet:build_{_name}",
            family="cnn2d",
            input_kind="image2d",
            default_batch_size=32,
            description=f"{_title} ({_note}ImageNet layout; CIFAR stem on small inputs), {_parameters} parameters",
            blocks=1 + _blocks + 1,
            parameters=_parameters,
            options={"norm": _CNN_NORMS, "stem": _STEMS},
        )
    )

# VGG (Simonyan & Zisserman 2015, configurations A, B, D and E): each convolution (with its norm, ReLU and
# any following max-pool) is one block, and so is each of the three classifier layers.
_VGG_CONFIGURATIONS = {11: "A", 13: "B", 16: "D", 19: "E"}
for _depth, _convs, _parameters in ((11, 8, "132.9M"), (13, 10, "133.1M"), (16, 13, "138.4M"), (19, 16, "143.7M")):
    MODELS.register(
        ModelSpec(
            name=f"vgg{_depth}",
            builder=f"ddlbench.train.models.vgg:build_vgg{_depth}",
            family="cnn2d",
            input_kind="image2d",
            default_batch_size=32,
            description=f"VGG-{_depth} (configuration {_VGG_CONFIGURATIONS[_depth]}), {_parameters} parameters "
            "on ImageNet; a 512-wide classifier on inputs of at most 64 pixels",
            blocks=_convs + 3,
            parameters=_parameters,
            options={"norm": ("batch", "group", "none")},
        )
    )

MODELS.register(
    ModelSpec(
        name="mobilenet_v2",
        builder="ddlbench.train.models.mobilenet:build_mobilenet_v2",
        family="cnn2d",
        input_kind="image2d",
        default_batch_size=32,
        description="MobileNetV2 (Sandler et al. 2018), width 1.0, 3.5M parameters; stride-1 stem on small inputs",
        blocks=1 + 17 + 1 + 1,  # stem, 17 inverted residuals, the 1×1 conv to 1280, head
        parameters="3.5M",
        options={"norm": _CNN_NORMS},
    )
)

MODELS.register(
    ModelSpec(
        name="alexnet",
        builder="ddlbench.train.models.alexnet:build_alexnet",
        family="cnn2d",
        input_kind="image2d",
        default_batch_size=32,
        description="AlexNet (Krizhevsky et al. 2012, one-tower layout), 61M parameters; small-input stem below 64 px",
        blocks=5 + 3,
        parameters="61.1M",
        options={"norm": ("none", "batch", "group")},
    )
)

MODELS.register(
    ModelSpec(
        name="cosmoflow",
        builder="ddlbench.train.models.cosmoflow:build_cosmoflow",
        family="cnn3d",
        input_kind="volume3d",
        default_batch_size=4,
        description="CosmoFlow-style 3-D CNN (Mathuriya et al. 2018; MLPerf HPC): 5 conv3d+pool layers, "
        "3 dense layers, regresses 4 cosmological parameters (8.9M parameters at 128³)",
        blocks=5 + 3,
        parameters="8.9M",
        options={"norm": ("none", "batch", "group")},
    )
)

# GPT-2-style decoder-only transformers (Radford et al. 2019): pre-norm blocks, learned positions,
# causal self-attention, a 4×d MLP; blocks = embedding + layers + (final norm and LM head).
for _name, _d_model, _heads, _layers, _parameters in (
    ("gpt_tiny", 64, 4, 2, "~0.1M + embeddings"),
    # Pythia-14M's, Pythia-31M's and Pythia-70M's shapes (Biderman et al. 2023: 6 layers of 128 features and
    # 4 heads, of 256 or 512 features and 8 heads) in GPT-2's architecture
    ("gpt_nano", 128, 4, 6, "~1.2M + embeddings"),
    ("gpt_micro", 256, 8, 6, "~4.7M + embeddings"),
    ("gpt_mini", 512, 8, 6, "~19M + embeddings"),
    ("gpt_small", 768, 12, 12, "124M"),
    ("gpt_medium", 1024, 16, 24, "355M"),
    ("gpt_large", 1280, 20, 36, "774M"),
):
    MODELS.register(
        ModelSpec(
            name=_name,
            builder="ddlbench.train.models.gpt:build_gpt",
            family="transformer",
            input_kind="tokens",
            default_batch_size=8,
            description=f"GPT-2-style transformer, d_model {_d_model}, {_heads} heads, {_layers} layers "
            f"({_parameters} parameters counted GPT-2's way; the LM head is untied, adding vocab·d_model)",
            blocks=_layers + 2,
            parameters=_parameters,
            shape={"d_model": _d_model, "heads": _heads, "layers": _layers},
        )
    )
