"""Former location of the correlated k-subsets: :mod:`perturb.structured.subsets.correlated`.

Kept so that ``perturb.structured.correlated_topk`` imports keep working.
"""
from perturb.structured.subsets.correlated import (
    CorrelatedKSubset,
    correlated_topk_argmax,
    correlated_topk_log_partition,
    correlated_topk_marginals,
    sample_correlated_topk,
)

__all__ = ["CorrelatedKSubset", "correlated_topk_argmax", "correlated_topk_log_partition",
           "correlated_topk_marginals", "sample_correlated_topk"]
