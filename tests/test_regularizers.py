"""Tests of perturb/regularizers.py: values of f and the conjugate identities on the simplex."""
import math

import pytest
import torch

from perturb import Simplex, regularized_argmax
from perturb.regularizers import (
    BinaryEntropy,
    Entropy,
    ExpFamilyEntropy,
    Regularizer,
    SquaredNorm,
)


def test_values_match_formulas():
    x = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    ent = torch.tensor([0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5), 0.0],
                       dtype=torch.float64)
    torch.testing.assert_close(Entropy().value(x), ent)  # 0 log 0 = 0, no NaN
    torch.testing.assert_close(SquaredNorm().value(x), 0.5 * (x * x).sum(-1))
    b = torch.tensor([0.25, 0.5], dtype=torch.float64)
    torch.testing.assert_close(
        BinaryEntropy().value(b, event_dim=1),
        torch.tensor(0.25 * math.log(0.25) + 0.75 * math.log(0.75) + 2 * 0.5 * math.log(0.5),
                     dtype=torch.float64))
    torch.testing.assert_close(BinaryEntropy().value(torch.tensor([0.0, 1.0])), torch.tensor(0.0))


def test_event_dims():
    x = torch.rand(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(SquaredNorm().value(x, event_dim=2), 0.5 * (x * x).sum((-1, -2)))
    torch.testing.assert_close(Entropy().value(x, event_dim=0), torch.special.xlogy(x, x))
    assert Entropy().value(x, event_dim=2).shape == (2,)


def test_expfamily_entropy_has_no_closed_value():
    with pytest.raises(NotImplementedError, match="ExpFamilyEntropy"):
        ExpFamilyEntropy().value(torch.ones(3))


def test_identity_semantics():
    assert Entropy() == Entropy() and Entropy() != SquaredNorm()
    assert hash(Entropy()) == hash(Entropy())
    assert repr(BinaryEntropy()) == "BinaryEntropy()"
    assert len({Entropy(), Entropy(), SquaredNorm()}) == 2
    assert isinstance(ExpFamilyEntropy(), Regularizer)


@pytest.mark.parametrize("tau", [0.2, 1.0, 3.0])
def test_conjugate_values_on_simplex(tau, generator):
    """max_x <w, x> − τ f(x) over the simplex: τ·logsumexp(w/τ) for the entropy; for ½‖x‖² the
    value at the projection p = sparsemax(w/τ) beats every vertex and the uniform point."""
    w = torch.randn(6, 5, dtype=torch.float64, generator=generator)
    y = regularized_argmax(w, Simplex(), Entropy(), tau)
    val = (w * y).sum(-1) - tau * Entropy().value(y)
    torch.testing.assert_close(val, tau * torch.logsumexp(w / tau, -1))
    p = regularized_argmax(w, Simplex(), SquaredNorm(), tau)
    obj = lambda x: (w * x).sum(-1) - tau * SquaredNorm().value(x)  # noqa: E731
    for cand in list(torch.eye(5, dtype=torch.float64)) + [torch.full((5,), 0.2).double()]:
        assert bool((obj(p) >= obj(cand.expand_as(w)) - 1e-12).all())
