"""Wilson's algorithm against brute-force tree probabilities, the conditioning sampler and the
marginals; the step limit and the choice made by method="auto"."""
import pytest
import torch
from scipy import stats

from perturb.structured.trees.matrix_tree import arborescence_marginals, spanning_tree_marginals
from perturb.structured.trees.sampling import sample_arborescence, sample_spanning_tree
from perturb.structured.trees.structures import (
    enumerate_arborescences,
    enumerate_spanning_trees,
    is_arborescence,
    is_spanning_tree,
)
from perturb.structured.trees._wilson import expected_steps
from perturb.structured.trees.sampling import WilsonStepLimit

D = torch.float64
N_SAMPLES = 20000


def _tree_probs(w, trees, undirected):
    s = 0.5 * (w + w.mT) if undirected else w
    s = s.masked_fill(torch.eye(w.shape[-1], dtype=torch.bool), 0.0)
    scores = (trees * s).sum((-1, -2)) / (2 if undirected else 1)
    return torch.softmax(scores, -1)


def _chi_square_pvalue(samples, trees, probs):
    """Pearson's test of the sampled tree frequencies against the exact probabilities; bins
    with an expected count below 5 are merged into one."""
    flat = samples.flatten(-2)
    codes = (flat.unsqueeze(1) == trees.flatten(-2).unsqueeze(0)).all(-1)
    assert (codes.sum(-1) == 1).all()  # every sample is exactly one of the enumerated trees
    counts = codes.sum(0).to(D)
    expected = probs * samples.shape[0]
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs.numpy(), exp.numpy()).pvalue


@pytest.mark.parametrize("method", ["wilson", "conditional"])
@pytest.mark.parametrize("n,root", [(3, 0), (4, 1), (5, 3)])
def test_arborescence_tree_frequencies_brute_force(method, n, root, generator):
    w = torch.randn(n, n, dtype=D, generator=generator)
    trees = enumerate_arborescences(n, root, dtype=D)
    T = sample_arborescence(w, root=root, n_samples=N_SAMPLES, generator=generator,
                            method=method)
    assert is_arborescence(T, root).all()
    # a seeded test: the threshold 1e-4 is a false alarm rate, not a tolerance to tune
    assert _chi_square_pvalue(T, trees, _tree_probs(w, trees, False)) > 1e-4


@pytest.mark.parametrize("method", ["wilson", "conditional"])
@pytest.mark.parametrize("n", [3, 4, 5])
def test_spanning_tree_frequencies_brute_force(method, n, generator):
    w = torch.randn(n, n, dtype=D, generator=generator)
    trees = enumerate_spanning_trees(n, dtype=D)
    T = sample_spanning_tree(w, n_samples=N_SAMPLES, generator=generator, method=method)
    assert is_spanning_tree(T).all()
    assert _chi_square_pvalue(T, trees, _tree_probs(w, trees, True)) > 1e-4


def _assert_frequencies(samples, mu):
    freq = samples.mean(0)
    se = (mu * (1 - mu) / samples.shape[0]).sqrt()
    # 5 standard errors per entry: a false alarm over a few hundred entries is < 1e-3
    assert ((freq - mu).abs() <= 5 * se + 1e-12).all()


def test_wilson_batched_masked_lengths_tau(generator):
    """Several graphs of different sizes in one batch, a mask and τ: edge frequencies of the
    Wilson samples against the exact marginals, and against the conditioning sampler."""
    n = 7
    w = 1.5 * torch.randn(3, n, n, dtype=D, generator=generator)
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[1, 2] = mask[2, 1] = False
    lengths = torch.tensor([7, 5, 6])
    kw = dict(tau=0.8, mask=mask, lengths=lengths)
    T = sample_spanning_tree(w, n_samples=8000, generator=generator, method="wilson", **kw)
    assert T.shape == (8000, 3, n, n) and (T[..., 1, 2] == 0).all()
    for b, k in enumerate(lengths.tolist()):
        assert is_spanning_tree(T[:, b, :k, :k]).all() and T[:, b, k:].sum() == 0
    mu = spanning_tree_marginals(w, **kw)
    _assert_frequencies(T, mu)
    A = sample_arborescence(w, root=2, n_samples=8000, generator=generator, method="wilson",
                            **kw)
    _assert_frequencies(A, arborescence_marginals(w, root=2, **kw))
    C = sample_arborescence(w, root=2, n_samples=8000, generator=generator,
                            method="conditional", **kw)
    # the two samplers agree: difference of two means, each with the binomial variance
    mu_a = arborescence_marginals(w, root=2, **kw)
    se = (2 * mu_a * (1 - mu_a) / 8000).sqrt()
    assert ((A.mean(0) - C.mean(0)).abs() <= 5 * se + 1e-12).all()


def test_wilson_reproducible_and_dtype():
    w = torch.randn(4, 9, 9)
    a = sample_arborescence(w, root=3, n_samples=5, method="wilson",
                            generator=torch.Generator().manual_seed(3))
    b = sample_arborescence(w, root=3, n_samples=5, method="wilson",
                            generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.dtype == torch.float32 and a.shape == (5, 4, 9, 9)
    assert is_arborescence(a, 3).all()
    single = sample_spanning_tree(w[0], method="wilson", generator=torch.Generator())
    assert single.shape == (9, 9) and is_spanning_tree(single)


def test_expected_steps_is_the_mean_walk_length(generator):
    """tr (I − P̂)⁻¹ (the expected walk steps, used by method="auto") against an explicit
    inverse, and against the closed form for the complete graph with equal weights."""
    n = 6
    w = torch.randn(2, n, n, dtype=D, generator=generator)
    P = torch.softmax(w.masked_fill(torch.eye(n, dtype=torch.bool), -torch.inf), dim=-2)
    P[..., :, 0] = 0  # nothing enters the root
    ref = torch.linalg.inv(torch.eye(n - 1, dtype=D) - P[..., 1:, 1:]).diagonal(
        dim1=-2, dim2=-1).sum(-1)
    torch.testing.assert_close(expected_steps(P, 0), ref)
    # equal weights: Q = (J − I)/(n − 1) on the n − 1 non-root nodes; its eigenvalues are
    # (n − 2)/(n − 1) once and −1/(n − 1) n − 2 times, so
    # tr (I − Q)⁻¹ = (n − 1) + (n − 2)(n − 1)/n
    P = torch.full((n, n), 1.0 / (n - 1), dtype=D).fill_diagonal_(0)
    P[:, 0] = 0
    ref = (n - 1) + (n - 2) * (n - 1) / n
    assert expected_steps(P, 0).item() == pytest.approx(ref, rel=1e-12)


def test_auto_and_step_limit(generator):
    n = 30
    spread = torch.randn(n, n, dtype=D, generator=generator)
    peaked = 60 * spread
    # auto = Wilson for spread-out scores (same draws as method="wilson")
    a = sample_spanning_tree(spread, n_samples=3, generator=torch.Generator().manual_seed(1))
    b = sample_spanning_tree(spread, n_samples=3, method="wilson",
                             generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    # peaked scores: strong 2-cycles trap the walk for ~e^60 steps
    with pytest.raises(WilsonStepLimit, match="conditional"):
        sample_arborescence(peaked, n_samples=2, method="wilson", generator=generator)
    assert issubclass(WilsonStepLimit, RuntimeError)
    # auto takes the conditioning there (same draws as method="conditional")
    a = sample_arborescence(peaked, n_samples=2, generator=torch.Generator().manual_seed(2))
    c = sample_arborescence(peaked, n_samples=2, method="conditional",
                            generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, c) and is_arborescence(a, 0).all()


def test_method_validated():
    with pytest.raises(ValueError, match="method"):
        sample_spanning_tree(torch.zeros(4, 4), method="aldous")
    with pytest.raises(ValueError, match="method"):
        sample_arborescence(torch.zeros(4, 4), method=None)
