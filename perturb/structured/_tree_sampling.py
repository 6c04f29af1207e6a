r"""Exact samples from the Gibbs distributions over trees, by sequential conditioning.

Every arborescence has exactly one edge into each non-root node, so the parent of node j is a
categorical variable whose distribution is column j of the edge marginals: P(parent(j) = i) =
μ_ij. Sampling the parents one node at a time, each from the marginals of the graph conditioned
on the parents already drawn (all other edges into those nodes removed), gives an exact sample:

    p(T) = Π_j P(parent(j) = π_j | π_1, ..., π_{j−1}).

Each step is one matrix-tree solve, so a sample costs O(n⁴) for n nodes (vectorised over batch
and samples; fine for the n ≲ 100 of latent-tree models; Wilson's algorithm is O(n²) expected but
sequential per sample). A spanning tree is sampled as the arborescence rooted at node 0 of the
symmetric graph (one orientation per tree, with the same weight).

References:
    Koo et al., EMNLP 2007 (marginals); Wilson, "Generating random spanning trees more quickly
    than the cover time", STOC 1996 (the alternative).
"""
from __future__ import annotations

import torch

from perturb._validation import check_int
from perturb.structured._matrix_tree import _compute_dtype, _prepare, _solve

__all__ = ["sample_spanning_tree", "sample_arborescence"]


def _sample(s, valid, nodes, root, n_samples, generator):
    n = s.shape[-1]
    batch = s.shape[:-2]
    lead = (n_samples,) if n_samples is not None else ()
    x = s.detach().to(_compute_dtype(s.dtype)).expand(*lead, *batch, n, n)
    cur = valid.expand(*lead, *batch, n, n).clone()
    exists = (nodes.expand(*lead, *batch, n) if nodes is not None
              else torch.ones(*lead, *batch, n, dtype=torch.bool, device=s.device))
    eye = torch.eye(n, dtype=torch.bool, device=s.device)
    for j in range(n):
        if j == root:
            continue
        with torch.no_grad():
            mu = _solve(x, cur, nodes, root, need_logz=False)[0]
        probs = mu[..., :, j].clamp_min(0).reshape(-1, n)
        here = exists[..., j].reshape(-1)
        # absent nodes: draw a dummy parent (the root) and keep their empty column
        probs = torch.where(here.unsqueeze(-1), probs, eye[root].to(probs.dtype))
        i = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        pick = eye[i].reshape(*cur.shape[:-2], n) & here.reshape(*cur.shape[:-2], 1)
        cur[..., :, j] = cur[..., :, j] & pick
    return cur


def sample_arborescence(w: torch.Tensor, root: int = 0, n_samples: int | None = None,
                        generator: torch.Generator | None = None,
                        tau: float | torch.Tensor = 1.0, mask: torch.Tensor | None = None,
                        lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""Exact samples T ~ p(T) ∝ exp(Σ_{(i→j)∈T} w_ij / τ) over arborescences rooted at ``root``.

    Sequential conditioning on the parents (module docstring); O(n⁴) per sample, vectorised.

    Args:
        w: log-potentials, ``w[..., i, j]`` for i → j (diagonal and root column ignored).
        root: the root node.
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` on ``w``'s device, for reproducibility.
        tau, mask, lengths: as :func:`arborescence_marginals`.

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)`` or ``(n_samples, *batch, n, n)``, 0/1 in
    ``w``'s dtype (``T[..., i, j] = 1`` iff parent(j) = i).

    Raises:
        ValueError: as :func:`arborescence_marginals`; ``n_samples < 1``.

    Example::

        >>> T = sample_arborescence(torch.randn(6, 6), n_samples=100,
        ...                         generator=torch.Generator().manual_seed(0))
        >>> T.shape
        torch.Size([100, 6, 6])
    """
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    s, valid, nodes, root = _prepare(w.detach(), tau, mask, lengths, root, False)
    return _sample(s, valid, nodes, root, n_samples, generator).to(w.dtype)


def sample_spanning_tree(w: torch.Tensor, n_samples: int | None = None,
                         generator: torch.Generator | None = None,
                         tau: float | torch.Tensor = 1.0, mask: torch.Tensor | None = None,
                         lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""Exact samples T ~ p(T) ∝ exp(Σ_{{i,j}∈T} s_ij / τ), s = (w + wᵀ)/2, over spanning trees.

    Samples the arborescence rooted at node 0 of the symmetric graph and forgets the
    orientation (module docstring).

    Args:
        w, tau, mask, lengths: as :func:`spanning_tree_marginals`.
        n_samples, generator: as :func:`sample_arborescence`.

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)`` or ``(n_samples, *batch, n, n)``, symmetric
    0/1 in ``w``'s dtype.

    Raises:
        ValueError: as :func:`spanning_tree_marginals`; ``n_samples < 1``.
    """
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    s, valid, nodes, _ = _prepare(w.detach(), tau, mask, lengths, None, True)
    A = _sample(s, valid, nodes, 0, n_samples, generator)
    return (A | A.transpose(-1, -2)).to(w.dtype)
