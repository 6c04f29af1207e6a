"""Tests of perturb/latent/metrics.py."""
import pytest
import torch

from perturb.latent.metrics import correlation_matrix, mean_corr_coef


def test_mcc_is_one_for_permutation_scaling_and_sign(generator):
    s = torch.randn(500, 4, generator=generator, dtype=torch.float64)
    z = s[:, [2, 0, 3, 1]] * torch.tensor([2.0, -0.5, 3.0, -1.0], dtype=torch.float64) + 7.0
    assert mean_corr_coef(s, z).item() == pytest.approx(1.0, abs=1e-12)
    # Spearman is invariant to monotone transforms as well
    assert mean_corr_coef(s, torch.exp(z), method="spearman").item() == pytest.approx(1.0)


def test_mcc_matches_brute_force_over_permutations(generator):
    import itertools
    s = torch.randn(300, 3, generator=generator, dtype=torch.float64)
    z = s @ torch.randn(3, 3, generator=generator, dtype=torch.float64)
    c = correlation_matrix(s, z).abs()
    best = max(sum(c[i, p[i]] for i in range(3)) / 3 for p in itertools.permutations(range(3)))
    assert mean_corr_coef(s, z).item() == pytest.approx(float(best), abs=1e-12)


def test_mcc_independent_latents_is_small(generator):
    s = torch.randn(5000, 3, generator=generator)
    z = torch.randn(5000, 3, generator=generator)
    # |corr| of independent samples is O(1/sqrt(N)) = 0.014; the max over matchings stays small
    assert mean_corr_coef(s, z).item() < 0.06


def test_mcc_extra_latents_and_bad_input(generator):
    s = torch.randn(100, 2, generator=generator)
    z = torch.cat([torch.randn(100, 1, generator=generator), s], 1)
    assert mean_corr_coef(s, z).item() == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="at least as many columns"):
        mean_corr_coef(z, s)
    with pytest.raises(ValueError, match="same N"):
        mean_corr_coef(s, z[:50])
