"""The one place where the hierarchy application turns ``generator=`` / ``seed=`` into a
``torch.Generator`` (data generators, splits, initialisation and training all use it)."""
from __future__ import annotations

import numbers

import torch

__all__ = ["resolve_generator", "spawn_generator"]


def resolve_generator(generator: torch.Generator | None = None, seed: int | None = None
                      ) -> torch.Generator:
    """The generator to draw from: ``generator`` itself, a new CPU generator seeded with
    ``seed``, or (both None) a new CPU generator seeded non-deterministically.

    Raises:
        ValueError: both given; ``seed`` not an int; ``generator`` not a ``torch.Generator``.
    """
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got "
                             f"{type(generator).__name__}")
        return generator
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"seed must be an int, got {seed!r}")
        g.manual_seed(int(seed))
    return g


def spawn_generator(parent: torch.Generator, device: torch.device | str | None = None
                    ) -> torch.Generator:
    """A new generator on ``device`` (default CPU), seeded by one draw from ``parent``.

    Used to give the training loop a generator on the training device (negatives and
    shuffling are drawn there) whose stream is fixed by the parent's seed.
    """
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=parent))
    dev = torch.device("cpu") if device is None else torch.device(device)
    return torch.Generator(device=dev).manual_seed(seed)
