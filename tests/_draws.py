"""Seeded random inputs shared by the test files (each draw from its own generator, so a test's
inputs do not depend on what ran before it)."""
from __future__ import annotations

import torch

F64 = torch.float64


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    """Standard normal entries of ``shape`` from a generator seeded with ``seed``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def marginals(n: int, m: int, batch: tuple[int, ...] = (), seed: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive transport marginals (a, b) of shapes ``(*batch, n)``, ``(*batch, m)``, entries
    in [0.5, 1.5) before b is rescaled to a's mass."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(*batch, n, generator=g, dtype=F64) + 0.5
    b = torch.rand(*batch, m, generator=g, dtype=F64) + 0.5
    return a, b * a.sum(-1, keepdim=True) / b.sum(-1, keepdim=True)
