"""Structured relaxations: permutations (Birkhoff), k-subsets (plain and correlated), spanning
trees, arborescences.

Importing this package registers their solvers with :func:`perturb.register_solver`.
"""
from perturb.structured.subsets.correlated import (
    CorrelatedKSubset,
    correlated_topk_argmax,
    correlated_topk_log_partition,
    correlated_topk_marginals,
    sample_correlated_topk,
)
from perturb.structured.permutations import (
    Permutations,
    SinkhornConvergenceWarning,
    gumbel_sinkhorn,
    matching,
    sinkhorn,
)
from perturb.structured.subsets import (
    KSubset,
    ksubset_log_partition,
    ksubset_marginals,
    relaxed_topk,
    sample_ksubset,
    topk,
)
from perturb.structured.trees import (
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

__all__ = [
    "Permutations", "sinkhorn", "gumbel_sinkhorn", "matching", "SinkhornConvergenceWarning",
    "KSubset", "topk", "relaxed_topk", "ksubset_log_partition", "ksubset_marginals",
    "sample_ksubset",
    "CorrelatedKSubset", "correlated_topk_argmax", "correlated_topk_log_partition",
    "correlated_topk_marginals", "sample_correlated_topk",
    "SpanningTrees", "Arborescences", "spanning_tree_marginals", "spanning_tree_log_partition",
    "max_spanning_tree", "arborescence_marginals", "arborescence_log_partition",
    "max_arborescence", "sample_spanning_tree", "sample_arborescence",
]
