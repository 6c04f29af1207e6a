"""torch.distributions objects over structures (see docs/distributions.md).

- :class:`PerturbedStructure`: the perturbed argmax of any structure (``sample``; ``rsample``
  the same law with the relaxation's straight-through gradient), with exact
  ``log_prob``/``entropy``/``marginals`` where they exist;
  :class:`RelaxedPerturbedStructure`: the relaxed sample as its own law, with the Concrete and
  Gaussian-softmax densities.
- :class:`GibbsDistribution` and its exact families p(z) ∝ exp⟨θ, z⟩:
  :class:`KSubsetDistribution`, :class:`SpanningTreeDistribution`,
  :class:`ArborescenceDistribution` (``partition``, ``marginals``, ``mode``, exact ``sample``,
  ``log_prob``, ``entropy``, ``cross_entropy``).
- KL divergences registered with ``torch.distributions.kl_divergence``
  (:mod:`perturb.distributions.kl`).
"""
from perturb.distributions import constraints
from perturb.distributions.gibbs import GibbsDistribution
from perturb.distributions.perturbed import PerturbedStructure
from perturb.distributions.relaxed import RelaxedPerturbedStructure
from perturb.distributions.subsets import KSubsetDistribution
from perturb.distributions.trees import ArborescenceDistribution, SpanningTreeDistribution
from perturb.distributions import kl  # noqa: E402  (registers the KL divergences)

__all__ = [
    "PerturbedStructure", "RelaxedPerturbedStructure", "GibbsDistribution", "KSubsetDistribution",
    "SpanningTreeDistribution", "ArborescenceDistribution",
]
