r"""Gibbs distributions over spanning trees and arborescences (matrix-tree theorems).

Thin :class:`~perturb.distributions.GibbsDistribution` subclasses over the tree solvers of
:mod:`perturb.structured`: log Z by Kirchhoff's / Tutte's theorem, edge marginals (Koo et al.
2007), exact samplers (Wilson's algorithm or sequential conditioning), and the maximum tree
(Prim) or arborescence (Chu-Liu/Edmonds) as the mode. Log-potentials ``w`` are ``(*batch, n, n)``;
``-inf`` forbids an edge.

- Undirected: p(T) ∝ exp(Σ_{{i,j}∈T} s_ij), s = (w + wᵀ)/2, T a symmetric 0/1 adjacency with
  zero diagonal; ⟨w, T⟩_Z = ½ Σ_{i≠j} w_ij T_ij counts each edge once.
- Directed: p(T) ∝ exp(Σ_{(i→j)∈T} w_ij), T[i, j] = 1 iff i is the parent of j, rooted at
  ``root``; the diagonal and the root's column of ``w`` are ignored.
"""
from __future__ import annotations

import torch

from perturb.distributions.constraints import log_potential
from perturb.distributions.gibbs import (
    GibbsDistribution,
    _masked_score,
    _resolve_validate,
    _scores_argument,
    _validate_with,
)
from perturb.structured import (
    Arborescences,
    SpanningTrees,
    arborescence_log_partition,
    arborescence_marginals,
    max_arborescence,
    max_spanning_tree,
    sample_arborescence,
    sample_spanning_tree,
    spanning_tree_log_partition,
    spanning_tree_marginals,
)

__all__ = ["SpanningTreeDistribution", "ArborescenceDistribution"]


def _allowed(n: int, root: int | None, device: torch.device) -> torch.Tensor:
    """``(n, n)`` booleans: the entries a tree can use (no loop; no edge into ``root``)."""
    allowed = ~torch.eye(n, dtype=torch.bool, device=device)
    if root is not None:
        allowed[:, root] = False
    return allowed


class SpanningTreeDistribution(GibbsDistribution):
    r"""p(T) = exp(Σ_{{i,j}∈T} s_ij − log Z) over the spanning trees of K_n, s = (w + wᵀ)/2.

    ``partition`` = log Z by Kirchhoff's matrix-tree theorem; ``marginals[i, j]`` = P({i,j} ∈ T)
    (symmetric, zero diagonal, the upper triangle sums to n − 1); ``mode`` the maximum spanning
    tree; ``sample`` exact. O(n³) per graph for ``partition``/``marginals``.

    Args:
        logits: edge scores ``w`` (log-potentials; ``log_potentials=`` is the former name, with
            a ``FutureWarning``); only the symmetric part is used, the diagonal is ignored,
            ``-inf`` (in either direction) forbids an edge. The allowed edges must connect the
            graph.
        validate_args: torch.distributions validation: values (no NaN or +inf) at construction,
            the support in ``log_prob``. Shapes (square, n ≥ 2) are always checked.

    Shape: ``(*batch, n, n)``; ``batch_shape = (*batch)``, ``event_shape = (n, n)``.

    Raises:
        ValueError: non-square, n < 2, non-floating; (validating) NaN/+inf; a disconnected
            graph (when ``partition``, ``marginals``, ``sample`` or ``mode`` is computed).

    Example::

        >>> d = SpanningTreeDistribution(torch.zeros(4, 4))   # uniform over the 16 trees
        >>> d.partition.exp(), d.entropy().exp()
        (tensor(16.), tensor(16.))
    """

    arg_constraints = {"logits": log_potential}
    logits: torch.Tensor

    def __init__(self, logits: torch.Tensor | None = None, validate_args: bool | None = None,
                 *, log_potentials: torch.Tensor | None = None):
        logits = _scores_argument("SpanningTreeDistribution", logits, "log_potentials",
                                  log_potentials)
        validate = _resolve_validate(validate_args)
        structure = SpanningTrees()
        _validate_with(structure, logits, "logits", validate)
        super().__init__(logits, structure, validate_args=validate)

    def _log_partition(self) -> torch.Tensor:
        return spanning_tree_log_partition(self.logits)

    def _marginals(self) -> torch.Tensor:
        return spanning_tree_marginals(self.logits)

    def _sample(self, n_samples: int | None, generator: torch.Generator | None) -> torch.Tensor:
        return sample_spanning_tree(self.logits, n_samples=n_samples, generator=generator)

    def _score_of(self, theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return 0.5 * _masked_score(theta, z, _allowed(theta.shape[-1], None, theta.device), 2)

    def _argmax_of(self, theta: torch.Tensor) -> torch.Tensor:
        return max_spanning_tree(theta)

    def _items(self, z: torch.Tensor) -> torch.Tensor:
        return torch.triu(z, diagonal=1).flatten(-2) != 0      # each edge once

    def _spread(self, mask: torch.Tensor) -> torch.Tensor:
        n = self.event_shape[-1]
        m = mask.reshape(*mask.shape[:-1], n, n)
        return (m | m.transpose(-1, -2)).flatten(-2)


class ArborescenceDistribution(GibbsDistribution):
    r"""p(T) = exp(Σ_{(i→j)∈T} w_ij − log Z) over the arborescences rooted at ``root``.

    ``partition`` = log Z by Tutte's directed matrix-tree theorem; ``marginals[i, j]`` =
    P(i → j ∈ T) (every non-root column sums to 1); ``mode`` the maximum arborescence
    (Chu-Liu/Edmonds, NumPy on the CPU); ``sample`` exact. ``T[..., i, j] = 1`` iff i is the
    parent of j.

    Args:
        logits: ``w[..., i, j]`` scores the edge i → j (log-potentials; ``log_potentials=`` is
            the former name, with a ``FutureWarning``); the diagonal and the root's column are
            ignored; ``-inf`` forbids an edge. Every node must be reachable from the root
            along allowed edges.
        root: the root node, an int in [0, n − 1].
        validate_args: as :class:`SpanningTreeDistribution`.

    Shape: ``(*batch, n, n)``; ``batch_shape = (*batch)``, ``event_shape = (n, n)``.

    Raises:
        ValueError: non-square, n < 2, non-floating, root outside [0, n − 1]; (validating)
            NaN/+inf; a node unreachable from the root (when computing).

    Example::

        >>> d = ArborescenceDistribution(torch.zeros(4, 4), root=0)   # 4^2 = 16 arborescences
        >>> d.partition.exp()
        tensor(16.)
    """

    arg_constraints = {"logits": log_potential}
    logits: torch.Tensor

    def __init__(self, logits: torch.Tensor | None = None, root: int = 0,
                 validate_args: bool | None = None, *,
                 log_potentials: torch.Tensor | None = None):
        logits = _scores_argument("ArborescenceDistribution", logits, "log_potentials",
                                  log_potentials)
        validate = _resolve_validate(validate_args)
        structure = Arborescences(root)
        _validate_with(structure, logits, "logits", validate)
        self.root = structure.root
        super().__init__(logits, structure, validate_args=validate)

    def _log_partition(self) -> torch.Tensor:
        return arborescence_log_partition(self.logits, root=self.root)

    def _marginals(self) -> torch.Tensor:
        return arborescence_marginals(self.logits, root=self.root)

    def _sample(self, n_samples: int | None, generator: torch.Generator | None) -> torch.Tensor:
        return sample_arborescence(self.logits, root=self.root, n_samples=n_samples,
                                   generator=generator)

    def _score_of(self, theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return _masked_score(theta, z, _allowed(theta.shape[-1], self.root, theta.device), 2)

    def _argmax_of(self, theta: torch.Tensor) -> torch.Tensor:
        return max_arborescence(theta, root=self.root)

    def _repr_extra(self) -> str:
        return f"root={self.root}"
