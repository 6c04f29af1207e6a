"""Dynamic graph reconstruction blocks: data against networkx, the KL against quadrature, the
latent graphs' invariants and limits, the decoder's E(2) equivariance, the ELBO's gradients."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch
from networkx.drawing.layout import _fruchterman_reingold
from scipy import integrate, optimize

import perturb
from perturb.latent import (
    GraphLayoutVAE,
    edge_precision_recall,
    force_directed_layout,
    gumbel_kl,
    make_graph_layout,
    random_trees,
)
from perturb.latent.graph_layout import _to_matrix, _to_pairs
from perturb.structured import max_spanning_tree

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# data ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_steps", [1, 10, 20])
def test_layout_matches_networkx_fruchterman_reingold(n_steps):
    data = make_graph_layout(3, 10, n_steps, generator=_gen(n_steps), dtype=F64)
    for b in range(3):
        ref = _fruchterman_reingold(data.adjacency[b].numpy(),
                                    pos=data.trajectories[b, 0].numpy().copy(),
                                    iterations=n_steps, threshold=-1.0)
        np.testing.assert_allclose(data.trajectories[b, -1].numpy(), ref, atol=1e-12)


def test_layout_batched_equals_looped_and_steps_shrink():
    g = _gen(0)
    A = random_trees(4, 7, generator=g, dtype=F64)
    pos = torch.randn(4, 7, 2, generator=g, dtype=F64)
    traj = force_directed_layout(A, pos, 6)
    assert traj.shape == (4, 7, 7, 2) and torch.equal(traj[:, 0], pos)
    for b in range(4):
        torch.testing.assert_close(force_directed_layout(A[b], pos[b], 6), traj[b])
    # every vertex moves by exactly t_s = t_0 (1 − s/(T+1)) (the net force is never tiny here)
    step = (traj[:, 1:] - traj[:, :-1]).norm(dim=-1)
    t0 = 0.1 * (pos.amax(-2) - pos.amin(-2)).amax(-1)
    want = t0[:, None] * (1 - torch.arange(6, dtype=F64) / 7)
    torch.testing.assert_close(step, want[..., None].expand_as(step))


def test_random_trees_are_kruskal_trees_of_gumbel_weights():
    n, E = 8, 28
    A = random_trees(5, n, generator=_gen(3), dtype=F64)
    w = perturb.perturb(torch.zeros(5, E, dtype=F64), generator=_gen(3))   # the same draws
    i, j = torch.triu_indices(n, n, 1)
    for b in range(5):
        G = nx.Graph()
        G.add_weighted_edges_from((int(u), int(v), float(x)) for u, v, x in zip(i, j, w[b]))
        T = nx.maximum_spanning_tree(G, algorithm="kruskal")
        want = torch.zeros(n, n, dtype=F64)
        for u, v in T.edges:
            want[u, v] = want[v, u] = 1
        assert torch.equal(A[b], want)


def test_random_trees_edge_frequency_is_uniform():
    # by exchangeability of i.i.d. weights each pair is an edge with probability (n − 1)/E = 2/n
    n, N = 5, 4000
    freq = _to_pairs(random_trees(N, n, generator=_gen(1), dtype=F64)).mean(0)
    se = math.sqrt(0.4 * 0.6 / N)
    assert (freq - 0.4).abs().max() < 5 * se


# KL --------------------------------------------------------------------------------------------

def _gumbel_logpdf(x, mu):
    z = x - mu
    return -z - np.exp(-z)


@pytest.mark.parametrize("theta", [-2.0, -0.3, 0.0, 1.5, 4.0])
def test_gumbel_kl_matches_quadrature(theta):
    kl, _ = integrate.quad(lambda x: np.exp(_gumbel_logpdf(x, theta))
                           * (_gumbel_logpdf(x, theta) - _gumbel_logpdf(x, 0.0)), -30, 60,
                           limit=200)
    got = gumbel_kl(torch.tensor([theta], dtype=F64), shift_invariant=False)
    assert abs(got.item() - kl) < 1e-8


def test_shift_minimised_gumbel_kl_is_the_minimum_over_shifts():
    theta = torch.randn(4, 6, generator=_gen(2), dtype=F64) * 2
    got = gumbel_kl(theta)
    for b in range(4):
        res = optimize.minimize_scalar(
            lambda c: gumbel_kl(theta[b] - c, shift_invariant=False).item())
        assert abs(got[b].item() - res.fun) < 1e-7
    assert torch.all(got <= gumbel_kl(theta, shift_invariant=False) + 1e-12)
    assert gumbel_kl(torch.full((3,), 1.7, dtype=F64)).abs().item() < 1e-12


# metrics ---------------------------------------------------------------------------------------

def test_edge_precision_recall_counts():
    truth = _to_matrix(torch.tensor([[1., 1, 0, 0, 0, 1]], dtype=F64), 4)
    est = _to_matrix(torch.tensor([[1., 0, 1, 1, 0, 1]], dtype=F64), 4)
    p, r = edge_precision_recall(est, truth)
    assert p.item() == pytest.approx(2 / 4) and r.item() == pytest.approx(2 / 3)
    p, r = edge_precision_recall(torch.zeros_like(est), truth)
    assert p.item() == 0 and r.item() == 0


# model -----------------------------------------------------------------------------------------

def _model(latent, **kw):
    torch.manual_seed(0)
    return GraphLayoutVAE(6, latent, hidden=8, n_steps=3, **kw).double()


def _traj(B=5, n=6, T=3, seed=0):
    return make_graph_layout(B, n, T, generator=_gen(seed), dtype=F64).trajectories


@pytest.mark.parametrize("latent", ["tree", "independent", "topk"])
def test_relaxed_graphs_are_in_the_right_polytope(latent):
    m = _model(latent)
    theta = m.edge_scores(_traj())
    X = m.sample_graph(theta, generator=_gen(1))
    assert X.shape == (5, 6, 6)
    torch.testing.assert_close(X, X.transpose(-1, -2))
    assert torch.all(X.diagonal(dim1=-2, dim2=-1) == 0) and X.min() >= 0 and X.max() <= 1
    if latent != "independent":
        torch.testing.assert_close(_to_pairs(X).sum(-1), torch.full((5,), 5.0, dtype=F64))


def test_tree_relaxation_tends_to_the_perturbed_max_spanning_tree():
    m = _model("tree", tau=1e-6)   # far below the gaps between tree scores here
    theta = m.edge_scores(_traj())
    X = m.sample_graph(theta, generator=_gen(4))
    U = perturb.perturb(theta, generator=_gen(4))
    torch.testing.assert_close(X, max_spanning_tree(_to_matrix(U, 6)), atol=1e-6, rtol=0)


def test_independent_edges_hard_frequency_is_sigmoid():
    # the binary Concrete's zero-temperature limit is Bernoulli(σ(θ))
    m = _model("independent", hard=True)
    theta = torch.linspace(-2, 2, 15, dtype=F64).expand(20000, 15)
    freq = _to_pairs(m.sample_graph(theta, generator=_gen(5))).mean(0)
    se = (torch.sigmoid(theta[0]) * torch.sigmoid(-theta[0]) / 20000).sqrt()
    assert torch.all((freq - torch.sigmoid(theta[0])).abs() < 5 * se)


@pytest.mark.parametrize("latent", ["tree", "independent", "topk"])
def test_hard_graphs_are_exact_and_pass_gradients(latent):
    m = _model(latent, hard=True)
    theta = m.edge_scores(_traj()).detach().requires_grad_()
    X = m.sample_graph(theta, generator=_gen(6))
    torch.testing.assert_close(X, X.round(), atol=1e-12, rtol=0)   # ST: 0/1 up to rounding
    X = X.round()
    if latent == "tree":
        assert all(nx.is_tree(nx.from_numpy_array(x.numpy())) for x in X.detach())
    if latent == "topk":
        assert torch.all(_to_pairs(X).sum(-1) == 5)
    X = m.sample_graph(theta, generator=_gen(6))
    (X * torch.randn(X.shape, generator=_gen(7), dtype=F64)).sum().backward()
    assert theta.grad is not None and theta.grad.abs().sum() > 0


@pytest.mark.parametrize("latent", ["tree", "independent", "topk"])
def test_mode(latent):
    m = _model(latent)
    theta = torch.randn(5, 15, generator=_gen(8), dtype=F64)
    Z = m.mode(theta)
    if latent == "tree":
        assert torch.equal(Z, max_spanning_tree(_to_matrix(theta, 6)))
    elif latent == "topk":
        assert torch.all(_to_pairs(Z).sum(-1) == 5)
        assert torch.all(_to_pairs(Z)[theta > theta.sort(-1).values[:, -6:-5]] == 1)
    else:
        assert torch.equal(_to_pairs(Z), (theta > 0).to(F64))


@pytest.mark.parametrize("R", [[[0., -1.], [1., 0.]], [[1., 0.], [0., -1.]], [[0., 1.], [1., 0.]]])
def test_decoder_is_equivariant(R):
    # translations and the symmetries of the square (the layout's step length t_0 depends on
    # the bounding box of x_0, so only these isometries leave the true dynamics equivariant)
    m = _model("tree")
    traj = _traj()
    graph = m.sample_graph(m.edge_scores(traj), generator=_gen(9))
    R = torch.tensor(R, dtype=F64)
    shift = torch.tensor([3.0, -1.0], dtype=F64)
    out = m.decode(traj, graph)
    torch.testing.assert_close(m.decode(traj @ R.T + shift, graph), out @ R.T + shift)
    A = random_trees(2, 6, generator=_gen(2), dtype=F64)
    sim = force_directed_layout(A, traj[:2, 0], 3)
    torch.testing.assert_close(force_directed_layout(A, traj[:2, 0] @ R.T + shift, 3),
                               sim @ R.T + shift)


@pytest.mark.parametrize("latent", ["tree", "independent", "topk"])
def test_elbo_parts_gradients_and_reproducibility(latent):
    m = _model(latent)
    traj = _traj()
    r = m.elbo(traj, generator=_gen(10))
    assert r.elbo.shape == (5,) and torch.isfinite(r.elbo).all()
    torch.testing.assert_close(r.elbo, r.log_likelihood - r.kl)
    assert torch.all(r.kl >= 0)
    r.elbo.sum().backward()
    for name in ("edge2", "force_edge", "force_all", "node1"):
        grads = [p.grad for p in getattr(m, name).parameters()]
        assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0, name
    again = m.elbo(traj, generator=_gen(10))
    assert torch.equal(again.elbo, r.elbo.detach())


def test_bad_trajectory_shape():
    m = _model("tree")
    with pytest.raises(ValueError, match="traj"):
        m.elbo(_traj(T=4))
