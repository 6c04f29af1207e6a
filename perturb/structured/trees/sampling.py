r"""Exact samples from the Gibbs distributions over trees, by sequential conditioning.

Every arborescence has exactly one edge into each non-root node, so the parent of node j is a
categorical variable whose distribution is column j of the edge marginals: P(parent(j) = i) =
μ_ij. Sampling the parents one node at a time, each from the marginals of the graph conditioned
on the parents already drawn (all other edges into those nodes removed), gives an exact sample:

    p(T) = Π_j P(parent(j) = π_j | π_1, ..., π_{j−1}).

Each step is one matrix-tree solve, so a sample costs O(n⁴) for n nodes (vectorised over batch
and samples) whatever the scores. Wilson's algorithm (:mod:`perturb.structured.trees._wilson`)
samples the same distribution by loop-erased random walks in expected tr G walk steps, G the
fundamental matrix of the walk to a random parent: about n to a few n steps for spread-out
scores (O(n²) work per sample), but e^{gap}-many for peaked scores whose strong edges form
cycles. ``method="auto"`` computes tr G (one batched inverse) and runs Wilson's algorithm when
it is at most ``_AUTO_STEPS_PER_NODE``·n, the conditioning otherwise. A spanning tree is sampled
as the arborescence rooted at node 0 of the symmetric graph (one orientation per tree, with
the same weight).

References:
    Koo et al., EMNLP 2007 (marginals); Wilson, "Generating random spanning trees more quickly
    than the cover time", STOC 1996 (the alternative).
"""
from __future__ import annotations

from typing import Any

import torch

from perturb._deprecation import legacy_keywords
from perturb._validation import unreadable, check_choice, check_int
from perturb._vmap import fold_random_vmap
from perturb.structured.trees._graph_input import _detached, _prepare
from perturb.structured.trees._matrix_tree import column_softmax, compute_dtype, solve
from perturb.structured.trees._wilson import (
    expected_steps,
    wilson_sample,
    wilson_step_limit,
)

__all__ = ["sample_spanning_tree", "sample_arborescence", "WilsonStepLimit"]

SAMPLE_METHODS = ("auto", "wilson", "conditional")

class WilsonStepLimit(RuntimeError):
    """Raised by ``method="wilson"`` when the random walks have not finished within the step
    limit (``2000 + 400·n`` steps: peaked scores whose strong edges form cycles); use
    ``method="conditional"`` or ``"auto"``."""


#: ``method="auto"`` runs Wilson's algorithm while tr G <= this many steps per node.
_AUTO_STEPS_PER_NODE = 25


def _sample(s, valid, nodes, root, n_samples, generator, method="auto"):
    n = s.shape[-1]
    batch = s.shape[:-2]
    lead = (n_samples,) if n_samples is not None else ()
    x = s.detach().to(compute_dtype(s.dtype))
    exists = (nodes.expand(*lead, *batch, n) if nodes is not None
              else torch.ones(*lead, *batch, n, dtype=torch.bool, device=s.device))
    if method == "conditional":
        return _sample_conditional(x, valid, nodes, root, lead, exists, generator)
    P, _, _ = column_softmax(x, valid.expand(x.shape))
    limit = wilson_step_limit(n)
    if method == "auto":
        steps = expected_steps(P, root)
        if not bool((steps <= _AUTO_STEPS_PER_NODE * n).all()):
            return _sample_conditional(x, valid, nodes, root, lead, exists, generator)
    shape = (*lead, *batch)
    Pw = P.expand(*shape, n, n).reshape(-1, n, n)
    ex = exists.clone()
    ex[..., root] = False
    parent, done = wilson_sample(Pw, ex.reshape(-1, n), root, generator, limit)
    if not bool(done.all()):
        if method == "wilson":
            raise WilsonStepLimit(
                f"Wilson's algorithm did not finish within {limit} random-walk steps (the "
                "expected number is tr (I − P̂)⁻¹, large when strong edges form cycles: peaked "
                "scores or small tau); use method='conditional' (or 'auto')")
        # auto: walks past the cap (far above the expected steps tr G, whose tail is
        # exponential) are redrawn by the conditioning; the samples kept are exact up to a
        # total variation of P(a walk needs more than the cap)
        cond = _sample_conditional(x, valid, nodes, root, lead, exists, generator)
        T = _parents_to_matrix(parent, ex.reshape(-1, n), n).reshape(*shape, n, n)
        return torch.where(done.reshape(*shape, 1, 1), T, cond)
    return _parents_to_matrix(parent, ex.reshape(-1, n), n).reshape(*shape, n, n)


def _parents_to_matrix(parent, child, n):
    """``(W, n, n)`` boolean, T[w, parent[w, j], j] = child[w, j]."""
    T = torch.zeros(*parent.shape, n, dtype=torch.bool, device=parent.device)
    T.scatter_(-1, parent.unsqueeze(-1), child.unsqueeze(-1))
    return T.transpose(-1, -2)


def _sample_conditional(x, valid, nodes, root, lead, exists, generator):
    n = x.shape[-1]
    batch = x.shape[:-2]
    x = x.expand(*lead, *batch, n, n)
    cur = valid.expand(*lead, *batch, n, n).clone()
    eye = torch.eye(n, dtype=torch.bool, device=x.device)
    for j in range(n):
        if j == root:
            continue
        with torch.no_grad():
            mu = solve(x, cur, nodes, root, need_logz=False)[0]
        probs = mu[..., :, j].clamp_min(0).reshape(-1, n)
        here = exists[..., j].reshape(-1)
        # absent nodes: draw a dummy parent (the root) and keep their empty column
        probs = torch.where(here.unsqueeze(-1), probs, eye[root].to(probs.dtype))
        i = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        pick = eye[i].reshape(*cur.shape[:-2], n) & here.reshape(*cur.shape[:-2], 1)
        cur[..., :, j] = cur[..., :, j] & pick
    return cur


#: the arguments after ``generator`` (keyword-only now) in their old positional order, with
#: their defaults
_DEFAULTS: dict[str, Any] = {"tau": 1.0, "mask": None, "lengths": None, "method": "auto"}


def sample_arborescence(w: torch.Tensor, root: int = 0, n_samples: int | None = None,
                        generator: torch.Generator | None = None, *legacy: Any,
                        tau: float | torch.Tensor = 1.0, mask: torch.Tensor | None = None,
                        lengths: torch.Tensor | None = None,
                        method: str = "auto") -> torch.Tensor:
    r"""Exact samples T ~ p(T) ∝ exp(Σ_{(i→j)∈T} w_ij / τ) over arborescences rooted at ``root``.

    Two exact samplers (module docstring): Wilson's loop-erased random walks (expected tr G
    walk steps per sample, G = (I − P̂)⁻¹: O(n²) work for spread-out scores, slow for peaked
    ones) and sequential conditioning on the parents (O(n⁴) per sample whatever the scores),
    both vectorised over samples and graphs.

    Args:
        w: log-potentials, ``w[..., i, j]`` for i → j (diagonal and root column ignored).
        root: the root node, an int in [0, n − 1] (negative values and None are rejected).
        n_samples: if given, a leading dim of that many independent samples.
        generator: a ``torch.Generator`` on ``w``'s device, for reproducibility.
        tau, mask, lengths: as :func:`arborescence_marginals` (keyword-only, as for every
            sampler; by position they work for one release with a ``FutureWarning``).
        method: ``"wilson"``, ``"conditional"`` or ``"auto"`` (Wilson's algorithm when tr G,
            computed by one batched inverse, is at most 25·n for every graph; the
            conditioning otherwise).

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)`` or ``(n_samples, *batch, n, n)``, 0/1 in
    ``w``'s dtype (``T[..., i, j] = 1`` iff parent(j) = i).

    Raises:
        ValueError: as :func:`arborescence_marginals`; ``n_samples < 1``; unknown ``method``.
        WilsonStepLimit: (a RuntimeError) ``method="wilson"`` and the walks did not finish
            within ``2000 + 400·n`` steps (peaked scores: use ``"conditional"`` or ``"auto"``).

    Example::

        >>> T = sample_arborescence(torch.randn(6, 6), n_samples=100,
        ...                         generator=torch.Generator().manual_seed(0))
        >>> T.shape
        torch.Size([100, 6, 6])
    """
    kw = legacy_keywords("sample_arborescence", legacy,
                         dict(tau=tau, mask=mask, lengths=lengths, method=method), _DEFAULTS)
    tau, mask, lengths, method = kw["tau"], kw["mask"], kw["lengths"], kw["method"]
    check_choice(method, SAMPLE_METHODS, "method")
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    if isinstance(w, torch.Tensor) and unreadable(w):   # torch.func: one node (folded)
        return _TreeSample.apply(w, tau, mask, lengths, root, n_samples, generator, method,
                                 False)
    return _sample_eager(w, tau, mask, lengths, root, n_samples, generator, method, False)


def sample_spanning_tree(w: torch.Tensor, n_samples: int | None = None,
                         generator: torch.Generator | None = None, *legacy: Any,
                         tau: float | torch.Tensor = 1.0, mask: torch.Tensor | None = None,
                         lengths: torch.Tensor | None = None,
                         method: str = "auto") -> torch.Tensor:
    r"""Exact samples T ~ p(T) ∝ exp(Σ_{{i,j}∈T} s_ij / τ), s = (w + wᵀ)/2, over spanning trees.

    Samples the arborescence rooted at node 0 of the symmetric graph and forgets the
    orientation (module docstring).

    Args:
        w, tau, mask, lengths: as :func:`spanning_tree_marginals`.
        n_samples, generator, method: as :func:`sample_arborescence` (for Wilson's algorithm:
            the random walk on the weighted graph, Wilson 1996).

    Shape: ``(*batch, n, n)`` -> ``(*batch, n, n)`` or ``(n_samples, *batch, n, n)``, symmetric
    0/1 in ``w``'s dtype.

    Raises:
        ValueError: as :func:`spanning_tree_marginals`; ``n_samples < 1``; unknown ``method``.
        WilsonStepLimit: as :func:`sample_arborescence`.

    Example::

        >>> T = sample_spanning_tree(torch.randn(100, 100), n_samples=64, method="wilson",
        ...                          generator=torch.Generator().manual_seed(0))
        >>> T.shape, int(T[0].sum()) // 2
        (torch.Size([64, 100, 100]), 99)
    """
    kw = legacy_keywords("sample_spanning_tree", legacy,
                         dict(tau=tau, mask=mask, lengths=lengths, method=method), _DEFAULTS)
    tau, mask, lengths, method = kw["tau"], kw["mask"], kw["lengths"], kw["method"]
    check_choice(method, SAMPLE_METHODS, "method")
    if n_samples is not None:
        check_int(n_samples, "n_samples", low=1)
    if isinstance(w, torch.Tensor) and unreadable(w):
        return _TreeSample.apply(w, tau, mask, lengths, None, n_samples, generator, method,
                                 True)
    return _sample_eager(w, tau, mask, lengths, None, n_samples, generator, method, True)


def _sample_eager(w: torch.Tensor, tau: Any, mask: Any, lengths: Any, root: int | None,
                  n_samples: int | None, generator: torch.Generator | None, method: str,
                  undirected: bool) -> torch.Tensor:
    """The samplers on plain tensors (arguments checked but for their values): an
    arborescence rooted at ``root``, or (``undirected``) a spanning tree."""
    s, valid, nodes, root = _prepare(_detached(w), tau, mask, lengths, root, undirected)
    A = _sample(s, valid, nodes, 0 if undirected else root, n_samples, generator, method)
    return (A | A.transpose(-1, -2) if undirected else A).to(w.dtype)


class _TreeSample(torch.autograd.Function):
    """The tree samplers as one node for ``torch.func`` (no gradient): the forward runs eagerly
    on plain tensors, so its data-dependent steps (Wilson's walks, the fallbacks of the solves)
    keep working; under ``vmap`` the vmapped dim is folded into the batch
    (``randomness="different"``) or each problem draws from the same generator state
    (``"same"``), :func:`perturb._vmap.fold_random_vmap`."""

    @staticmethod
    def forward(w, tau, mask, lengths, root, n_samples, generator, method, undirected):
        return _sample_eager(w, tau, mask, lengths, root, n_samples, generator, method,
                             undirected)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output)

    @staticmethod
    def backward(ctx, grad):
        return (None,) * 9

    @staticmethod
    def vmap(info, in_dims, *args):
        return fold_random_vmap(_TreeSample.apply, info, in_dims, args, expand=(0,),
                                broadcast=(1, 2, 3), generator=args[6],
                                out_dim=0 if args[5] is None else 1)
