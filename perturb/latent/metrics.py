"""Identifiability metrics for latent-variable models."""
from __future__ import annotations

import torch

from perturb._validation import check_choice, check_scores
from perturb.structured.permutations import matching

__all__ = ["correlation_matrix", "mean_corr_coef"]


def _rank(x: torch.Tensor) -> torch.Tensor:
    """Ranks along dim 0 (ties broken by order; fine for continuous data)."""
    return x.argsort(dim=0).argsort(dim=0).to(x.dtype)


def _standardised(x: torch.Tensor) -> torch.Tensor:
    """Columns centred after scaling by their largest |entry| (correlations do not change):
    scores of 1e30 in float32 would overflow the sums of squares (inf / inf = NaN)."""
    x = x / x.abs().amax(0).clamp_min(torch.finfo(x.dtype).tiny)
    return x - x.mean(0)


def correlation_matrix(a: torch.Tensor, b: torch.Tensor, method: str = "pearson") -> torch.Tensor:
    """Correlations C[i, j] = corr(a[:, i], b[:, j]).

    Shape: ``a``: ``(N, n)``, ``b``: ``(N, m)`` -> ``(n, m)``. Constant columns get correlation 0.
    Scale-free: columns are scaled by their largest entry first, so any finite magnitude
    works (1e30 in float32 included).
    """
    check_choice(method, ("pearson", "spearman"), "method")
    check_scores(a, "a", min_ndim=2)
    check_scores(b, "b", min_ndim=2)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"a and b must be (N, n) and (N, m) with the same number of rows N, "
                         f"got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if method == "spearman":
        a, b = _rank(a), _rank(b)
    a, b = _standardised(a), _standardised(b)
    na, nb = a.norm(dim=0), b.norm(dim=0)
    c = (a.T @ b) / (na[:, None] * nb[None, :]).clamp_min(torch.finfo(a.dtype).tiny)
    return c


def mean_corr_coef(z_true: torch.Tensor, z_est: torch.Tensor, method: str = "pearson"
                   ) -> torch.Tensor:
    """Mean correlation coefficient (MCC) between true sources and recovered latents.

    ``MCC = max_π (1/n) Σ_i |corr(z_true_i, z_est_π(i))|``: each source is matched to one latent by
    the exact maximum-weight matching (:func:`perturb.structured.matching`, Hungarian) on the
    absolute correlations, so MCC is 1 for any permutation and (per-coordinate) scaling or sign
    change of the sources, and invariant to them. Spearman correlations make it invariant to
    monotone per-coordinate transforms as well.

    Args:
        z_true: sources, ``(N, n)``.
        z_est: latents, ``(N, m)`` with ``m >= n`` (extra latents stay unmatched).
        method: ``"pearson"`` or ``"spearman"``.

    Returns:
        A 0-dim tensor in [0, 1].

    Reference: Khemakhem et al. 2020, "Variational autoencoders and nonlinear ICA".
    """
    check_scores(z_true, "z_true", min_ndim=2)
    check_scores(z_est, "z_est", min_ndim=2)
    if z_true.ndim != 2 or z_est.ndim != 2 or z_true.shape[0] != z_est.shape[0]:
        raise ValueError(f"z_true and z_est must be (N, n) and (N, m) with the same N, got "
                         f"{tuple(z_true.shape)} and {tuple(z_est.shape)}")
    if z_est.shape[1] < z_true.shape[1]:
        raise ValueError(f"z_est needs at least as many columns as z_true ({z_true.shape[1]}), "
                         f"got {z_est.shape[1]}")
    c = correlation_matrix(z_true.double(), z_est.double(), method).abs()
    n, m = c.shape
    square = torch.zeros(m, m, dtype=c.dtype, device=c.device)
    square[:n] = c  # dummy rows for unmatched latents
    perm = matching(square)[:n]
    return (perm * c).sum() / n
