"""torch.distributions objects over structures (see docs/distributions.md).

- :class:`PerturbedStructure`: the perturbed argmax of any structure (``sample``), its
  relaxation (``rsample``), with exact ``log_prob``/``entropy``/``marginals`` where they exist.
- :class:`GibbsDistribution` and its exact families p(z) ∝ exp⟨θ, z⟩:
  :class:`KSubsetDistribution`, :class:`SpanningTreeDistribution`,
  :class:`ArborescenceDistribution` (``partition``, ``marginals``, ``mode``, exact ``sample``,
  ``log_prob``, ``entropy``).
"""
from perturb.distributions import constraints
from perturb.distributions.gibbs import GibbsDistribution
from perturb.distributions.perturbed import PerturbedStructure
from perturb.distributions.subsets import KSubsetDistribution
from perturb.distributions.trees import ArborescenceDistribution, SpanningTreeDistribution

__all__ = [
    "PerturbedStructure", "GibbsDistribution", "KSubsetDistribution",
    "SpanningTreeDistribution", "ArborescenceDistribution",
]
