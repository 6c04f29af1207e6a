"""Private counting machinery behind :class:`perturb.noise.Discrete`.

Exact argmax probabilities of ``θ + ε`` for discrete ``ε`` with ties split uniformly, without
enumerating the ``K^d`` outcomes (the formula is in the docstring of
:class:`perturb.noise.Discrete`).
"""
from __future__ import annotations

import torch

from ._noise_quadrature import _F64, _gl


def _win_weights(theta: torch.Tensor, v: torch.Tensor, p: torch.Tensor, cum: torch.Tensor,
                 v_abs_max: float) -> torch.Tensor:
    """``W[..., i, k] = p_k · P(i wins, ties split | ε_i = v_k)``, shape ``(*batch, d, K)``.

    ``v``, ``p``, ``cum``: the sorted support, its probabilities and the cumulative sums
    ``[0, p_1, ..., 1]`` (float64, on ``theta``'s device); ``v_abs_max = max_k |v_k|`` (for the
    tie tolerance). ``theta`` ``(*batch, d)``. No gradient.
    """
    with torch.no_grad():
        th = theta.detach().to(_F64)
        d = th.shape[-1]
        u = th.unsqueeze(-1) + v                                         # (*b, d, K)
        q = u.unsqueeze(-1) - th[..., None, None, :]                      # (*b, d, K, d)
        scale = 1.0 + th.abs().amax(-1) + v_abs_max
        tol = (8 * torch.finfo(theta.dtype).eps * scale)[..., None, None, None]
        n_lt = torch.searchsorted(v, (q - tol).contiguous(), right=False)
        n_le = torch.searchsorted(v, (q + tol).contiguous(), right=True)
        a = cum[n_lt]
        b = cum[n_le] - a
        own = torch.eye(d, dtype=torch.bool, device=th.device)[:, None, :]  # j == i
        a = torch.where(own, torch.ones_like(a), a)
        b = torch.where(own, torch.zeros_like(b), b)
        if bool((b > 0).any()):
            t, wt = _gl(d // 2 + 1, th.device)     # exact for degree d - 1 <= 2(d//2+1) - 1
            s, ws = (t + 1) / 2, wt / 2
            factors = a.unsqueeze(-1) + b.unsqueeze(-1) * s              # (*b, d, K, d, m)
            win = (factors.prod(-2) * ws).sum(-1)
        else:
            win = a.prod(-1)
        return p * win
