"""Synthetic datasets, deterministic per sample index and seed, so any split of a global batch over
ranks sees exactly the samples a single process would see.

Sample i is drawn from a generator seeded by mix_seed(seed, stream, i) alone. Each sample carries a
planted signal a network learns quickly, and its target is a fixed function of the sample (fixed by
the seed), so the loss falls: pure noise labelled by a projection of pooled means, tried first, barely
moved a ResNet-8's loss in 150 steps, while a planted texture took it from 2.3 to 0.04. Drawing the
N(0, 1) noise at full size is fast enough (an imagenet batch of 32 takes ~40-130 ms, a highres batch
of 8 ~70-200 ms on one core), so no low-resolution trick is needed.

Targets are computed one sample at a time in float64: a batched matmul or reduction may sum in
another order for another batch size or thread count, which would change a float target's last bit
(or flip a near-tie argmax) between a split batch and the whole one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ddlbench.catalog import DatasetSpec
from ddlbench.train.data.order import mix_seed

# separate random streams, so the target rule is unrelated to the samples it labels
_SAMPLE_STREAM = 0x5A_3B1E
_RULE_STREAM = 0x5EED_1AB1
# images: the class texture's amplitude next to unit noise (pixels stay ~N(0, 1)), and its period
TEXTURE_AMPLITUDE, TEXTURE_PERIOD = 0.3, 4
# volumes: the per-channel offset's amplitude next to unit noise (voxels stay ~N(0, 1))
OFFSET_AMPLITUDE = 0.5
# a token sequence restarts at a fresh random token with this probability at each position
TOKEN_RESTART_PROBABILITY = 1 / 16


def _per_sample(samples: Tensor, rule: Callable[[Tensor], Tensor], *, empty: Tensor) -> Tensor:
    """rule applied to each sample alone, in float64, stacked (see the module's docstring for why);
    `empty` for a batch of none."""
    if not len(samples):
        return empty
    return torch.stack([rule(sample.double()) for sample in samples])


class _PerSample:
    """Common part: one generator reseeded per sample from (seed, stream, global index)."""

    def __init__(self, spec: DatasetSpec, *, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self._generator = torch.Generator()

    def _rule_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(mix_seed(self.seed, _RULE_STREAM))

    def _sample_generators(self, start: int, size: int):
        if start < 0 or size < 0:
            raise ValueError(f"batch(start={start}, size={size}): both must be non-negative")
        for index in range(start, start + size):
            yield self._generator.manual_seed(mix_seed(self.seed, _SAMPLE_STREAM, index))


class SyntheticImages(_PerSample):
    """Images of noise plus one class's texture: a fixed random C×4×4 pattern tiled over the image.

    Sample i draws a class c uniformly, then N(0, 1) noise; the image is √(1-a²)·noise + a·tile(T_c).
    The label is argmax_k ⟨fold(image), T_k⟩, where fold averages the image over its 4×4 periods: a
    fixed function of the image, equal to c unless noise outweighs the texture (it essentially never
    does: folding averages H·W/16 pixels of noise away).
    """

    def __init__(self, spec: DatasetSpec, *, seed: int) -> None:
        super().__init__(spec, seed=seed)
        channels, height, width = spec.sample_shape
        period = TEXTURE_PERIOD
        self._textures = torch.randn(spec.num_classes, channels, period, period, generator=self._rule_generator())
        self._tiles = (math.ceil(height / period), math.ceil(width / period))
        self._folded = (height // period * period, width // period * period)  # whole periods only

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1, as (images N×C×H×W float32, labels N int64)."""
        _, height, width = self.spec.sample_shape
        images = torch.empty(size, *self.spec.sample_shape)
        for offset, generator in enumerate(self._sample_generators(start, size)):
            label = int(torch.randint(self.spec.num_classes, (1,), generator=generator))
            image = torch.randn(self.spec.sample_shape, generator=generator).mul_(math.sqrt(1 - TEXTURE_AMPLITUDE**2))
            texture = self._textures[label].repeat(1, *self._tiles)[:, :height, :width]
            images[offset] = image.add_(texture, alpha=TEXTURE_AMPLITUDE)
        return images, self.targets_for(images)

    def targets_for(self, images: Tensor) -> Tensor:
        """The label rule: a function of the image alone."""
        textures = self._textures.flatten(1).double()
        period, (height, width) = TEXTURE_PERIOD, self._folded

        def label(image: Tensor) -> Tensor:
            whole = image[:, :height, :width]
            folded = whole.unflatten(2, (width // period, period)).unflatten(1, (height // period, period))
            return (textures @ folded.mean((1, 3)).flatten()).argmax()

        return _per_sample(images, label, empty=torch.empty(0, dtype=torch.int64))


class SyntheticVolumes(_PerSample):
    """Volumes of noise with a per-channel offset; the targets are a fixed mix of the channel means.

    Sample i draws z ~ N(0, I) (one value per channel), then N(0, 1) noise; the volume is
    √(1-b²)·noise + b·z (broadcast over each channel). The targets are W·mean(volume)/b, with W a fixed
    random matrix of unit-norm rows: smooth (linear) in the volume, ≈ W·z, so each is roughly N(0, 1).
    A channel offset survives convolution and max-pooling, so a CosmoFlow CNN learns it quickly.
    """

    def __init__(self, spec: DatasetSpec, *, seed: int) -> None:
        super().__init__(spec, seed=seed)
        channels = spec.sample_shape[0]
        weights = torch.randn(spec.num_outputs, channels, generator=self._rule_generator(), dtype=torch.float64)
        self._weights = weights / weights.norm(dim=1, keepdim=True)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1, as (volumes N×C×D×H×W float32, targets N×outputs float32)."""
        channels = self.spec.sample_shape[0]
        volumes = torch.empty(size, *self.spec.sample_shape)
        for offset, generator in enumerate(self._sample_generators(start, size)):
            shift = torch.randn(channels, generator=generator).mul_(OFFSET_AMPLITUDE)
            volume = torch.randn(self.spec.sample_shape, generator=generator).mul_(math.sqrt(1 - OFFSET_AMPLITUDE**2))
            volumes[offset] = volume.add_(shift.view(channels, 1, 1, 1))
        return volumes, self.targets_for(volumes)

    def targets_for(self, volumes: Tensor) -> Tensor:
        """The target rule: a function of the volume alone."""
        return _per_sample(
            volumes,
            lambda volume: self._weights @ volume.mean((1, 2, 3)) / OFFSET_AMPLITUDE,
            empty=torch.empty(0, self.spec.num_outputs, dtype=torch.float64),
        ).float()


class SyntheticTokens(_PerSample):
    """Token sequences that follow the affine rule x' = (a·x + b) mod vocab, restarting at a fresh
    uniform token with probability 1/16 per position; the target at t is the rule applied to x_t.

    Away from restarts the target is the true next token (inputs[t+1]); at a restart the next token is
    unpredictable, so the target stays the rule's prediction, which keeps the targets a function of
    the inputs (the loss can fall to zero) while attention still sees sequences with structure.
    """

    def __init__(self, spec: DatasetSpec, *, seed: int) -> None:
        super().__init__(spec, seed=seed)
        vocab = spec.num_outputs
        generator = self._rule_generator()
        multiplier = 1
        while vocab > 2 and (multiplier == 1 or math.gcd(multiplier, vocab) != 1):  # coprime: a permutation
            multiplier = int(torch.randint(2, vocab, (1,), generator=generator))
        self.multiplier = multiplier
        self.offset = int(torch.randint(vocab, (1,), generator=generator))
        # k steps of the rule from x are (power[k]·x + shift[k]) mod vocab
        length = spec.sample_shape[0]
        power, shift = [1], [0]
        for _ in range(length - 1):
            power.append(power[-1] * multiplier % vocab)
            shift.append((shift[-1] * multiplier + self.offset) % vocab)
        self._power = torch.tensor(power, dtype=torch.int64)
        self._shift = torch.tensor(shift, dtype=torch.int64)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1, as (token ids N×T int64, next-token targets N×T int64)."""
        (length,), vocab = self.spec.sample_shape, self.spec.num_outputs
        fresh = torch.empty(size, length, dtype=torch.int64)
        restart = torch.empty(size, length, dtype=torch.bool)
        for offset, generator in enumerate(self._sample_generators(start, size)):
            fresh[offset] = torch.randint(vocab, (length,), generator=generator)
            restart[offset] = torch.rand(length, generator=generator) < TOKEN_RESTART_PROBABILITY
        restart[:, 0] = True
        positions = torch.arange(length).expand(size, length)
        last_restart = torch.where(restart, positions, 0).cummax(dim=1).values
        steps = positions - last_restart
        tokens = (self._power[steps] * fresh.gather(1, last_restart) + self._shift[steps]) % vocab
        return tokens, self.targets_for(tokens)

    def targets_for(self, tokens: Tensor) -> Tensor:
        """The target rule: a function of each position's token alone."""
        return (tokens * self.multiplier + self.offset) % self.spec.num_outputs


SYNTHETIC = {"image2d": SyntheticImages, "volume3d": SyntheticVolumes, "tokens": SyntheticTokens}


def open_synthetic(spec: DatasetSpec, *, seed: int) -> SyntheticImages | SyntheticVolumes | SyntheticTokens:
    return SYNTHETIC[spec.input_kind](spec, seed=seed)
