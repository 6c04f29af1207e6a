"""perturb._linalg: LU calls that stay correct where torch's batched CPU LU is not.

With torch.set_num_threads(2) called, torch 2.13's CPU batched LU of matrices above ~150 rows
is wrong (see the module). These tests put torch in that state and check the wrappers, and the
library's callers, against numpy's LAPACK one matrix at a time. They never call the defective
batched path itself (it can hang).
"""
import numpy as np
import pytest
import torch

from perturb import _linalg
from perturb.backward import implicit_root
from perturb.structured import trees
from perturb.structured.trees import _elimination, _wilson

N = 160          # above LU_BATCH_MAX and above the size where the defect appears


@pytest.fixture
def two_threads(torch_threads):
    """torch in the state that exposes the defect: set_num_threads called with 2."""
    torch_threads(2)


def _matrices(*batch, n=N, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, n, n, dtype=dtype, generator=g) + n * torch.eye(n, dtype=dtype)


def test_unsafe_only_for_batched_large_cpu_matrices_on_several_threads(two_threads):
    assert _linalg.batched_lu_unsafe(torch.empty(2, N, N))
    assert _linalg.batched_lu_unsafe(torch.empty(N, N), torch.empty(3, N, 1))   # broadcast
    assert not _linalg.batched_lu_unsafe(torch.empty(N, N))
    assert not _linalg.batched_lu_unsafe(torch.empty(1, 1, N, N))
    assert not _linalg.batched_lu_unsafe(torch.empty(8, _linalg.LU_BATCH_MAX,
                                                     _linalg.LU_BATCH_MAX))
    assert not _linalg.batched_lu_unsafe(torch.empty(2, N, N, device="meta"))
    torch.set_num_threads(1)
    assert not _linalg.batched_lu_unsafe(torch.empty(2, N, N))


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_wrappers_match_numpy_per_matrix(two_threads, dtype, rtol):
    A = _matrices(2, 3, dtype=dtype)
    B = torch.randn(3, N, 2, dtype=dtype, generator=torch.Generator().manual_seed(1))
    An, Bn = A.double().numpy(), B.double().numpy()
    inv, info = _linalg.inv_ex(A)
    assert inv.shape == A.shape and info.shape == (2, 3) and not info.any()
    np.testing.assert_allclose(inv.double().numpy(), np.linalg.inv(An), rtol=rtol,
                               atol=rtol / N)
    sign, logabsdet = _linalg.slogdet(A)
    ref_sign, ref_log = np.linalg.slogdet(An)
    np.testing.assert_array_equal(sign.numpy(), ref_sign)
    np.testing.assert_allclose(logabsdet.double().numpy(), ref_log, rtol=rtol)
    X = _linalg.solve(A, B)                          # B broadcasts over A's first dimension
    ref = np.linalg.solve(An, np.broadcast_to(Bn, (2, 3, N, 2)))
    assert X.shape == (2, 3, N, 2)
    np.testing.assert_allclose(X.double().numpy(), ref, rtol=rtol, atol=rtol / N)
    X, info = _linalg.solve_ex(A[0], B)
    assert info.shape == (3,) and not info.any()
    np.testing.assert_allclose(X.double().numpy(), ref[0], rtol=rtol, atol=rtol / N)


def test_singular_matrix_reported_per_matrix(two_threads):
    A = _matrices(3)
    A[1, :, 0] = 0
    inv, info = _linalg.inv_ex(A)
    assert info.tolist()[0] == 0 and info.tolist()[1] != 0 and info.tolist()[2] == 0
    sign, logabsdet = _linalg.slogdet(A)
    assert sign[1] == 0 and logabsdet[1] == -torch.inf and torch.isfinite(logabsdet[[0, 2]]).all()


def test_gradients_go_through_each_matrix(two_threads):
    A = _matrices(2).requires_grad_()
    _linalg.slogdet(A)[1].sum().backward()       # d log|det A| / dA = A^{-T}
    np.testing.assert_allclose(A.grad.numpy(), np.linalg.inv(A.detach().numpy()).swapaxes(-1, -2),
                               rtol=1e-10, atol=1e-14)
    B = torch.randn(2, N, 1, dtype=torch.float64).requires_grad_()
    _linalg.solve(A.detach(), B).sum().backward()      # d 1ᵀA⁻¹B / dB = A^{-T} 1
    ref = np.linalg.solve(A.detach().numpy().swapaxes(-1, -2), np.ones((2, N, 1)))
    np.testing.assert_allclose(B.grad.numpy(), ref, rtol=1e-10)


def test_small_or_single_matrices_call_torch_directly(two_threads, monkeypatch):
    calls = []
    monkeypatch.setattr(_linalg, "_per_matrix", lambda *a: calls.append(a))
    A = _matrices(4, n=32)
    _linalg.inv_ex(A), _linalg.slogdet(A), _linalg.solve(A, A), _linalg.solve_ex(A, A)
    _linalg.inv_ex(_matrices(n=N))
    assert calls == []


def _walk_matrix(*batch, n=N, seed=0):
    """Column-stochastic P (P[i, j]: the walk from j steps to i), no self loops."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*batch, n, n, dtype=torch.float64, generator=g)
    s.diagonal(dim1=-2, dim2=-1).fill_(-torch.inf)
    return s, torch.softmax(s, dim=-2)


def test_wilson_expected_steps_correct_in_a_batch(two_threads):
    _, P = _walk_matrix(3)
    got = _wilson.expected_steps(P, root=0)
    L = np.eye(N) - P.numpy()
    L[:, 0, :] = 0
    L[:, :, 0] = 0
    L[:, 0, 0] = 1
    ref = np.trace(np.linalg.inv(L), axis1=-2, axis2=-1) - 1
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10)


def test_cycle_reduction_correct_in_a_batch(two_threads):
    s, _ = _walk_matrix(3, seed=2)
    valid = torch.isfinite(s)
    order, m = _elimination.reduction_order(s, valid, None, 0)
    logz, est = _elimination.reduced_log_partition(s, valid, None, 0, order, m)
    # reference: the matrix-tree theorem, log det of the root-deleted Laplacian, per matrix
    W = np.exp(np.where(valid.numpy(), s.numpy(), -np.inf))
    L = np.zeros_like(W)
    idx = np.arange(N)
    L[:, idx, idx] = W.sum(-2)
    L -= W
    ref = np.linalg.slogdet(L[:, 1:, 1:])[1]
    np.testing.assert_allclose(logz.numpy(), ref, rtol=1e-10)
    assert (est < 1e-6).all()


def test_implicit_root_dense_solve_correct_in_a_batch(two_threads):
    A = _matrices(2)
    b = torch.randn(2, N, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    b.requires_grad_()
    x_star = torch.linalg.solve(A[0], b[0].detach()), torch.linalg.solve(A[1], b[1].detach())
    x = implicit_root(lambda x, b: (A @ x.unsqueeze(-1)).squeeze(-1) - b, torch.stack(x_star), b)
    x.sum().backward()                            # ḡ_b = u with Aᵀu = 1
    ref = np.linalg.solve(A.numpy().swapaxes(-1, -2), np.ones((2, N, 1)))[..., 0]
    np.testing.assert_allclose(b.grad.numpy(), ref, rtol=1e-10)


@pytest.mark.parametrize("name", ["arborescence_marginals", "spanning_tree_marginals"])
def test_tree_marginals_of_a_batch_match_one_graph_at_a_time(two_threads, name):
    """Public: a batch of 160-node graphs gives each graph's own marginals (the inverse is
    formed by blocks from 96 nodes on and never reaches the batched LU at this size)."""
    fn = getattr(trees, name)
    w = torch.randn(3, N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    batched = fn(w)
    for i in range(3):
        torch.testing.assert_close(batched[i], fn(w[i]), rtol=1e-10, atol=1e-13)
    if name == "arborescence_marginals":        # every non-root node has one parent
        torch.testing.assert_close(batched.sum(-2)[:, 1:], torch.ones(3, N - 1, dtype=w.dtype))
    else:                                       # n − 1 edges, each counted twice
        torch.testing.assert_close(batched.sum((-2, -1)), torch.full((3,), 2.0 * (N - 1),
                                                                     dtype=w.dtype))


# --------------------------------------------------------------------------------------------
# inside torch.func transforms: a vmapped batch is hidden from the shapes
# --------------------------------------------------------------------------------------------

_LU_CALLS = ("inv_ex", "slogdet", "solve", "solve_ex", "lu_factor", "lu_factor_ex", "inv", "det")


@pytest.fixture
def lu_refuses_hidden_batches(monkeypatch):
    """torch's LU calls raise, instead of hanging or answering wrongly, when they get a large
    matrix inside a torch.func transform (where vmap may hide a batch): the library must not
    make such a call."""
    from perturb._validation import unreadable

    def guard(name, fn):
        def call(A, *args, **kwargs):
            if A.shape[-1] > _linalg.LU_BATCH_MAX and unreadable(A):
                raise AssertionError(f"torch.linalg.{name} on a {A.shape[-1]}-row matrix "
                                     "inside a torch.func transform")
            return fn(A, *args, **kwargs)
        return call
    for name in _LU_CALLS:
        monkeypatch.setattr(torch.linalg, name, guard(name, getattr(torch.linalg, name)))


def test_hidden_batch_unsafe_only_inside_transforms(two_threads):
    A = torch.empty(N, N)
    assert not _linalg.hidden_batch_unsafe(A)
    seen = []
    torch.func.vmap(lambda a: seen.append(_linalg.hidden_batch_unsafe(a)) or a)(
        torch.zeros(2, N, N))
    torch.func.vmap(lambda a: seen.append(_linalg.hidden_batch_unsafe(a)) or a)(
        torch.zeros(2, _linalg.LU_BATCH_MAX, _linalg.LU_BATCH_MAX))
    assert seen == [True, False]


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_wrappers_under_vmap_match_numpy(two_threads, lu_refuses_hidden_batches, dtype, rtol):
    A = _matrices(3, dtype=dtype)
    A[1] = -A[1]                                      # det unchanged (N even: (−1)^N = 1)
    A[1, 0] = -A[1, 0]                                # one row flipped back: det < 0
    B = torch.randn(3, N, 2, dtype=dtype, generator=torch.Generator().manual_seed(5))
    An, Bn = A.double().numpy(), B.double().numpy()
    vmap = torch.func.vmap
    inv, info = vmap(_linalg.inv_ex)(A)
    assert not info.any()
    np.testing.assert_allclose(inv.double().numpy(), np.linalg.inv(An), rtol=rtol,
                               atol=rtol / N)
    sign, logabsdet = vmap(_linalg.slogdet)(A)
    ref_sign, ref_log = np.linalg.slogdet(An)
    assert ref_sign.tolist() == [1.0, -1.0, 1.0]
    np.testing.assert_array_equal(sign.double().numpy(), ref_sign)
    np.testing.assert_allclose(logabsdet.double().numpy(), ref_log, rtol=rtol)
    ref = np.linalg.solve(An, Bn)
    for fn in (_linalg.solve, lambda a, b: _linalg.solve_ex(a, b)[0]):
        np.testing.assert_allclose(vmap(fn)(A, B).double().numpy(), ref, rtol=rtol,
                                   atol=rtol / N)
    # only the right-hand side vmapped: A is a plain tensor, B hides the batch
    X = vmap(lambda b: _linalg.solve(A[0], b))(B)
    np.testing.assert_allclose(X.double().numpy(), np.linalg.solve(An[0], Bn), rtol=rtol,
                               atol=rtol / N)


def test_singular_matrix_under_vmap(two_threads, lu_refuses_hidden_batches):
    A = _matrices(2)
    A[1, :, 0] = 0
    _, info = torch.func.vmap(_linalg.inv_ex)(A)
    assert info.tolist()[0] == 0 and info.tolist()[1] != 0
    sign, logabsdet = torch.func.vmap(_linalg.slogdet)(A)
    assert sign[1] == 0 and logabsdet[1] == -torch.inf and torch.isfinite(logabsdet[0])


def test_per_example_gradients_under_vmap(two_threads, lu_refuses_hidden_batches):
    """vmap(grad) through the QR path: d log|det A| = A⁻ᵀ, and d 1ᵀA⁻¹b / db = A⁻ᵀ1."""
    A = _matrices(2)
    g = torch.func.vmap(torch.func.grad(lambda a: _linalg.slogdet(a)[1]))(A)
    np.testing.assert_allclose(g.numpy(), np.linalg.inv(A.numpy()).swapaxes(-1, -2),
                               rtol=1e-9, atol=1e-14)
    b = torch.randn(2, N, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    gb = torch.func.vmap(torch.func.grad(lambda a, x: _linalg.solve(a, x).sum(), argnums=1))(A, b)
    ref = np.linalg.solve(A.numpy().swapaxes(-1, -2), np.ones((2, N, 1)))
    np.testing.assert_allclose(gb.numpy(), ref, rtol=1e-9)


def test_sinkhorn_per_example_gradients_under_vmap(two_threads, lu_refuses_hidden_batches):
    """Public: vmap(grad) of a loss of Sinkhorn's plan on 160 × 160 problems. Its implicit
    backward solves in the traced form (Cholesky and the fallback solve, chosen per problem);
    before the QR route the fallback's LU ran batched under vmap and hung on two threads."""
    from perturb.structured import sinkhorn
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, N, N, dtype=torch.float64, generator=g)
    c = torch.randn(N, N, dtype=torch.float64, generator=g)

    def loss(t):
        return (sinkhorn(t, tau=1.0) * c).sum()
    per_example = torch.func.vmap(torch.func.grad(loss))(x)
    for i in range(2):
        xi = x[i].clone().requires_grad_()
        (ref,) = torch.autograd.grad(loss(xi), xi)
        torch.testing.assert_close(per_example[i], ref, rtol=1e-7, atol=1e-10)
