"""The folded log sides: under vmap, vmap(grad) and jacrev, the values and gradients of the
eager engine on the batch, to the bit."""
import torch
from torch.func import grad, jacrev, vmap

from perturb.boxes._folded_sides import folded_log_sides
from perturb.boxes.expected_volumes import _log_sides
from perturb.noise import Logistic, Normal, Uniform

G = torch.Generator().manual_seed(0)
LO = torch.randn(2, 5, 3, dtype=torch.float64, generator=G)           # (m, batch, d)
UP = LO + torch.rand(2, 5, 3, dtype=torch.float64, generator=G) + 0.3
LO[1, 2] += 3.0                                                         # an inverted side


def _eager(lo, up, noise):
    leaves = lo.clone().requires_grad_(True), up.clone().requires_grad_(True)
    out = _log_sides(*leaves, noise)
    return (out.detach(), *torch.autograd.grad(out.sum(), leaves))


def test_vmap_and_per_example_gradients_are_the_eager_engine_on_the_batch():
    for noise in (Normal(0.1), Logistic(0.2), Uniform(-0.1, 0.1)):
        value, g_lo, g_up = _eager(LO, UP, noise)

        def side(lo, up):
            return folded_log_sides(lo, up, noise, _log_sides)

        assert torch.equal(vmap(side, in_dims=(1, 1))(LO, UP), value)
        got = vmap(grad(lambda lo, up: side(lo, up).sum(), argnums=(0, 1)),
                   in_dims=(1, 1), out_dims=1)(LO, UP)
        assert torch.equal(got[0], g_lo) and torch.equal(got[1], g_up)


def test_an_unbatched_box_and_nested_vmap():
    noise = Normal(0.1)
    value, _, _ = _eager(LO, UP, noise)

    def side(lo, up):
        return folded_log_sides(lo, up, noise, _log_sides)

    # the upper corners shared by the vmapped problems (expanded), then vmap over two dims
    shared = UP[:, :1].expand_as(UP).contiguous()
    torch.testing.assert_close(vmap(side, in_dims=(1, None))(LO, UP[:, 0]),
                               _eager(LO, shared, noise)[0], rtol=0, atol=0)
    lo4, up4 = LO.reshape(2, 5, 3, 1).expand(2, 5, 3, 2), UP.reshape(2, 5, 3, 1).expand(2, 5, 3, 2)
    nested = vmap(vmap(side, in_dims=(1, 1)), in_dims=(3, 3))(lo4, up4)
    assert torch.equal(nested[0], value) and torch.equal(nested[1], value)


def test_jacrev_matches_autograd():
    noise = Normal(0.1)
    lo, up = LO[:, 0], UP[:, 0]

    def side(lo):
        return folded_log_sides(lo, up, noise, _log_sides)

    expected = torch.autograd.functional.jacobian(lambda x: _log_sides(x, up, noise), lo)
    torch.testing.assert_close(jacrev(side)(lo), expected)


def test_folded_pairs_per_example_gradients_are_the_eager_engine():
    """A value per pair (``log(1 − P)`` of nearly nested pairs): vmap(grad) gives the eager
    gradients of the batch, to the bit."""
    from perturb.boxes._folded_sides import folded_pairs
    from perturb.boxes._nested_loss import _log1m_ratio
    noise = Normal(0.1)
    lo_b, up_b = LO[0] + 0.05, UP[0] - 0.05                 # b nearly nested in a
    corners = (LO[0], UP[0], lo_b, up_b)
    leaves = [c.clone().requires_grad_(True) for c in corners]
    out = _log1m_ratio(*leaves, noise)
    expected = torch.autograd.grad(out.sum(), leaves)
    assert torch.equal(vmap(lambda *c: folded_pairs(_log1m_ratio, noise, *c))(*corners),
                       out.detach())
    got = vmap(grad(lambda *c: folded_pairs(_log1m_ratio, noise, *c), argnums=(0, 1, 2, 3)))(
        *corners)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
