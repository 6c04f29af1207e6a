"""Tests of perturb/backward.py: implicit differentiation, finite differences, straight-through."""
import pytest
import torch

from perturb.backward import (
    _fd_vjp,
    _implicit_vjp,
    finite_difference_solve,
    implicit_root,
    straight_through,
)


def _spd(b, n, generator):
    a = torch.randn(b, n, n, dtype=torch.float64, generator=generator)
    return a @ a.transpose(-1, -2) + n * torch.eye(n, dtype=torch.float64)


# --------------------------------------------------------------------------------------------
# straight-through
# --------------------------------------------------------------------------------------------

def test_straight_through_value_and_gradient(generator):
    w = torch.randn(4, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    c = torch.randn(4, 5, dtype=torch.float64, generator=generator)
    soft = torch.softmax(w, -1)
    hard = torch.nn.functional.one_hot(w.argmax(-1), 5).double()
    y = straight_through(hard, soft)
    torch.testing.assert_close(y, hard, atol=1e-15, rtol=0)
    (g,) = torch.autograd.grad((y * c).sum(), w)
    (g_soft,) = torch.autograd.grad((torch.softmax(w, -1) * c).sum(), w)
    torch.testing.assert_close(g, g_soft)


# --------------------------------------------------------------------------------------------
# implicit differentiation
# --------------------------------------------------------------------------------------------

def _softmax_conditions(x, w):
    """Softmax as a root: log x_i − w_i all equal (n − 1 conditions) and Σ x = 1.

    F_i = (log x_i − w_i) − mean_j (log x_j − w_j) + (Σ_j x_j − 1); ∂F/∂x is invertible at x*.
    """
    r = torch.log(x) - w
    return r - r.mean(-1, keepdim=True) + (x.sum(-1, keepdim=True) - 1)


@pytest.mark.parametrize("linear_solve", ["dense", "lstsq"])
def test_implicit_softmax_matches_autograd(linear_solve, generator):
    w = torch.randn(3, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    c = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    x_star = torch.softmax(w.detach(), -1)
    torch.testing.assert_close(_softmax_conditions(x_star, w.detach()),
                               torch.zeros(3, 5, dtype=torch.float64))
    x = implicit_root(_softmax_conditions, x_star, w, linear_solve=linear_solve)
    torch.testing.assert_close(x, x_star, rtol=0, atol=0)
    (g,) = torch.autograd.grad((x * c).sum(), w)
    (g_ref,) = torch.autograd.grad((torch.softmax(w, -1) * c).sum(), w)
    torch.testing.assert_close(g, g_ref)


def test_implicit_softmax_gradcheck(generator):
    w = torch.randn(2, 4, dtype=torch.float64, generator=generator, requires_grad=True)

    def f(v):
        return implicit_root(_softmax_conditions, torch.softmax(v.detach(), -1), v)

    assert torch.autograd.gradcheck(f, (w,))


@pytest.mark.parametrize("linear_solve", ["dense", "lstsq", "cg", "callable"])
def test_implicit_linear_system(linear_solve, generator):
    """x* = A⁻¹ b is the root of F(x, A, b) = A x − b: gradients in A and b match autograd."""
    a = _spd(3, 4, generator).requires_grad_()
    b = torch.randn(3, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    c = torch.randn(3, 4, dtype=torch.float64, generator=generator)

    def cond(x, a_, b_):
        return (a_ @ x.unsqueeze(-1)).squeeze(-1) - b_

    solve = linear_solve
    if linear_solve == "callable":
        def solve(matvec_t, rhs):  # a user solver: dense from the matvec, batched
            cols = [matvec_t(e.expand_as(rhs)) for e in torch.eye(4, dtype=torch.float64)]
            mat = torch.stack(cols, -1)
            return torch.linalg.solve(mat, rhs.unsqueeze(-1)).squeeze(-1)

    x_star = torch.linalg.solve(a.detach(), b.detach().unsqueeze(-1)).squeeze(-1)
    x = implicit_root(cond, x_star, a, b, linear_solve=solve)
    ga, gb = torch.autograd.grad((x * c).sum(), (a, b))
    ref = torch.linalg.solve(a, b.unsqueeze(-1)).squeeze(-1)
    ra, rb = torch.autograd.grad((ref * c).sum(), (a, b))
    tol = dict(atol=1e-8, rtol=1e-7) if linear_solve == "cg" else {}
    torch.testing.assert_close(ga, ra, **tol)
    torch.testing.assert_close(gb, rb, **tol)


def test_implicit_linear_gradcheck_and_needs_input_grad(generator):
    a = _spd(2, 3, generator).requires_grad_()
    b = torch.randn(2, 3, dtype=torch.float64, generator=generator, requires_grad=True)

    def cond(x, a_, b_):
        return (a_ @ x.unsqueeze(-1)).squeeze(-1) - b_

    def f(a_, b_):
        x_star = torch.linalg.solve(a_.detach(), b_.detach().unsqueeze(-1)).squeeze(-1)
        return implicit_root(cond, x_star, a_, b_)

    assert torch.autograd.gradcheck(f, (a, b))
    # only b requires grad: A gets none, b's gradient is A⁻ᵀ ḡ
    a2 = a.detach()
    x = f(a2, b)
    g = torch.ones(2, 3, dtype=torch.float64)
    (gb,) = torch.autograd.grad(x, b, g)
    torch.testing.assert_close(gb, torch.linalg.solve(a2.transpose(-1, -2), g.unsqueeze(-1))
                               .squeeze(-1))


def test_implicit_vjp_helper_direct(generator):
    a = _spd(1, 3, generator)[0]
    b = torch.randn(3, dtype=torch.float64, generator=generator)
    x_star = torch.linalg.solve(a, b)
    g = torch.randn(3, dtype=torch.float64, generator=generator)
    (gb,) = _implicit_vjp(lambda x, b_: a @ x - b_, x_star, [b], g, 1, "dense", [True])
    torch.testing.assert_close(gb, torch.linalg.solve(a.T, g))


def test_implicit_bad_arguments():
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="linear_solve"):
        implicit_root(lambda x, v: x - v, w.detach(), w, linear_solve="qr")
    x = implicit_root(lambda x, v: (x - v).sum(), w.detach(), w)
    with pytest.raises(ValueError, match="optimality_fn must return the shape"):
        x.sum().backward()


# --------------------------------------------------------------------------------------------
# finite differences
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 2e-3)])
def test_finite_difference_matches_analytic(dtype, tol, generator):
    w = torch.randn(4, 6, generator=generator).to(dtype).requires_grad_()
    c = torch.randn(4, 6, generator=generator).to(dtype)
    y = finite_difference_solve(lambda v: torch.softmax(v / 0.5, -1), w)
    torch.testing.assert_close(y, torch.softmax(w / 0.5, -1))
    (g,) = torch.autograd.grad((y * c).sum(), w)
    (g_ref,) = torch.autograd.grad((torch.softmax(w / 0.5, -1) * c).sum(), w)
    # central differences: error O(eps²) (eps = 1e-3 in float64, 1e-2 in float32)
    torch.testing.assert_close(g, g_ref, atol=tol, rtol=tol)


def test_finite_difference_event_dim_two_and_zero_grad(generator):
    w = torch.randn(2, 3, 3, dtype=torch.float64, generator=generator, requires_grad=True)

    def solve(v):  # row softmax of a matrix: a gradient map, symmetric Jacobian
        return torch.softmax(v, -1)

    c = torch.randn(2, 3, 3, dtype=torch.float64, generator=generator)
    c[1] = 0  # one problem with zero incoming gradient
    y = finite_difference_solve(solve, w, event_dim=2)
    (g,) = torch.autograd.grad((y * c).sum(), w)
    (g_ref,) = torch.autograd.grad((solve(w) * c).sum(), w)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-6)
    assert bool((g[1] == 0).all())
    direct = _fd_vjp(solve, w.detach(), c, 1e-3, 2)
    torch.testing.assert_close(direct, g)


def test_finite_difference_bad_eps():
    with pytest.raises(ValueError, match="eps"):
        finite_difference_solve(lambda v: v, torch.zeros(3), eps=0.0)


# --------------------------------------------------------------------------------------------
# one vocabulary: the direct solver functions accept the registry's modes
# --------------------------------------------------------------------------------------------

def _direct_solvers():
    from perturb.structured import (arborescence_marginals, ksubset_marginals, sinkhorn,
                                    spanning_tree_marginals)

    return {
        "ksubset_marginals": (lambda w, b: ksubset_marginals(w, 2, backward=b), (6,)),
        "sinkhorn": (lambda w, b: sinkhorn(w, tau=0.5, tol=1e-12, backward=b), (4, 4)),
        "spanning_tree_marginals": (lambda w, b: spanning_tree_marginals(w, backward=b), (5, 5)),
        "arborescence_marginals": (lambda w, b: arborescence_marginals(w, 1, backward=b), (5, 5)),
    }


@pytest.mark.parametrize("name", sorted(_direct_solvers()))
def test_direct_solvers_take_every_mode_of_the_vocabulary(name):
    """"auto" is the native default, "finite_difference" agrees with it to O(ε²), and a mode
    outside the vocabulary, or one the solver lacks, is refused naming what it supports."""
    from perturb.backward import BACKWARD_MODES

    fn, event = _direct_solvers()[name]
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, *event, dtype=torch.float64, generator=g)
    c = torch.randn(2, *event, dtype=torch.float64, generator=g)
    grads = {}
    for mode in ("auto", "finite_difference"):
        x = w.clone().requires_grad_()
        y = fn(x, mode)
        (grads[mode],) = torch.autograd.grad((y * c).sum(), x)
        torch.testing.assert_close(y.detach(), fn(w, "auto"))
    torch.testing.assert_close(grads["finite_difference"], grads["auto"], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="backward='adjoint' is not supported here; accepted"):
        fn(w, "adjoint")
    lacking = [m for m in BACKWARD_MODES if m not in ("auto", "finite_difference", "unroll")
               and m not in ("implicit" if name == "sinkhorn" else "analytic",)]
    for mode in lacking:
        with pytest.raises(ValueError, match=f"not supported for {name}; supported: 'auto'"):
            fn(w, mode)


def test_finite_differences_never_leave_a_tensor_tau_silently_without_gradient():
    """Finite differences differentiate the scores only: with a τ that requires a gradient every
    registered pair either refuses ('finite_difference' ... tau) or gives τ its true gradient."""
    from perturb import registered_pairs, regularized_argmax
    from perturb import regularizers as regs
    from tests.test_contract import EXAMPLES

    for pair in registered_pairs():
        if not pair.supported or pair.structure not in EXAMPLES:
            continue
        structure, event = EXAMPLES[pair.structure]()
        reg = getattr(regs, pair.regularizer)()
        g = torch.Generator().manual_seed(0)
        w = torch.randn(2, *event, dtype=torch.float64, generator=g)
        c = torch.randn(2, *event, dtype=torch.float64, generator=g)
        tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        try:
            y = regularized_argmax(w, structure, reg, tau, backward="finite_difference")
        except ValueError as e:
            assert "finite_difference" in str(e) and "tau" in str(e), (pair, e)
            continue
        (gt,) = torch.autograd.grad((y * c).sum(), tau, allow_unused=True)
        y_ref = regularized_argmax(w, structure, reg, tau, backward="auto")
        (ref,) = torch.autograd.grad((y_ref * c).sum(), tau)
        assert gt is not None, pair
        torch.testing.assert_close(gt, ref, rtol=1e-4, atol=1e-6, msg=str(pair))
