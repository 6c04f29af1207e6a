"""perturb/_vmap.py: the vmap rule that folds the vmapped dim into a solver's batch."""
import pytest
import torch
from torch.func import vmap

from perturb._vmap import fold_vmap


class _ScaledSoftmax(torch.autograd.Function):
    """softmax(x / t) over the last dim, t broadcasting against x's batch; a data-dependent
    host read in the forward (as the iterative solvers have) that plain vmap refuses."""

    @staticmethod
    def forward(x, t):
        assert bool(torch.isfinite(x).all())           # a host read
        return torch.softmax(x / t, -1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[1])

    @staticmethod
    def backward(ctx, g):
        p, t = ctx.saved_tensors
        return p * (g - (g * p).sum(-1, keepdim=True)) / t, None

    @staticmethod
    def vmap(info, in_dims, *args):
        return fold_vmap(_ScaledSoftmax.apply, info, in_dims, args, expand=(0,), broadcast=(1,))


X = torch.randn(4, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_vmapped_scores_equal_the_loop():
    t = torch.tensor(0.7, dtype=torch.float64)
    out = vmap(lambda x: _ScaledSoftmax.apply(x, t))(X)
    torch.testing.assert_close(out, torch.stack([_ScaledSoftmax.apply(x, t) for x in X]))


def test_a_broadcast_argument_vmapped_alone_still_gives_the_vmapped_dim():
    # only t is vmapped: x is expanded, so the output carries the vmapped dim
    ts = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64).reshape(3, 1, 1)
    out = vmap(lambda t: _ScaledSoftmax.apply(X[0], t))(ts)
    torch.testing.assert_close(out, torch.stack([_ScaledSoftmax.apply(X[0], t) for t in ts]))


def test_an_argument_that_may_not_be_vmapped_is_refused():
    def rule(x, k):
        return fold_vmap(lambda a, b: a, None, (None, 0), (x, k), expand=(0,))
    with pytest.raises(ValueError, match="argument 1 cannot be vmapped"):
        rule(X, torch.ones(3))
