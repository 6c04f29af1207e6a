"""Exact tree sampling: edge frequencies against marginals (tolerance from the standard error)."""
import pytest
import torch

from perturb.structured.trees.matrix_tree import arborescence_marginals, spanning_tree_marginals
from perturb.structured.trees.sampling import sample_arborescence, sample_spanning_tree
from perturb.structured.trees.structures import is_arborescence, is_spanning_tree

D = torch.float64
N_SAMPLES = 4000


def _assert_frequencies(samples, mu):
    freq = samples.mean(0)
    se = (mu * (1 - mu) / samples.shape[0]).sqrt()
    # 5 standard errors: with ~50 entries the chance of a false alarm is < 1e-4
    assert ((freq - mu).abs() <= 5 * se + 1e-12).all()


def test_sample_arborescence_frequencies(generator):
    w = 1.5 * torch.randn(5, 5, dtype=D, generator=generator)
    T = sample_arborescence(w, root=2, n_samples=N_SAMPLES, generator=generator)
    assert T.shape == (N_SAMPLES, 5, 5) and T.dtype == D
    assert is_arborescence(T, 2).all()
    _assert_frequencies(T, arborescence_marginals(w, root=2))


def test_sample_spanning_tree_frequencies_batched_masked(generator):
    w = 1.5 * torch.randn(2, 5, 5, dtype=D, generator=generator)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[0, 4] = mask[4, 0] = False
    T = sample_spanning_tree(w, n_samples=N_SAMPLES, generator=generator, tau=0.7, mask=mask)
    assert T.shape == (N_SAMPLES, 2, 5, 5)
    assert is_spanning_tree(T).all() and (T[..., 0, 4] == 0).all()
    _assert_frequencies(T, spanning_tree_marginals(w, tau=0.7, mask=mask))


def test_sampling_reproducible_and_lengths(generator):
    w = torch.randn(2, 6, 6)
    a = sample_spanning_tree(w, generator=torch.Generator().manual_seed(3))
    b = sample_spanning_tree(w, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (2, 6, 6)
    T = sample_arborescence(w, root=1, lengths=torch.tensor([3, 6]), generator=generator)
    assert is_arborescence(T[0, :3, :3], 1) and T[0, 3:].sum() == 0 and T[0, :, 3:].sum() == 0
    assert is_arborescence(T[1], 1)
    with pytest.raises(ValueError, match="n_samples"):
        sample_arborescence(w, n_samples=0)
