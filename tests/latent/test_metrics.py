"""Tests of perturb/latent/metrics.py."""
import numpy as np
import pytest
import scipy.stats
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


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_correlations_are_scale_free_at_extreme_magnitudes(scale, method):
    """Scores of magnitude 1e30 (or 1e-30) in float32 give the correlations of the unit-scale
    data (the sums of squares overflowed: inf / inf = NaN), against numpy in float64."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200, 3, generator=g)
    b = torch.randn(200, 2, generator=g) + a[:, :2]
    got = correlation_matrix(a * scale, b * scale, method)
    if method == "pearson":
        want = np.corrcoef(a.double().numpy().T, b.double().numpy().T)[:3, 3:]
    else:
        want = scipy.stats.spearmanr(a.numpy(), b.numpy()).statistic[:3, 3:]
    assert bool(torch.isfinite(got).all())
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
