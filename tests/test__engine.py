"""Tests for perturb._engine: the checked-argument engine behind perturb.core equals the public
functions for the same generator state, and its dispatch pieces behave as documented."""
from __future__ import annotations

import pytest
import torch

import perturb
from perturb import _engine
from perturb.structured import KSubset

F64 = torch.float64


def test_engine_equals_the_public_functions():
    theta = torch.randn(3, 6, dtype=F64)
    for structure, noise in ((perturb.Simplex(), perturb.Gumbel()),
                             (KSubset(2), perturb.Normal(0.5))):
        g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        public = perturb.relax(theta, structure, noise, tau=0.3, hard=True, generator=g1)
        engine = _engine.relax_checked(theta, structure, noise, None, 0.3, True, None, g2,
                                       "auto")
        assert torch.equal(public, engine)
        g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        assert torch.equal(perturb.perturb(theta, noise, 4, generator=g1),
                           _engine.perturb_checked(theta, noise, 4, g2))
    w = torch.randn(2, 5, dtype=F64)
    assert torch.equal(perturb.regularized_argmax(w, tau=0.7),
                       _engine.regularized_argmax_checked(w, perturb.Simplex(), None, 0.7,
                                                          "auto"))


def test_resolve_fills_the_default_regularizer_and_mode():
    reg, entry, mode = _engine.resolve(perturb.Simplex(), None, "auto")
    assert isinstance(reg, perturb.Entropy) and mode == entry.backward[0]
    with pytest.raises(ValueError, match="backward"):
        _engine.resolve(perturb.Simplex(), None, "sideways")
    with pytest.raises(ValueError, match="regularizer"):
        _engine.resolve(perturb.Simplex(), "entropy", "auto")


def test_check_structure_and_the_finite_noises():
    _engine.check_structure(perturb.Simplex())
    with pytest.raises(ValueError, match="structure must be a perturb Structure"):
        _engine.check_structure("simplex")
    assert perturb.Gumbel in _engine.FINITE_NOISES and perturb.Normal in _engine.FINITE_NOISES


def test_a_fused_relax_runs_when_it_applies(monkeypatch):
    _, entry, _ = _engine.resolve(perturb.Simplex(), None, "auto")
    calls = []

    def fused(theta, noise, tau, hard, generator):
        calls.append(tau)
        return torch.full_like(theta, 0.25) if tau == 0.5 else None

    monkeypatch.setitem(_engine.FUSED_RELAX, entry.solver, fused)
    theta = torch.zeros(2, 4)
    assert torch.equal(perturb.relax(theta, tau=0.5), torch.full((2, 4), 0.25))
    out = perturb.relax(theta, tau=0.7)                  # declined: the composition runs
    assert calls == [0.5, 0.7] and torch.allclose(out.sum(-1), torch.ones(2))
