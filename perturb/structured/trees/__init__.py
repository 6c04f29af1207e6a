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
default) the regularized argmax of :mod:`perturb.core` is the vector of edge marginals of the
Gibbs distribution p(T) ∝ exp(⟨w, T⟩/τ), μ = ∇ log Z(w/τ), by the matrix-tree theorems
(:mod:`.matrix_tree`). So ``relax(θ, SpanningTrees(), Gumbel(), tau=0.5)`` is a
stochastic softmax over trees (Paulus et al. 2020) and ``hard=True`` its straight-through
version with the exact maximum tree of the perturbed scores in the forward pass.

Layout (one per structure family, see :mod:`perturb.structured`):

- :mod:`.structures`: :class:`SpanningTrees`, :class:`Arborescences`, the exact solvers
  (:func:`max_spanning_tree`, :func:`max_arborescence`), membership, enumeration, and the
  registered relaxations;
- :mod:`.matrix_tree`: log-partition functions and edge marginals (matrix-tree theorems);
- :mod:`.sampling`: exact samplers (Wilson's algorithm, sequential conditioning);
- private: ``_graph_input`` (score/mask/length handling shared by all of them),
  ``_matrix_tree`` (the engine of the marginals and log-partitions, on checked tensors),
  ``_elimination`` (log-space elimination, the fallbacks of the marginals), ``_wilson`` (the
  batched random walks).

References:
    Paulus, Choi, Tarlow, Krause & Maddison, "Gradient Estimation with Stochastic Softmax
    Tricks", NeurIPS 2020, arXiv:2006.08063. Koo et al., EMNLP 2007.
"""
from perturb.structured.trees.matrix_tree import (
    arborescence_log_partition,
    arborescence_marginals,
    spanning_tree_log_partition,
    spanning_tree_marginals,
)
from perturb.structured.trees.sampling import (
    WilsonStepLimit,
    sample_arborescence,
    sample_spanning_tree,
)
from perturb.structured.trees.structures import (  # noqa: F401 (is_*, enumerate_*: old paths)
    Arborescences,
    SpanningTrees,
    enumerate_arborescences,
    enumerate_spanning_trees,
    is_arborescence,
    is_spanning_tree,
    max_arborescence,
    max_spanning_tree,
)

__all__ = [
    "SpanningTrees", "Arborescences",
    "spanning_tree_log_partition", "spanning_tree_marginals", "max_spanning_tree",
    "sample_spanning_tree",
    "arborescence_log_partition", "arborescence_marginals", "max_arborescence",
    "sample_arborescence", "WilsonStepLimit",
]
