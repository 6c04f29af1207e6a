"""The inverse of the scaled Laplacian with its log-determinant: one LAPACK call below
BLOCK_MIN nodes, 2 × 2 blocks from it on (the fast path's and the cycle reduction's accuracy
against the log-space elimination at those sizes is in test__matrix_tree.py and
test__elimination.py)."""
import numpy as np
import pytest
import torch

from perturb.structured.trees import _matrix_tree as eng
from perturb.structured.trees._inverse import BLOCK_MIN, inverse

D = torch.float64


def _laplacian(n, generator, root=5):
    """Scaled Laplacians I − P̂ ``(2, 3, n, n)`` with a root inside the first half and absent
    nodes (identity rows and columns) in one batch row."""
    s = torch.randn(2, 3, n, n, dtype=D, generator=generator)
    valid = ~torch.eye(n, dtype=torch.bool)
    valid[:, root] = False
    nodes = torch.ones(2, 3, n, dtype=torch.bool)
    nodes[1, :, n - 7:] = False
    valid = valid & nodes.unsqueeze(-1) & nodes.unsqueeze(-2)
    P, _, _ = eng.column_softmax(s, valid)
    return eng._reduced_matrix(P, root, eng._inner_nodes(P.shape, nodes, root, P.device))


@pytest.mark.parametrize("n", [BLOCK_MIN - 1, BLOCK_MIN, 130, 200])
def test_inverse_and_log_determinant(n, generator):
    """Against numpy's LAPACK inverse and slogdet (200 nodes recurse twice): equal to 1e-13,
    entrywise nonnegative, positive determinant; the same inverse with and without the
    determinant. numpy, not torch.linalg: torch 2.13's batched CPU inverse of 200 × 200
    float64 matrices on two threads came out wrong (and raised in lu_solve) on the CI machine."""
    M = _laplacian(n, generator)
    inv = inverse(M, det=True)
    assert not inv.singular.any() and (inv.inv >= 0).all()
    torch.testing.assert_close(inv.inv, torch.from_numpy(np.linalg.inv(M.numpy())),
                               rtol=1e-13, atol=1e-13)
    sign, logabsdet = (torch.from_numpy(t) for t in np.linalg.slogdet(M.numpy()))
    assert inv.logabsdet is not None and inv.negative is not None
    torch.testing.assert_close(inv.logabsdet, logabsdet, rtol=1e-13, atol=1e-13)
    assert (sign > 0).all() and not inv.negative.any()
    plain = inverse(M)
    assert plain.logabsdet is None and plain.negative is None
    torch.testing.assert_close(plain.inv, inv.inv, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("n", [130, 200])
def test_singular_and_negative_determinants_are_flagged(n, generator):
    """A zero column in the first block or in the Schur complement's is flagged as singular;
    one row scaled by −1 in either half makes the determinant negative."""
    M = _laplacian(n, generator)[0, 0]
    for k in (1, n - 2):
        Z = M.clone()
        Z[:, k] = 0
        assert inverse(Z)[1] and inverse(Z, det=True)[1]
        F = M.clone()
        F[k] = -F[k]
        inv = inverse(F, det=True)
        assert inv.negative and not inv.singular
        torch.testing.assert_close(inv.inv, torch.from_numpy(np.linalg.inv(F.numpy())),
                                   rtol=1e-12, atol=1e-12)
