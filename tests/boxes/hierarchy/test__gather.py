"""Tests for perturb.boxes.hierarchy._gather: the row gather with the index_put_ backward
against index_select (values, gradients with repeated ids) and float64 gradcheck."""
import torch

from perturb.boxes.hierarchy._gather import _gather_rows_backward, gather_rows


def test_matches_index_select_with_repeated_ids(generator):
    p = torch.randn(50, 4, generator=generator, requires_grad=True)
    ids = torch.tensor([3, 7, 3, 49, 0, 3, 7])
    out = gather_rows(p, ids)
    ref = p.index_select(0, ids)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    w = torch.randn(7, 4, generator=generator)
    (g,) = torch.autograd.grad((out * w).sum(), p)
    (want,) = torch.autograd.grad((ref * w).sum(), p)
    torch.testing.assert_close(g, want)
    torch.testing.assert_close(_gather_rows_backward(w, ids, p.shape), want)


def test_gradcheck_float64(generator):
    p = torch.randn(6, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    ids = torch.tensor([5, 0, 5, 2])
    assert torch.autograd.gradcheck(lambda t: gather_rows(t, ids), (p,))


def test_sparse_backward_is_the_dense_gradient(generator):
    p = torch.randn(30, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    ids = torch.tensor([3, 7, 3, 29, 0, 3])
    w = torch.randn(6, 4, dtype=torch.float64, generator=generator)
    (dense,) = torch.autograd.grad((gather_rows(p, ids) * w).sum(), p)
    out = gather_rows(p, ids, sparse=True)
    torch.testing.assert_close(out, p.index_select(0, ids), rtol=0, atol=0)
    (g,) = torch.autograd.grad((out * w).sum(), p)
    assert g.is_sparse and g._nnz() == 6                   # one entry per gathered row
    torch.testing.assert_close(g.to_dense(), dense, rtol=1e-15, atol=0)
    # two gathers accumulate into one sparse gradient
    p.grad = None
    ((gather_rows(p, ids, True) * w).sum() + gather_rows(p, ids[:2], True).sum()).backward()
    assert p.grad.is_sparse
    torch.testing.assert_close(p.grad.to_dense(), dense + torch.zeros_like(dense).index_put_(
        (ids[:2],), torch.ones(2, 4, dtype=torch.float64), accumulate=True))
