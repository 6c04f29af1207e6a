"""Discrete noise: finitely many values, ties with positive probability, exact counting."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ._args import _as_tensor, _check_unit, _sample_args, _zero_grad_like
from ._quadrature import _F64, _gl
from .base import Noise

__all__ = ["Discrete"]


def _count_wins(theta: torch.Tensor, v: torch.Tensor, p: torch.Tensor, cum: torch.Tensor,
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


class Discrete(Noise):
    """Discrete noise: ``ε = values[k]`` with probability ``probs[k]``.

    Mean ``Σ p_k v_k``, variance ``Σ p_k v_k² − mean²``. ``log_prob`` is the log *mass*
    (``log p_k`` at a support point, ``-inf`` elsewhere), ``cdf`` a step function, ``icdf`` the
    generalised inverse ``min{v : F(v) ≥ u}``. Values with zero probability are dropped.

    Ties among perturbed scores have positive probability; ``argmax_probs`` splits a tie
    uniformly among the tied maximisers (perturbed scores closer than 8 units of roundoff of
    ``theta``'s dtype, relative to ``1 + max|θ| + max|v|``, count as tied: float32 scores
    ``0.1 + 0.2`` and ``0.2 + 0.1`` tie). It is computed exactly without enumerating the
    ``K^d`` outcomes: with ``u = θ_i + v_k``, ``a_j = P(θ_j + ε_j < u)`` and
    ``b_j = P(θ_j + ε_j = u)``,

    .. math::

        P(\\text{argmax} = i) = \\sum_k p_k \\int_0^1 \\prod_{j \\ne i} (a_j + b_j s)\\, ds,

    since ``E[s^T] = Π (a_j + b_j s)`` for ``T`` the number of ties and ``1/(1+T) = ∫ s^T ds``
    (the polynomial integral is done exactly by Gauss–Legendre). Cost ``O(d²K·m)`` with
    ``m = d//2 + 1`` when ties occur, ``O(d²K log K)`` otherwise. The argmax distribution is
    piecewise constant in θ: its gradient is zero almost everywhere (and it is returned with that
    zero gradient); ``expected_max`` is piecewise linear with gradient ``argmax_probs``.

    Args:
        values: the support points (distinct, finite), a sequence or 1-D tensor.
        probs: their probabilities (non-negative, summing to 1 within 1e-6; renormalised).
            ``None``: uniform.

    Raises:
        ValueError: empty, non-finite or repeated ``values``; ``probs`` of another length,
            negative, or not summing to 1.

    Example:
        >>> Discrete([-1.0, 1.0]).argmax_probs(torch.tensor([0.0, 0.0]))
        tensor([0.5000, 0.5000])
    """

    bounded = True
    continuous = False
    has_log_prob = True
    has_cdf = True
    has_icdf = True
    has_sample = True
    has_variance = True
    has_closed_form = True
    has_argmax_probs = True

    def __init__(self, values: Sequence[float] | torch.Tensor,
                 probs: Sequence[float] | torch.Tensor | None = None) -> None:
        v = self._as_vector(values, "values")
        if v.size == 0:
            raise ValueError("values must contain at least one support point, got none")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"values must be finite, got {v.tolist()}")
        if np.unique(v).size != v.size:
            raise ValueError(f"values must be distinct, got {v.tolist()}")
        if probs is None:
            p = np.full(v.size, 1.0 / v.size)
        else:
            p = self._as_vector(probs, "probs")
            if p.size != v.size:
                raise ValueError(f"probs must have one entry per value: got {p.size} probs for "
                                 f"{v.size} values")
            if not np.all(np.isfinite(p)) or np.any(p < 0):
                raise ValueError(f"probs must be finite and non-negative, got {p.tolist()}")
            if abs(p.sum() - 1.0) > 1e-6:
                raise ValueError(f"probs must sum to 1, got sum {p.sum()!r}")
            p = p / p.sum()
        self.values = tuple(float(x) for x in v)
        self.probs = tuple(float(x) for x in p)
        keep = p > 0
        order = np.argsort(v[keep])
        self._v = v[keep][order]
        self._p = p[keep][order]
        self._cum = np.concatenate([[0.0], np.cumsum(self._p)])
        self._cum[-1] = 1.0
        self._v_abs_max = float(np.abs(self._v).max())

    @staticmethod
    def _as_vector(x: object, name: str) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().to(_F64).numpy()
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a sequence of real numbers, got {x!r}") from None
        if arr.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
        return arr

    def _params(self) -> dict[str, object]:
        return {"values": self.values, "probs": self.probs}

    def _tensors(self, device: torch.device, dtype: torch.dtype = _F64
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sorted support, probabilities and cumulative sums ``[0, p_1, ..., 1]``."""
        return (torch.as_tensor(self._v, dtype=dtype, device=device),
                torch.as_tensor(self._p, dtype=dtype, device=device),
                torch.as_tensor(self._cum, dtype=dtype, device=device))

    @property
    def support(self) -> tuple[float, float]:
        return (float(self._v[0]), float(self._v[-1]))

    def sample(self, shape: Sequence[int] | torch.Size | int, *,
               generator: torch.Generator | None = None,
               device: torch.device | str | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        shape, device, dtype = _sample_args(shape, generator, device, dtype)
        u = torch.rand(shape, generator=generator, device=device, dtype=_F64)
        v, _, cum = self._tensors(u.device)
        # u in [C_{k-1}, C_k) -> v_k: P(v_k) = p_k exactly.
        k = torch.searchsorted(cum[1:-1].contiguous(), u, right=True)
        return v[k].to(dtype)

    sample.__doc__ = Noise.sample.__doc__

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        u = _check_unit(u)
        v, _, cum = self._tensors(u.device)
        k = torch.searchsorted(cum[1:-1].contiguous(), u.to(_F64), right=False)
        return v[k].to(u.dtype)

    def cdf(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_tensor(x, "x")
        v, _, cum = self._tensors(x.device)
        return cum[torch.searchsorted(v, x.to(_F64).detach(), right=True)].to(x.dtype)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log probability *mass*: ``log p_k`` where ``x == values[k]``, ``-inf`` elsewhere."""
        x = _as_tensor(x, "x")
        v, p, _ = self._tensors(x.device)
        hit = x.to(_F64).detach().unsqueeze(-1) == v
        mass = (hit * p).sum(-1)
        return torch.log(mass).to(x.dtype)

    @property
    def mean(self) -> float:
        return float(np.dot(self._p, self._v))

    @property
    def variance(self) -> float:
        return float(np.dot(self._p, (self._v - self.mean) ** 2))

    def _win_weights(self, theta: torch.Tensor) -> torch.Tensor:
        """``W[..., i, k] = p_k · P(i wins, ties split | ε_i = v_k)``, shape ``(*batch, d, K)``.

        No gradient; see the class docstring for the formula.
        """
        v, p, cum = self._tensors(theta.device)
        return _count_wins(theta, v, p, cum, self._v_abs_max)

    def _argmax_probs(self, theta: torch.Tensor) -> torch.Tensor:
        probs = self._win_weights(theta).sum(-1).to(theta.dtype)
        return _zero_grad_like(probs, theta)

    def _expected_max(self, theta: torch.Tensor) -> torch.Tensor:
        w = self._win_weights(theta)
        v = torch.as_tensor(self._v, dtype=_F64, device=theta.device)
        values = theta.to(_F64).unsqueeze(-1) + v
        return (w * values).sum((-2, -1)).to(theta.dtype)
