r"""k-subsets: Z = {z ∈ {0,1}^n : Σz = k} (plain) and correlated k-subsets (adjacent pairs).

conv Z of the plain family is the capped simplex {x ∈ [0,1]^n : Σx = k}. The exact argmax is
top-k; the relaxations are the capped-simplex projections (SquaredNorm, Entropy, BinaryEntropy)
and the marginals of the exponential family q(z) ∝ exp⟨w, z⟩/τ (ExpFamilyEntropy, the default).

Layout (one per structure family, see :mod:`perturb.structured`):

- :mod:`.topk`: :class:`KSubset`, :func:`topk`, :func:`relaxed_topk`, the capped-simplex
  solvers and the registrations;
- :mod:`.dp`: the exponential family: :func:`ksubset_log_partition`, :func:`ksubset_marginals`,
  :func:`sample_ksubset` (log-depth inside–outside tree);
- :mod:`.correlated`: :class:`CorrelatedKSubset` and its exact argmax, log-partition, marginals
  and sampler;
- ``_tree``: the private tensor kernels of :mod:`.dp`.
"""
from perturb.structured.subsets.correlated import (
    CorrelatedKSubset,
    correlated_topk_argmax,
    correlated_topk_log_partition,
    correlated_topk_marginals,
    sample_correlated_topk,
)
from perturb.structured.subsets.dp import ksubset_log_partition, ksubset_marginals, sample_ksubset
from perturb.structured.subsets.ksubsets import KSubset, relaxed_topk, topk

__all__ = ["KSubset", "topk", "relaxed_topk", "ksubset_log_partition", "ksubset_marginals",
           "sample_ksubset",
           "CorrelatedKSubset", "correlated_topk_argmax", "correlated_topk_log_partition",
           "correlated_topk_marginals", "sample_correlated_topk"]
