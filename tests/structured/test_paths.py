"""perturb/structured/paths.py: DAGPaths against brute-force enumeration of all 2^(n−2) paths
(argmax, log-partition, marginals), the longest path against networkx, the log-partition and
marginals against pytorch-struct's SemiMarkov CRF with one label (the same model), the two
computations of the marginals against each other, float64 gradcheck, the ignored entries,
extremes, torch.func.

The shared tests (contract, extremes, reproducibility, precision, default gradients) pick the
structure up through its spec in tests/_specs.py.
"""
import itertools
import math

import networkx as nx
import pytest
import torch
from torch.func import vmap

import perturb
from perturb import ExpFamilyEntropy, regularized_argmax
from perturb.structured import DAGPaths, dag_path_log_partition
from perturb.structured.paths import _log_partition, _longest_path, _marginals

D = torch.float64
PATHS = DAGPaths()


def _paths_by_hand(n):
    """Every path as a node list, by choosing the interior nodes (independent of enumerate)."""
    out = []
    for r in range(n - 1):
        for inner in itertools.combinations(range(1, n - 1), r):
            out.append([0, *inner, n - 1])
    return out


def _matrix(nodes, n):
    z = torch.zeros(n, n, dtype=D)
    for i, j in zip(nodes, nodes[1:]):
        z[i, j] = 1
    return z


def _brute(w, tau=1.0):
    """(log Z, μ, max score) by enumerating every path; τ a float or one per problem."""
    n = w.shape[-1]
    z = torch.stack([_matrix(p, n) for p in _paths_by_hand(n)])
    t = torch.as_tensor(tau, dtype=D).reshape(*torch.as_tensor(tau).shape, 1)
    scores = (w.unsqueeze(-3) * z).sum((-1, -2))                       # (*batch, N)
    q = torch.softmax(scores / t, -1)
    return (torch.logsumexp(scores / t, -1), (q[..., None, None] * z).sum(-3),
            scores.amax(-1))


# --------------------------------------------------------------------------------------------
# enumeration and membership
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_enumerate_is_every_path_once(n):
    z = PATHS.enumerate(n, dtype=D)
    assert z.shape == (2 ** (n - 2), n, n) and z.dtype == D
    got = sorted(tuple(v.flatten().tolist()) for v in z)
    want = sorted(tuple(_matrix(p, n).flatten().tolist()) for p in _paths_by_hand(n))
    assert got == want
    assert PATHS.check(z).all()


def test_enumerate_refuses_bad_sizes():
    for n in (1, 17, 2.0, True):
        with pytest.raises(ValueError, match="n must be an int"):
            PATHS.enumerate(n)
    with pytest.raises(ValueError, match="device"):
        PATHS.enumerate(4, device="no-such-device")


def test_check_rejects_what_is_not_a_path():
    n = 5
    path = _matrix([0, 2, 4], n)
    assert PATHS.check(path)
    bad = {
        "not 0/1": path * 0.5,
        "edge below the diagonal": path + _matrix([3, 1], n),
        "a loop on the diagonal": path + torch.eye(n, dtype=D) * (torch.arange(n) == 1),
        "starts after the source": _matrix([1, 2, 4], n),
        "stops before the sink": _matrix([0, 2, 3], n),
        "two paths": _matrix([0, 2, 4], n) + _matrix([0, 1, 3, 4], n),
        "a broken path": _matrix([0, 1], n) + _matrix([2, 4], n),
        "empty": torch.zeros(n, n, dtype=D),
    }
    for what, y in bad.items():
        assert not PATHS.check(y), what
    batch = torch.stack([path, bad["two paths"]])
    assert PATHS.check(batch).tolist() == [True, False]


# --------------------------------------------------------------------------------------------
# the exact argmax
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_argmax_is_brute_force(n, generator):
    w = torch.randn(4, 3, n, n, dtype=D, generator=generator)
    ties = torch.randint(-1, 2, (4, n, n), generator=generator).to(D)   # many equal paths
    for scores in (w, ties):
        y = perturb.argmax(scores, PATHS)
        assert y.shape == scores.shape and y.dtype == D and PATHS.check(y).all()
        torch.testing.assert_close((scores * y).sum((-1, -2)), _brute(scores)[2])


def test_argmax_breaks_ties_to_the_lowest_predecessor():
    # all paths score 0: backtracking from the sink picks predecessor 0, the direct edge
    assert torch.equal(perturb.argmax(torch.zeros(5, 5), PATHS), _matrix([0, 4], 5).float())
    # 0 -> 1 -> 3 and 0 -> 2 -> 3 both score 1: node 3 takes its lowest best predecessor, 1
    w = torch.zeros(4, 4)
    w[0, 1] = w[0, 2] = 1
    w[0, 3] = -1
    assert torch.equal(perturb.argmax(w, PATHS), _matrix([0, 1, 3], 4).float())


@pytest.mark.parametrize("n", [12, 30, 60])
def test_argmax_is_networkx_longest_path(n, generator):
    """networkx's longest path may start and end anywhere: a bonus M larger than every path's
    score on the edges out of the source and into the sink (every source-to-sink path has one
    of each) makes its longest path the source-to-sink one."""
    w = torch.randn(3, n, n, dtype=D, generator=generator)
    y = perturb.argmax(w, PATHS)
    for b in range(3):
        bonus = 4 * float(w[b].abs().sum())
        G = nx.DiGraph()
        for i in range(n):
            for j in range(i + 1, n):
                G.add_edge(i, j, weight=float(w[b, i, j]) + bonus * ((i == 0) + (j == n - 1)))
        nodes = nx.dag_longest_path(G)
        assert nodes[0] == 0 and nodes[-1] == n - 1
        assert torch.equal(y[b], _matrix(nodes, n))     # continuous scores: no ties


def test_argmax_keeps_dtype_device_and_half_precision():
    w = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        y = PATHS.argmax(w.to(dtype))
        assert y.dtype == dtype and PATHS.check(y).all()
    assert PATHS.argmax(torch.zeros(0, 4, 4)).shape == (0, 4, 4)


# --------------------------------------------------------------------------------------------
# log-partition and marginals
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 7, 9])
def test_log_partition_and_marginals_are_brute_force(n, generator):
    w = torch.randn(2, 3, n, n, dtype=D, generator=generator)
    tau = 0.3 + torch.rand(2, 3, dtype=D, generator=generator)          # one τ per problem
    log_z, mu, _ = _brute(w, tau)
    torch.testing.assert_close(dag_path_log_partition(w, tau=tau), log_z, rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(regularized_argmax(w, PATHS, tau=tau), mu, rtol=1e-11,
                               atol=1e-12)
    torch.testing.assert_close(dag_path_log_partition(w, tau=0.7), _brute(w, 0.7)[0],
                               rtol=1e-12, atol=1e-12)


def test_counting_paths():
    """Zero scores: Z = 2^(n−2); node v is visited with probability 1/2 (P(v on the path))."""
    for n in (2, 5, 40):
        torch.testing.assert_close(dag_path_log_partition(torch.zeros(n, n, dtype=D)),
                                   torch.tensor(n - 2.0, dtype=D).mul(math.log(2)))
        mu = regularized_argmax(torch.zeros(n, n, dtype=D), PATHS)
        visits = mu.sum(-2)[1:-1]
        torch.testing.assert_close(visits, torch.full_like(visits, 0.5))


def _semimarkov(w):
    """The same model as pytorch-struct's SemiMarkov CRF with one label: position i, a segment
    of length k is the edge i -> i + k (impossible segments get a very low score)."""
    n = w.shape[-1]
    edge = torch.full((w.shape[0], n - 1, n, 1, 1), -1e9, dtype=w.dtype)
    i, j = torch.triu_indices(n, n, 1)
    edge[:, i, j - i, 0, 0] = w[:, i, j]
    return edge, (i, j)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_against_pytorch_struct_semimarkov(n, generator):
    torch_struct = pytest.importorskip("torch_struct")
    w = torch.randn(3, n, n, dtype=D, generator=generator)
    edge, (i, j) = _semimarkov(w)
    model = torch_struct.SemiMarkov()
    log_z = model.logpartition(edge.clone())
    log_z = log_z[0] if isinstance(log_z, tuple) else log_z
    torch.testing.assert_close(dag_path_log_partition(w), log_z.reshape(-1), rtol=1e-12,
                               atol=1e-12)
    mu = regularized_argmax(w, PATHS)
    theirs = model.marginals(edge.clone())[:, i, j - i, 0, 0]
    torch.testing.assert_close(mu[:, i, j], theirs, rtol=1e-10, atol=1e-12)


def test_markov_chain_marginals_equal_the_gradient_of_the_log_partition(generator):
    """Two algorithms: μ by the chain (the solver) and τ ∇_w log Z by autograd of the DP."""
    w = torch.randn(4, 11, 11, dtype=D, generator=generator, requires_grad=True)
    (grad,) = torch.autograd.grad(dag_path_log_partition(w, tau=0.4).sum(), w)
    torch.testing.assert_close(regularized_argmax(w, PATHS, tau=0.4), 0.4 * grad, rtol=1e-12,
                               atol=1e-13)


def test_gradcheck():
    w = torch.randn(2, 5, 5, dtype=D, generator=torch.Generator().manual_seed(3),
                    requires_grad=True)
    tau = torch.tensor([0.6, 1.3], dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, t: regularized_argmax(w, PATHS, tau=t), (w, tau))
    assert torch.autograd.gradgradcheck(lambda w: _marginals(w), (w,))
    assert torch.autograd.gradcheck(lambda w, t: dag_path_log_partition(w, tau=t), (w, tau))


def test_jacobian_is_the_covariance(generator):
    """∂μ/∂s = Cov_q(z) by enumeration (n = 5, 8 paths)."""
    n = 5
    s = torch.randn(n, n, dtype=D, generator=generator)
    z = PATHS.enumerate(n, dtype=D).flatten(1)
    q = torch.softmax(z @ s.flatten(), 0)
    mean = q @ z
    cov = (q[:, None] * z).T @ z - torch.outer(mean, mean)
    jac = torch.autograd.functional.jacobian(_marginals, s).reshape(n * n, n * n)
    torch.testing.assert_close(jac, cov, rtol=1e-10, atol=1e-12)


def test_entries_on_and_below_the_diagonal_are_ignored(generator):
    n = 6
    w = torch.randn(3, n, n, dtype=D, generator=generator)
    other = w + torch.randn(3, n, n, dtype=D, generator=generator).tril() * 100
    for fn in (lambda v: regularized_argmax(v, PATHS, tau=0.5),
               lambda v: dag_path_log_partition(v, tau=0.5),
               lambda v: perturb.argmax(v, PATHS)):
        torch.testing.assert_close(fn(other), fn(w), rtol=0, atol=1e-12)
    w.requires_grad_()
    mu = regularized_argmax(w, PATHS, tau=0.5)
    assert (mu.detach().tril() == 0).all()
    c = torch.randn(3, n, n, dtype=D, generator=generator)
    (g,) = torch.autograd.grad((c * mu).sum(), w)
    assert (g.tril() == 0).all() and (g.triu(1) != 0).any()
    (g,) = torch.autograd.grad(dag_path_log_partition(w).sum(), w)
    assert (g.tril() == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_scores_give_the_argmax(dtype, generator):
    """Scores 1e4 at τ = 1e-3 (s up to 1e7, log Z up to 1e9): finite, a valid flow, and the
    exact longest path where it is unique; log Z is the longest path's score / τ."""
    n = 40
    w = (torch.randn(2, n, n, dtype=D, generator=generator) * 1e4).to(dtype).requires_grad_()
    mu = regularized_argmax(w, PATHS, tau=1e-3)
    (g,) = torch.autograd.grad((mu * torch.randn_like(mu)).sum(), w)
    assert torch.isfinite(mu).all() and torch.isfinite(g).all()
    torch.testing.assert_close(mu.detach(), perturb.argmax(w, PATHS), rtol=0, atol=1e-6)
    best = (w.detach().double() * perturb.argmax(w, PATHS).double()).sum((-1, -2)) / 1e-3
    torch.testing.assert_close(dag_path_log_partition(w.detach(), tau=1e-3).double(), best,
                               rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)


def test_relax_hard_and_perturb_and_map():
    theta = torch.randn(4, 7, 7, dtype=D, generator=torch.Generator().manual_seed(5),
                        requires_grad=True)
    gen = torch.Generator().manual_seed(6)
    y = perturb.relax(theta, PATHS, perturb.Gumbel(), tau=0.5, hard=True, generator=gen)
    assert PATHS.check(y.detach()).all()
    (g,) = torch.autograd.grad(y.sum(), theta)
    assert torch.isfinite(g).all() and (g.tril() == 0).all()
    u = perturb.perturb(theta.detach(), perturb.Gumbel(), generator=torch.Generator()
                        .manual_seed(6))
    assert torch.equal(y.detach(), perturb.argmax(u, PATHS))
    assert PATHS.default_regularizer() == ExpFamilyEntropy()


def test_vmap_equals_the_batched_call(generator):
    w = torch.randn(3, 4, 6, 6, dtype=D, generator=generator)
    for fn in (lambda v: regularized_argmax(v, PATHS, tau=0.7),
               lambda v: dag_path_log_partition(v, tau=0.7)):
        torch.testing.assert_close(vmap(fn)(w), fn(w))


def test_engine_functions_are_batch_shaped(generator):
    w = torch.randn(2, 3, 4, 4, dtype=D, generator=generator)
    assert _log_partition(w).shape == (2, 3)
    assert _marginals(w).shape == _longest_path(w).shape == w.shape
    assert regularized_argmax(torch.zeros(0, 4, 4), PATHS).shape == (0, 4, 4)


def test_bad_input():
    for bad, match in ((torch.zeros(1, 1), "w must hold .* n >= 2"),
                       (torch.zeros(3, 0, 0), "w has an empty event")):
        with pytest.raises(ValueError, match=match):
            regularized_argmax(bad, PATHS)
        with pytest.raises(ValueError, match=match):
            dag_path_log_partition(bad)
    with pytest.raises(ValueError, match="square"):
        perturb.argmax(torch.zeros(3, 4), PATHS)
    with pytest.raises(ValueError, match="tau"):
        dag_path_log_partition(torch.zeros(3, 3), tau=0.0)
    with pytest.raises(ValueError, match="w"):
        dag_path_log_partition(torch.full((3, 3), float("nan")))
    for reg in (perturb.Entropy(), perturb.SquaredNorm()):
        with pytest.raises(NotImplementedError, match="DAGPaths"):
            regularized_argmax(torch.zeros(3, 3), PATHS, reg)
