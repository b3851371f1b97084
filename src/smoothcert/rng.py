"""Explicit randomness: every Monte Carlo draw comes from a generator we can name and reseed."""

from __future__ import annotations

import numpy as np
import torch


def derived_seed(*keys: int) -> int:
    """A 63-bit seed from a tuple of non-negative integers (e.g. (run seed, example index)).

    NumPy's SeedSequence hashes the tuple, so nearby keys give unrelated streams.
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def example_generator(seed: int, idx: int, device="cpu") -> torch.Generator:
    """The generator of dataset example ``idx`` in a run seeded with ``seed``.

    Results then depend on neither batching across examples, nor sharding, nor resuming.
    """
    return torch.Generator(device=device).manual_seed(derived_seed(seed, idx))
