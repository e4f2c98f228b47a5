"""Seeds and sample orders shared by the synthetic and the real datasets.

Every rank computes the same numbers from (seed, index) alone, with no communication, so a global
batch split over ranks in any way sees exactly the samples one process would see.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_ORDER_STREAM = 0x0DE7_5A11


def _splitmix64(state: int) -> int:
    """One step of the SplitMix64 mixer: nearby inputs give unrelated 64-bit outputs."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state ^ (state >> 31)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts (seed, stream, sample index...).

    Hashing instead of (seed << 32) + index keeps seed s, index i+2³² apart from seed s+1, index i;
    63 bits suit both torch.Generator.manual_seed and numpy.
    """
    state = 0
    for part in parts:
        state = _splitmix64(state ^ (part & _MASK64))
    return state >> 1


def sample_order(count: int, seed: int) -> np.ndarray:
    """A seed-determined permutation of range(count): global sample i is sample order[i % count]."""
    return np.random.default_rng(mix_seed(seed, _ORDER_STREAM)).permutation(count)


def take(order: np.ndarray, start: int, size: int) -> np.ndarray:
    """The stored sample indices of global samples start .. start+size-1 (wrapping past the end)."""
    if start < 0 or size < 0:
        raise ValueError(f"batch(start={start}, size={size}): both must be non-negative")
    return order[np.arange(start, start + size) % len(order)]
