r"""The Gibbs distribution over k-subsets: p(z) ∝ exp⟨logits, z⟩ for z ∈ {0,1}^n, Σz = k.

A thin :class:`~perturb.distributions.GibbsDistribution` over the k-subset solvers of
:mod:`perturb.structured` (log-partition by elementary symmetric polynomials in log space,
marginals by inside–outside, exact top-down sampling, top-k mode). Not Gumbel top-k: that one
samples without replacement (:class:`PerturbedStructure` with ``KSubset(k)`` and Gumbel noise),
a different distribution.
"""
from __future__ import annotations

import torch

from perturb._validation import check_score_shape
from perturb.distributions.constraints import log_potential
from perturb.distributions.gibbs import GibbsDistribution, _masked_score, _resolve_validate
from perturb.structured import KSubset, ksubset_log_partition, ksubset_marginals, sample_ksubset
from perturb.structured.subsets._checks import check_feasible, check_k

__all__ = ["KSubsetDistribution"]


class KSubsetDistribution(GibbsDistribution):
    r"""p(z) = exp(⟨logits, z⟩ − A) over the k-subsets z ∈ {0,1}^n of n items (Σz = k).

    A = log e_k(e^{logits}) (elementary symmetric polynomial); ``marginals[i]`` = P(i ∈ S)
    (summing to k); ``mode`` is the top-k indicator; ``sample`` is exact (conditional Poisson
    sampling through the DP tree: O(nk) tables, then ⌈log₂ n⌉ steps for all samples).
    ``log_prob``/``entropy``/``partition`` are exact and differentiable
    (:mod:`perturb.distributions.gibbs`).

    Args:
        logits: item scores; ``-inf`` masks an item (it is never chosen; each row needs at
            least k entries above ``-inf``).
        k: subset size, 1 ≤ k ≤ n.
        validate_args: torch.distributions validation: the logits' values (no NaN or +inf, ≥ k
            unmasked per row) at construction and the support in ``log_prob``. Shapes and k
            are always checked.

    Shape: ``logits``: ``(*batch, n)``; ``batch_shape = (*batch)``, ``event_shape = (n,)``.

    Raises:
        ValueError: non-floating or non-tensor logits, 0-dim or n = 0, k outside [1, n];
            (validating) NaN/+inf logits, a row with fewer than k unmasked items.

    Example::

        >>> d = KSubsetDistribution(torch.tensor([0.0, 1.0, 2.0, 3.0]), k=2)
        >>> d.mode
        tensor([0., 0., 1., 1.])
        >>> z = d.sample((1000,), generator=torch.Generator().manual_seed(0))
        >>> d.log_prob(z).shape, float(d.marginals.sum())
        (torch.Size([1000]), 2.0)
    """

    arg_constraints = {"logits": log_potential}
    _param = "logits"
    logits: torch.Tensor

    def __init__(self, logits: torch.Tensor, k: int, validate_args: bool | None = None):
        validate = _resolve_validate(validate_args)
        check_score_shape(logits, "logits", min_ndim=1)
        self.k = check_k(k, logits.shape[-1])
        super().__init__(logits, KSubset(self.k), validate_args=validate)
        if validate and logits.numel():
            # each row needs k unmasked items: a finite k-th largest entry (no sync on CUDA)
            kth = torch.topk(logits.detach(), self.k, dim=-1).values[..., -1]
            check_feasible(kth, self.k, "logits")

    def _log_partition(self) -> torch.Tensor:
        return ksubset_log_partition(self.logits, self.k)

    def _marginals(self) -> torch.Tensor:
        return ksubset_marginals(self.logits, self.k)

    def _sample(self, n_samples: int | None, generator: torch.Generator | None) -> torch.Tensor:
        return sample_ksubset(self.logits, self.k, n_samples=n_samples, generator=generator)

    def _score_of(self, theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return _masked_score(theta, z, None, 1)

    def _argmax_of(self, theta: torch.Tensor) -> torch.Tensor:
        # -inf sorts last and each row has >= k unmasked items: the top k are unmasked
        return self.structure.argmax(theta)

    def _repr_extra(self) -> str:
        return f"k={self.k}"
