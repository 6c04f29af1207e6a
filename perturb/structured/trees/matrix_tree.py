r"""Matrix-tree theorems: log-partition functions and edge marginals of spanning trees and
arborescences, with an analytic backward for the marginals.

Directed (Tutte; Koo et al. 2007). Let s_ij be the log-potential of the edge i → j and
A_ij = exp(s_ij) (zero for forbidden edges, the diagonal and the edges into the root r). The
in-degree Laplacian is L = diag(1ᵀA) − A, and L̂ is L without the row and column of r. Then

    Z = Σ_{arborescences T rooted at r} Π_{(i→j)∈T} A_ij = det L̂,
    μ_ij = ∂ log Z / ∂ s_ij = A_ij (G_jj − G_ji),

where G is L̂⁻¹ padded with a zero row and column at r (so μ_rj = A_rj G_jj).

Stable scaling. Every arborescence has exactly one edge into each non-root node, so dividing
column j of A by e^{c_j}, c_j = logsumexp_i s_ij, changes Z by the exact factor e^{−Σ c_j}.
With P_ij = exp(s_ij − c_j) (a column-stochastic matrix: the softmax over the parents of j)

    log Z = Σ_{j≠r} c_j + log det(I − P̂),        μ_ij = P_ij (G_jj − G_ji),   G = (I − P̂)⁻¹,

where P̂ is P without row and column r. All entries of P lie in [0, 1]: nothing overflows for
any score scale, and I − P̂ is a column diagonally dominant M-matrix (the fundamental matrix of
the "walk to your parent" Markov chain absorbed at the root).

Undirected (Kirchhoff). A spanning tree corresponds to exactly one arborescence rooted at node 0
of the bidirected graph with symmetric potentials, so log Z_undirected(s) = log Z_directed(s)
and μ_{{i,j}} = μ_{i→j} + μ_{j→i}.

Analytic backward. For ℓ = Σ_ij ḡ_ij μ_ij, with K = ḡ ⊙ P, M = diag(1ᵀK) − Kᵀ and
N = Gᵀ M Gᵀ (from dG = −G dL̂ G),

    ∂ℓ/∂s_ij = P_ij [ ḡ_ij (G_jj − G_ji) − N_jj + N_ij ] = ḡ_ij μ_ij + P_ij (N_ij − N_jj),

with Nᵀ = G (diag(1ᵀK) − K) G: two O(n³) matrix products (μ is saved by the forward) and no
second factorisation (derivation in docs/trees.md). The formulas hold in the scaled variables
because the column scaling is an exact invariance.

Precision. float16/bfloat16/float32 inputs are computed in float64 internally and cast back:
det(I − P̂) is the product of the pivots and the marginals are differences G_jj − G_ji, both of
which lose every digit in float32 once the scores spread over a few units. Even in float64 the
LU path cancels when the best-scoring edges form cycles with much weaker exits (score gaps of a
few tens of units, or small τ): the rounding of the pivots perturbs the exit probabilities of
those near-closed cycles, and μ is accurate to about eps·‖G‖₁ only. Each result is therefore
checked a posteriori (finite, μ in [0, 1], every non-root column of μ summing to 1 within
1e-9/n, positive determinant, and the error estimate 4·max(n, 8)·eps·‖G‖₁ below 1e-8; a few
O(n²) reductions, no host synchronisation) and the failing batch elements are recomputed by
the cycle reduction of :mod:`perturb.structured.trees._elimination` (an LU of every node but one
per cycle of best parents, which is well conditioned and subtraction-free, then a log-space
sum over the arborescences of the few kept nodes; marginals and backward written out, no
autograd), and where that fails its own check too (scores so extreme that the column softmax
underflows where it matters) by the full log-space elimination, exact for any scale but
10–50× slower. Both fallbacks are batched over the failing elements.

Backward modes: ``"analytic"`` (the formula above; once differentiable) and ``"unroll"``
(autograd through the log-space elimination: an independent algorithm, twice differentiable).

References:
    Koo, Globerson, Carreras & Collins, "Structured Prediction Models via the Matrix-Tree
    Theorem", EMNLP 2007. Tutte, "Graph Theory", 1984 (directed matrix-tree theorem).
"""
from __future__ import annotations

import torch

from perturb.backward import resolve_backward, solve_with_backward
from perturb.structured.trees._graph_input import _prepare
from perturb.structured.trees._matrix_tree import MARGINAL_BACKWARDS, log_partition, marginals

__all__ = [
    "spanning_tree_log_partition", "spanning_tree_marginals",
    "arborescence_log_partition", "arborescence_marginals",
]

# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def spanning_tree_log_partition(w: torch.Tensor, tau: float | torch.Tensor = 1.0,
                                mask: torch.Tensor | None = None,
                                lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""log Z = log Σ_T exp(Σ_{{i,j}∈T} s_ij / τ) over the spanning trees T, s = (w + wᵀ)/2.

    Kirchhoff's matrix-tree theorem: Z = det L̂, the Laplacian of the weights exp(s/τ) without
    one row and column; computed stably as in the module docstring (float32 inputs in float64
    internally). Differentiable by autograd: ∂ log Z/∂w_ij = μ_ij / (2τ) for i ≠ j, with μ the
    edge marginals (each undirected edge appears in two entries of ``w``).

    Args:
        w: log-potentials; only the symmetric part (w + wᵀ)/2 is used, the diagonal is ignored.
            ``-inf`` forbids an edge (in either direction forbids it).
        tau: temperature τ > 0 (float or tensor broadcastable to ``(*batch)``).
        mask: optional boolean adjacency, broadcastable to ``w``; False forbids an edge.
        lengths: optional ``(*batch)`` integer sizes: nodes ``>= lengths`` are absent (padding).

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch)``.

    Raises:
        ValueError: non-square or n < 2, NaN/+inf, bad τ/mask/lengths, disconnected graph.

    Example::

        >>> n = 5
        >>> spanning_tree_log_partition(torch.zeros(n, n))   # Cayley: (n−2) log n
        tensor(4.8283)
    """
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, None, True)
    return log_partition(s, valid, nodes, 0)


def spanning_tree_marginals(w: torch.Tensor, tau: float | torch.Tensor = 1.0,
                            mask: torch.Tensor | None = None,
                            lengths: torch.Tensor | None = None,
                            backward: str = "auto") -> torch.Tensor:
    r"""Edge marginals μ_ij = P({i,j} ∈ T) of p(T) ∝ exp(Σ_{{i,j}∈T} s_ij / τ), s = (w + wᵀ)/2.

    μ is the regularized argmax argmax_{x ∈ conv Z} ⟨s, x⟩_△ − τ A*(x) over the spanning-tree
    polytope with the exponential-family entropy, where ⟨s, x⟩_△ = Σ_{i<j} s_ij x_ij counts each
    edge once. Computed by Kirchhoff's theorem through the directed one (module docstring):
    μ_{{i,j}} = μ_{i→j} + μ_{j→i} for arborescences rooted at node 0. O(n³); memory O(n²).

    Args:
        w, tau, mask, lengths: as :func:`spanning_tree_log_partition`.
        backward: ``"auto"`` = ``"analytic"`` (closed-form vector–Jacobian product through
            G = L̂⁻¹), ``"unroll"`` (autograd of autograd through ``slogdet``; a reference) or
            ``"finite_difference"`` (w.r.t. ``w`` only), as for
            :func:`perturb.regularized_argmax`.

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch, n, n)``, symmetric with a zero diagonal; the
    upper triangle sums to n − 1 (to lengths − 1 with ``lengths``).

    Raises:
        ValueError: as :func:`spanning_tree_log_partition`, or an unknown ``backward``.

    Example::

        >>> mu = spanning_tree_marginals(torch.zeros(4, 4))
        >>> mu[0, 1]                     # every edge of K4 is in 8 of its 16 trees
        tensor(0.5000)

    See Also:
        - :func:`perturb.structured.spanning_tree_log_partition`: its log-partition
        - :func:`perturb.structured.max_spanning_tree`: the mode
        - :func:`perturb.structured.sample_spanning_tree`: exact samples
        - :func:`perturb.structured.arborescence_marginals`: the directed counterpart
    """
    mode = resolve_backward(backward, MARGINAL_BACKWARDS, "spanning_tree_marginals")
    if mode == "finite_difference":
        return solve_with_backward(
            lambda v, m: spanning_tree_marginals(v, tau, mask, lengths, m), w, mode,
            MARGINAL_BACKWARDS, event_dim=2, held={"tau": tau})
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, None, True)
    mu = marginals(s, valid, nodes, 0, mode)
    return mu + mu.transpose(-1, -2)


def arborescence_log_partition(w: torch.Tensor, root: int = 0, tau: float | torch.Tensor = 1.0,
                               mask: torch.Tensor | None = None,
                               lengths: torch.Tensor | None = None) -> torch.Tensor:
    r"""log Z = log Σ_T exp(Σ_{(i→j)∈T} w_ij / τ) over the arborescences T rooted at ``root``.

    Tutte's directed matrix-tree theorem (module docstring); float32 inputs are computed in
    float64 internally. Differentiable by autograd; ∂ log Z/∂w = μ/τ.

    Args:
        w: log-potentials, ``w[..., i, j]`` scores the edge i → j; the diagonal and the column
            of the root are ignored; ``-inf`` forbids an edge.
        root: the root node, an int in [0, n − 1] (negative values and None are rejected).
        tau, mask, lengths: as :func:`spanning_tree_log_partition`.

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch)``.

    Raises:
        ValueError: non-square or n < 2, NaN/+inf, bad root/τ/mask/lengths, or some node cannot
            be reached from the root.

    Example::

        >>> n = 4   # n^(n−2) arborescences per root on the complete digraph
        >>> arborescence_log_partition(torch.zeros(n, n)).exp()
        tensor(16.)
    """
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, root, False)
    return log_partition(s, valid, nodes, root)


def arborescence_marginals(w: torch.Tensor, root: int = 0, tau: float | torch.Tensor = 1.0,
                           mask: torch.Tensor | None = None,
                           lengths: torch.Tensor | None = None,
                           backward: str = "auto") -> torch.Tensor:
    r"""Edge marginals μ_ij = P(i → j ∈ T) of p(T) ∝ exp(Σ_{(i→j)∈T} w_ij / τ), T rooted at
    ``root``: μ = ∇_w log Z(w/τ)·τ, the regularized argmax with the exponential-family entropy.

    Computed by μ_ij = P_ij (G_jj − G_ji) (Koo et al. 2007, in the column-softmax scaling of the
    module docstring). O(n³); memory O(n²).

    Args:
        w, root, tau, mask, lengths: as :func:`arborescence_log_partition`.
        backward: ``"auto"`` = ``"analytic"``, ``"unroll"`` (autograd of autograd through
            ``slogdet``) or ``"finite_difference"`` (w.r.t. ``w`` only).

    Shape: ``w``: ``(*batch, n, n)`` -> ``(*batch, n, n)``; zero diagonal and root column, every
    other column sums to 1, the total is n − 1.

    Raises:
        ValueError: as :func:`arborescence_log_partition`, or an unknown ``backward``.

    Example::

        >>> mu = arborescence_marginals(torch.randn(5, 5), root=0)
        >>> round(float(mu.sum()), 4)
        4.0

    See Also:
        - :func:`perturb.structured.arborescence_log_partition`: its log-partition
        - :func:`perturb.structured.max_arborescence`: the mode
        - :func:`perturb.structured.sample_arborescence`: exact samples
        - :func:`perturb.structured.spanning_tree_marginals`: the undirected counterpart
    """
    mode = resolve_backward(backward, MARGINAL_BACKWARDS, "arborescence_marginals")
    if mode == "finite_difference":
        return solve_with_backward(
            lambda v, m: arborescence_marginals(v, root, tau, mask, lengths, m), w, mode,
            MARGINAL_BACKWARDS, event_dim=2, held={"tau": tau})
    s, valid, nodes, root = _prepare(w, tau, mask, lengths, root, False)
    return marginals(s, valid, nodes, root, mode)
