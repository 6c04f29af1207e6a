r"""Spanning trees and arborescences: structures, exact argmax, marginals, sampling.

Z is the set of spanning trees of the complete graph on n nodes (undirected, as symmetric 0/1
adjacency matrices) or of arborescences rooted at ``root`` (directed: ``T[i, j] = 1`` iff i is
the parent of j). Scores are log-potentials ``w`` of shape ``(*batch, n, n)``:

- undirected: the edge {i, j} scores s_ij with s = (w + wᵀ)/2 (the symmetric part; the diagonal
  is ignored). A tree scores ⟨s, T⟩_△ = Σ_{i<j} s_ij T_ij (each edge once).
- directed: ``w[..., i, j]`` scores the edge i → j; the diagonal and the root's column are
  ignored.

``-inf`` forbids an edge (or pass ``mask``); ``lengths`` gives per-graph sizes in a padded batch.

With the exponential-family entropy (:class:`~perturb.regularizers.ExpFamilyEntropy`, the
default) the regularized argmax of :mod:`perturb.relax` is the vector of edge marginals of the
Gibbs distribution p(T) ∝ exp(⟨w, T⟩/τ), μ = ∇ log Z(w/τ), by the matrix-tree theorems
(:mod:`perturb.structured.trees.matrix_tree`). So ``relax(θ, SpanningTrees(), Gumbel(), tau=0.5)`` is a
stochastic softmax over trees (Paulus et al. 2020) and ``hard=True`` its straight-through
version with the exact maximum tree of the perturbed scores in the forward pass.

References:
    Paulus, Choi, Tarlow, Krause & Maddison, "Gradient Estimation with Stochastic Softmax
    Tricks", NeurIPS 2020, arXiv:2006.08063. Koo et al., EMNLP 2007.
"""
from __future__ import annotations

import torch

from perturb._validation import check_int, check_scores
from perturb.regularizers import ExpFamilyEntropy, Regularizer
from perturb.structured.trees.matrix_tree import (
    arborescence_log_partition,
    arborescence_marginals,
    spanning_tree_log_partition,
    spanning_tree_marginals,
)
from perturb.structured.trees.sampling import sample_arborescence, sample_spanning_tree
from perturb.structured.trees.structures import (
    enumerate_arborescences,
    enumerate_spanning_trees,
    is_arborescence,
    is_spanning_tree,
    max_arborescence,
    max_spanning_tree,
)
from perturb.structures import Structure, register_solver

__all__ = [
    "SpanningTrees", "Arborescences",
    "spanning_tree_log_partition", "spanning_tree_marginals", "max_spanning_tree",
    "sample_spanning_tree",
    "arborescence_log_partition", "arborescence_marginals", "max_arborescence",
    "sample_arborescence",
]


def _validate_graph(w: torch.Tensor, name: str) -> None:
    check_scores(w, name, min_ndim=2, square=True, allow_neg_inf=True)
    if w.shape[-1] < 2:
        raise ValueError(f"{name} must describe a graph with n >= 2 nodes, got shape "
                         f"{tuple(w.shape)}")


class SpanningTrees(Structure):
    r"""Spanning trees of the complete graph on n nodes, as symmetric 0/1 adjacency matrices.

    Shape: scores ``(*batch, n, n)`` (symmetric part used, ``-inf`` forbids an edge); vertices
    ``(*batch, n, n)`` symmetric with n − 1 edges. ``argmax`` is :func:`max_spanning_tree`; the
    default regularizer :class:`~perturb.regularizers.ExpFamilyEntropy` gives the edge marginals
    (:func:`spanning_tree_marginals`).

    Example::

        >>> from perturb import relax
        >>> theta = torch.randn(6, 6, requires_grad=True)
        >>> x = relax(theta, SpanningTrees(), tau=0.5)   # marginals of a perturbed tree
    """

    event_dim = 2
    square = True

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        _validate_graph(w, name)

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return max_spanning_tree(w)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        return is_spanning_tree(y)

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All n^(n−2) trees (Cayley), ``(n^(n−2), n, n)``; n ≤ 8."""
        return enumerate_spanning_trees(n, dtype=dtype, device=device)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()


class Arborescences(Structure):
    r"""Arborescences (directed spanning trees) rooted at ``root``: ``T[i, j] = 1`` iff i → j.

    Shape: scores ``(*batch, n, n)`` (``w[..., i, j]`` scores i → j; the diagonal and the root's
    column are ignored); vertices ``(*batch, n, n)`` with one 1 in every non-root column.
    ``argmax`` is :func:`max_arborescence` (Chu-Liu/Edmonds); the default regularizer gives the
    edge marginals (:func:`arborescence_marginals`).

    Args:
        root: the root node, an int >= 0 (and < n for graphs of n nodes; no wrap-around).
    """

    event_dim = 2
    square = True

    def __init__(self, root: int = 0):
        self.root = check_int(root, "root", low=0)

    def _root(self, n: int) -> int:
        if not self.root < n:
            raise ValueError(f"root={self.root} is out of range for graphs with n={n} nodes")
        return self.root

    def validate(self, w: torch.Tensor, name: str = "w") -> None:
        _validate_graph(w, name)
        self._root(w.shape[-1])

    def argmax(self, w: torch.Tensor) -> torch.Tensor:
        return max_arborescence(w, root=self.root)

    def check(self, y: torch.Tensor) -> torch.Tensor:
        return is_arborescence(y, self._root(y.shape[-1]))

    def enumerate(self, n: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """All n^(n−2) arborescences rooted at ``root``, ``(n^(n−2), n, n)``; n ≤ 8."""
        if isinstance(n, int) and not isinstance(n, bool) and n >= 2:
            root = self._root(n)
        else:
            root = 0
        return enumerate_arborescences(n, root, dtype=dtype, device=device)

    def default_regularizer(self) -> Regularizer:
        return ExpFamilyEntropy()

    def __repr__(self) -> str:
        return f"Arborescences(root={self.root})"


@register_solver(SpanningTrees, ExpFamilyEntropy, backward=("analytic", "unroll"),
                 description="Kirchhoff matrix-tree marginals")
def _solve_spanning_trees(w, structure, regularizer, tau, backward):
    return spanning_tree_marginals(w, tau=tau, backward=backward)


@register_solver(Arborescences, ExpFamilyEntropy, backward=("analytic", "unroll"),
                 description="Tutte directed matrix-tree marginals")
def _solve_arborescences(w, structure, regularizer, tau, backward):
    return arborescence_marginals(w, root=structure.root, tau=tau, backward=backward)
