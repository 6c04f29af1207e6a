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


def perturbed_side(noise, lo: torch.Tensor, up: torch.Tensor, n: int = 400_000, seed: int = 0
                   ) -> tuple[float, float]:
    """Mean and standard error of ``(min_j U_j − max_j L_j)_+`` over ``n`` draws of boxes with
    corners ``lo``, ``up`` ``(m,)`` perturbed by ``noise`` (``L = l + ε``, ``U = u − ε'``): the
    Monte Carlo reference of one expected side."""
    g = torch.Generator().manual_seed(seed)
    L = lo[:, None] + noise.sample((lo.shape[0], n), generator=g, dtype=F64)
    U = up[:, None] - noise.sample((up.shape[0], n), generator=g, dtype=F64)
    side = (U.amin(0) - L.amax(0)).clamp(min=0)
    return float(side.mean()), float(side.std()) / n ** 0.5
