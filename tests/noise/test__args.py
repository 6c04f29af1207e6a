"""Tests for perturb/noise/_args.py: argument normalisation of the noise classes."""
from __future__ import annotations

import pytest
import torch

import perturb
from perturb.noise._args import (_as_tensor, _check_unit, _open_uniform, _real, _sample_args,
                                 _zero_grad_like, check_noise, draw)


def test_real():
    assert _real(2, "scale") == 2.0 and _real(torch.tensor(0.5), "scale") == 0.5
    for bad in (True, "1", float("nan"), float("inf"), torch.zeros(2)):
        with pytest.raises(ValueError, match="scale"):
            _real(bad, "scale")


def test_as_tensor_and_unit():
    assert _as_tensor(1, "x").dtype == torch.get_default_dtype()
    assert _as_tensor(torch.tensor([1, 2]), "x").is_floating_point()
    with pytest.raises(ValueError, match="x must be real"):
        _as_tensor(torch.tensor([1j]), "x")
    torch.testing.assert_close(_check_unit([0.0, 1.0]), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="u must lie"):
        _check_unit(torch.tensor([float("nan")]))


def test_sample_args():
    g = torch.Generator().manual_seed(0)
    assert _sample_args(3, g, None, None) == (torch.Size([3]), g.device, torch.get_default_dtype())
    assert _sample_args((2, 0), None, "cpu", torch.float64)[0] == (2, 0)
    for shape in ((2, -1), "ab", (1.5,), (True,)):
        with pytest.raises(ValueError, match="shape"):
            _sample_args(shape, None, None, None)
    with pytest.raises(ValueError, match="dtype"):
        _sample_args((2,), None, None, torch.int32)
    with pytest.raises(ValueError, match="generator"):
        _sample_args((2,), 0, None, None)
    with pytest.raises(ValueError, match="device='bogus'"):
        _sample_args((2,), None, "bogus", None)


def test_check_noise_and_draw():
    """A noise instance passes; its class gets a message saying what to pass; ``draw``
    returns exactly the requested shape or names the noise that ignored it."""
    check_noise(perturb.Gumbel())
    with pytest.raises(ValueError, match=r"class Gumbel; pass noise=Gumbel\(\)"):
        check_noise(perturb.Gumbel)
    with pytest.raises(ValueError, match="sample"):
        check_noise("gumbel")
    eps = draw(perturb.Normal(0.5), (3, 2), torch.Generator().manual_seed(0), "cpu",
               torch.float64)
    assert eps.shape == (3, 2) and eps.dtype == torch.float64

    class Scalar(perturb.Noise):
        def sample(self, shape, *, generator=None, device=None, dtype=None):
            return torch.zeros(())

    with pytest.raises(ValueError, match=r"requested shape \(3, 2\), got \(\)"):
        draw(Scalar(), (3, 2), None, "cpu", torch.float32)


def test_open_uniform_is_open_and_seeded():
    for dtype in (torch.float32, torch.float64):
        u = _open_uniform(torch.Size([100_000]), torch.Generator().manual_seed(1), None, dtype)
        fi = torch.finfo(dtype)
        assert bool((u >= fi.tiny).all()) and bool((u <= 1 - fi.eps / 2).all())
        v = _open_uniform(torch.Size([100_000]), torch.Generator().manual_seed(1), None, dtype)
        assert torch.equal(u, v)


def test_zero_grad_like():
    theta = torch.tensor([0.3, 0.7], requires_grad=True)
    out = _zero_grad_like(torch.tensor([1.0, 2.0]), theta)
    (grad,) = torch.autograd.grad(out.sum(), theta)
    assert torch.equal(out.detach(), torch.tensor([1.0, 2.0])) and torch.equal(grad, torch.zeros(2))
    plain = torch.tensor([1.0])
    assert _zero_grad_like(plain, torch.tensor([0.0])) is plain
