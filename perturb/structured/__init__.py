"""Structured relaxations, one package per structure family:

- :mod:`.permutations`: permutations (the Birkhoff polytope) and transport plans (the transport
  polytope U(a, b)): Sinkhorn, Hungarian matching, POT's network simplex;
- :mod:`.subsets`: k-subsets (plain and correlated): top-k, capped-simplex projections, the
  exponential-family DP;
- :mod:`.trees`: spanning trees and arborescences: matrix-tree marginals, maximum trees,
  exact samplers;
- :mod:`.paths`: source-to-sink paths in a DAG, the worked example of a one-file structure
  (docs/adding_a_structure.md).

Every family has the same layout: public modules define the public functions and the
:class:`~perturb.Structure` classes (each class beside its exact argmax, with its solver
registrations), private ``_*.py`` modules hold only kernels and helpers, and the family's
``__init__`` re-exports the public names. Importing this package registers the solvers with
:func:`perturb.register_solver`.
"""
from perturb.structured.paths import DAGPaths, dag_path_log_partition
from perturb.structured.permutations import (
    Permutations,
    SinkhornConvergenceWarning,
    Transport,
    gumbel_sinkhorn,
    matching,
    sinkhorn,
)
from perturb.structured.subsets import (
    CorrelatedKSubset,
    KSubset,
    correlated_topk_argmax,
    correlated_topk_log_partition,
    correlated_topk_marginals,
    ksubset_log_partition,
    ksubset_marginals,
    relaxed_topk,
    sample_correlated_topk,
    sample_ksubset,
    topk,
)
from perturb.structured.trees import (
    Arborescences,
    SpanningTrees,
    WilsonStepLimit,
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
    "Permutations", "Transport", "sinkhorn", "gumbel_sinkhorn", "matching",
    "SinkhornConvergenceWarning",
    "KSubset", "topk", "relaxed_topk", "ksubset_log_partition", "ksubset_marginals",
    "sample_ksubset",
    "CorrelatedKSubset", "correlated_topk_argmax", "correlated_topk_log_partition",
    "correlated_topk_marginals", "sample_correlated_topk",
    "SpanningTrees", "Arborescences", "spanning_tree_marginals", "spanning_tree_log_partition",
    "max_spanning_tree", "arborescence_marginals", "arborescence_log_partition",
    "max_arborescence", "sample_spanning_tree", "sample_arborescence", "WilsonStepLimit",
    "DAGPaths", "dag_path_log_partition",
]
