"""The datasets: synthetic by default, deterministic per sample and seed; real data only from local files."""

from __future__ import annotations

from ddlbench.catalog import DATASETS, DatasetSpec

_IMAGE_FOLDER = "an ImageFolder tree (<root>/<class>/<image>.jpg|png), read with Pillow"

DATASETS.register(
    DatasetSpec(
        name="mnist",
        input_kind="image2d",
        sample_shape=(1, 28, 28),
        task="classify",
        num_outputs=10,
        description="MNIST-shaped images, 1×28×28, 10 classes",
        real_data="the MNIST IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]) in a folder",
        train_samples=60_000,
    )
)
DATASETS.register(
    DatasetSpec(
        name="cifar10",
        input_kind="image2d",
        sample_shape=(3, 32, 32),
        task="classify",
        num_outputs=10,
        description="CIFAR-10-shaped images, 3×32×32, 10 classes",
        real_data="the CIFAR-10 binary version (cifar-10-batches-bin/data_batch_*.bin)",
        train_samples=50_000,
    )
)
DATASETS.register(
    DatasetSpec(
        name="tinyimagenet",
        input_kind="image2d",
        sample_shape=(3, 64, 64),
        task="classify",
        num_outputs=200,
        description="Tiny-ImageNet-shaped images, 3×64×64, 200 classes",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 64×64",
        train_samples=100_000,  # Tiny ImageNet's training set: 500 images of each of 200 classes
    )
)
DATASETS.register(
    DatasetSpec(
        name="stl10",
        input_kind="image2d",
        sample_shape=(3, 96, 96),
        task="classify",
        num_outputs=10,
        description="STL-10-shaped images, 3×96×96, 10 classes",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 96×96",
        train_samples=5_000,  # STL-10's labelled training set: 500 images of each of 10 classes
    )
)
DATASETS.register(
    DatasetSpec(
        name="imagenette",
        input_kind="image2d",
        sample_shape=(3, 160, 160),
        task="classify",
        num_outputs=10,
        description="Imagenette-shaped images (fast.ai's 10-class ImageNet subset, 160 px version), 3×160×160",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 160×160",
        train_samples=9_469,  # Imagenette 2's training set
    )
)
DATASETS.register(
    DatasetSpec(
        name="imagenet",
        input_kind="image2d",
        sample_shape=(3, 224, 224),
        task="classify",
        num_outputs=1000,
        description="ImageNet-shaped images, 3×224×224, 1000 classes",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 224×224",
        train_samples=1_281_167,  # ILSVRC-2012's training set
    )
)
DATASETS.register(
    DatasetSpec(
        name="imagenet128",
        input_kind="image2d",
        sample_shape=(3, 128, 128),
        task="classify",
        num_outputs=1000,
        description="ImageNet at 128×128 (the resolution of BigGAN's ImageNet training), 3×128×128, 1000 classes",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 128×128",
        train_samples=1_281_167,  # ILSVRC-2012's training set
    )
)
DATASETS.register(
    DatasetSpec(
        name="webface112",
        input_kind="image2d",
        sample_shape=(3, 112, 112),
        task="classify",
        num_outputs=10_575,
        description="CASIA-WebFace-shaped aligned faces at ArcFace's 112×112 crop, 3×112×112, 10,575 identities",
        real_data=_IMAGE_FOLDER + " (one folder per identity), resized and centre-cropped to 112×112",
        train_samples=494_414,  # CASIA-WebFace's images (Yi et al. 2014)
    )
)
DATASETS.register(
    DatasetSpec(
        name="highres",
        input_kind="image2d",
        sample_shape=(3, 512, 512),
        task="classify",
        num_outputs=1000,
        description="DDLBench's high-resolution synthetic images, 3×512×512, 1000 classes",
        real_data=_IMAGE_FOLDER + ", resized and centre-cropped to 512×512",
    )
)
for _name, _side in (("cosmoflow", 128), ("cosmoflow32", 32)):
    DATASETS.register(
        DatasetSpec(
            name=_name,
            input_kind="volume3d",
            sample_shape=(4, _side, _side, _side),
            task="regress",
            num_outputs=4,
            description=f"CosmoFlow-like dark-matter volumes, 4×{_side}³ (redshift channels), 4 parameters to "
            "regress"
            + (" (the sub-volume size of the CosmoFlow benchmark)" if _side == 128 else " (small, for tests)"),
            real_data="NumPy (<name>data.npy with <name>label.npy, or .npz with arrays x and y) or HDF5 (.h5 with "
            "datasets x and y) volumes in a folder, C×D×H×W or D×H×W×C, optionally stacked",
        )
    )
for _name, _length, _vocab, _what in (
    ("tokens", 1024, 50257, "GPT-2's context and vocabulary"),
    ("tokens_small", 64, 512, "small, for tests and quick sweeps"),
    ("tokens_medium", 128, 2048, "between the two: attention over 128 tokens"),
    ("tokens_long", 512, 8192, "attention over 512 tokens, a vocabulary of 8,192"),
    ("tokens_768", 768, 4096, "attention over 768 tokens, a vocabulary of 4,096"),
):
    DATASETS.register(
        DatasetSpec(
            name=_name,
            input_kind="tokens",
            sample_shape=(_length,),
            task="language",
            num_outputs=_vocab,
            description=f"token sequences of length {_length}, vocabulary {_vocab} ({_what}); next-token targets",
            real_data="a flat array of token ids (.npy, or .bin of uint16 as nanoGPT writes), cut into sequences",
        )
    )
