"""perturb/_autograd.py: a once-differentiable backward refuses a second derivative, also when
the incoming gradient is a constant (the case torch's decorator lets through as silent zeros),
in eager autograd and under torch.func; first derivatives are unchanged."""
import pytest
import torch
from torch.func import grad, jacrev, vmap

from perturb import Gumbel, Logistic, Normal
from perturb import structured as S
from perturb._autograd import once_differentiable
from perturb.boxes import Box, containment_prob, expected_volume, volume


class _Cube(torch.autograd.Function):
    """x³·y with a once-differentiable backward."""
    generate_vmap_rule = True

    @staticmethod
    def forward(x, y):
        return x ** 3 * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return 3 * x ** 2 * y * g, x ** 3 * g


X = torch.tensor([1.0, 2.0], dtype=torch.float64)
Y = torch.tensor([3.0, -1.0], dtype=torch.float64)


def test_first_derivatives_unchanged():
    x = X.clone().requires_grad_()
    (g,) = torch.autograd.grad(_Cube.apply(x, Y).sum(), x)
    torch.testing.assert_close(g, 3 * X ** 2 * Y)
    torch.testing.assert_close(jacrev(lambda a: _Cube.apply(a, Y))(X), torch.diag(3 * X ** 2 * Y))
    torch.testing.assert_close(vmap(grad(lambda a, b: _Cube.apply(a, b)))(X, Y), 3 * X ** 2 * Y)
    # with create_graph the first derivative has the same value
    x = X.clone().requires_grad_()
    (g,) = torch.autograd.grad(_Cube.apply(x, Y).sum(), x, create_graph=True)
    torch.testing.assert_close(g.detach(), 3 * X ** 2 * Y)


def test_second_derivatives_raise_instead_of_zeros():
    with pytest.raises(RuntimeError, match="_Cube: second derivatives are not implemented"):
        torch.autograd.functional.hessian(lambda a: _Cube.apply(a, Y).sum(), X)
    with pytest.raises(RuntimeError, match="second derivatives"):
        jacrev(jacrev(lambda a: _Cube.apply(a, Y).sum()))(X)
    x = X.clone().requires_grad_()
    (g,) = torch.autograd.grad(_Cube.apply(x, Y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives"):
        g.sum().backward()


def test_no_graph_no_node():
    x = X.clone().requires_grad_()
    (g,) = torch.autograd.grad(_Cube.apply(x, Y).sum(), x)
    assert g.grad_fn is None and not g.requires_grad


G = torch.Generator().manual_seed(0)
W = torch.randn(4, 4, dtype=torch.float64, generator=G)
C = torch.randn(4, 4, dtype=torch.float64, generator=G)
V = torch.randn(6, dtype=torch.float64, generator=G)
U = torch.randn(6, dtype=torch.float64, generator=G)
UP = torch.tensor([1.0, 2.0], dtype=torch.float64)
B = Box(torch.tensor([0.2, 0.1], dtype=torch.float64), torch.tensor([1.5, 1.0], dtype=torch.float64))
LO = torch.tensor([0.0, 0.5], dtype=torch.float64)

# public functions whose backward is once differentiable: their Hessian raises (it came out
# as zeros before)
ONCE = {
    "arborescence_marginals": (lambda w: (S.arborescence_marginals(w) * C).sum(), W),
    "spanning_tree_marginals": (lambda w: (S.spanning_tree_marginals(w) * C).sum(), W),
    "sinkhorn": (lambda w: (S.sinkhorn(w, n_iters=200) * C).sum(), W),
    "ksubset_marginals": (lambda v: (S.ksubset_marginals(v, 2) * U).sum(), V),
    "relaxed_topk": (lambda v: (S.relaxed_topk(v, 2, tau=0.5) * U).sum(), V),
    "gumbel volume": (lambda a: volume(Box(a, UP), beta=0.3).log(), LO),
    "soft volume": (lambda a: volume(Box(a, UP), temperature=0.3).log(), LO),
    "gumbel expected_volume": (
        lambda a: expected_volume(Box(a, UP), B, noise=Gumbel(0.3), log=True), LO),
    "normal expected_volume": (
        lambda a: expected_volume(Box(a, UP), B, noise=Normal(0.3), log=True), LO),
}


@pytest.mark.parametrize("name", sorted(ONCE))
def test_library_hessians_raise(name):
    fn, x = ONCE[name]
    with pytest.raises(RuntimeError, match="second derivatives are not implemented"):
        torch.autograd.functional.hessian(fn, x)


TWICE = {
    "arborescence_log_partition": (lambda w: S.arborescence_log_partition(w), W),
    "ksubset_log_partition": (lambda v: S.ksubset_log_partition(v, 2), V),
    "hard volume": (lambda a: volume(Box(a, UP)).log(), LO),
    # Logistic pairs in closed form: plain autograd
    "logistic containment_prob": (
        lambda a: containment_prob(Box(a, UP), B, noise=Logistic(0.3)), LO),
}


@pytest.mark.parametrize("name", sorted(TWICE))
def test_library_hessians_that_exist_match_finite_differences(name):
    """Twice-differentiable paths keep their Hessians (log Z through the marginals' Function,
    plain autograd elsewhere): against central differences of the gradient."""
    fn, x = TWICE[name]
    h = torch.autograd.functional.hessian(fn, x).reshape(x.numel(), x.numel())

    def g(a):
        a = a.clone().requires_grad_()
        return torch.autograd.grad(fn(a), a)[0].flatten()
    eps, eye = 1e-6, torch.eye(x.numel(), dtype=x.dtype)
    fd = torch.stack([(g(x + eps * e.view_as(x)) - g(x - eps * e.view_as(x))) / (2 * eps)
                      for e in eye])
    assert float(fd.abs().max()) > 0
    torch.testing.assert_close(h, fd, atol=1e-6, rtol=1e-6)
