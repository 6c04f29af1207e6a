"""SpanningTrees / Arborescences through the core: registry, relax, straight-through."""
import pytest
import torch

import perturb
from perturb import ExpFamilyEntropy, Gumbel, Normal
from perturb.structured import (
    Arborescences,
    SpanningTrees,
    arborescence_marginals,
    max_arborescence,
    max_spanning_tree,
    spanning_tree_marginals,
)

D = torch.float64


def test_structure_contract():
    assert repr(Arborescences(root=2)) == "Arborescences(root=2)"
    assert repr(SpanningTrees()) == "SpanningTrees()"
    assert Arborescences(1) == Arborescences(root=1) and Arborescences(1) != Arborescences(2)
    for structure in (SpanningTrees(), Arborescences(root=1)):
        assert structure.event_dim == 2
        assert isinstance(structure.default_regularizer(), ExpFamilyEntropy)
        verts = structure.enumerate(5, dtype=D)
        assert verts.shape == (125, 5, 5) and structure.check(verts).all()
        assert not structure.check(torch.zeros(5, 5)).any()
    pairs = {(p.structure, p.regularizer): p for p in perturb.registered_pairs()}
    for name in ("SpanningTrees", "Arborescences"):
        assert pairs[(name, "ExpFamilyEntropy")].backward == (
            "analytic", "unroll", "finite_difference")
    with pytest.raises(NotImplementedError, match="SpanningTrees"):
        perturb.regularized_argmax(torch.zeros(4, 4), SpanningTrees(), perturb.Entropy())
    with pytest.raises(ValueError, match="root"):
        perturb.argmax(torch.zeros(3, 3), Arborescences(root=5))


def test_argmax_and_regularized_argmax(generator):
    w = torch.randn(3, 6, 6, dtype=D, generator=generator)
    torch.testing.assert_close(perturb.argmax(w, SpanningTrees()), max_spanning_tree(w))
    torch.testing.assert_close(perturb.argmax(w, Arborescences(2)), max_arborescence(w, 2))
    torch.testing.assert_close(perturb.regularized_argmax(w, SpanningTrees(), tau=0.5),
                               spanning_tree_marginals(w, tau=0.5))
    torch.testing.assert_close(perturb.regularized_argmax(w, Arborescences(2), tau=2.0),
                               arborescence_marginals(w, root=2, tau=2.0))


@pytest.mark.parametrize("noise", [Gumbel(), Normal()])
def test_relax_and_straight_through(noise, generator):
    theta = torch.randn(4, 6, 6, dtype=D, generator=generator, requires_grad=True)
    for structure in (SpanningTrees(), Arborescences(root=0)):
        g1 = torch.Generator().manual_seed(7)
        soft = perturb.relax(theta, structure, noise, tau=0.5, n_samples=3, generator=g1)
        assert soft.shape == (3, 4, 6, 6)
        u = perturb.perturb(theta, noise, n_samples=3, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(
            soft, perturb.regularized_argmax(u, structure, tau=0.5))
        hard = perturb.relax(theta, structure, noise, tau=0.5, hard=True, n_samples=3,
                             generator=torch.Generator().manual_seed(7))
        assert structure.check(hard.detach()).all()
        torch.testing.assert_close(hard.detach(), structure.argmax(u.detach()))
        c = torch.randn(6, 6, dtype=D, generator=generator)
        gh = torch.autograd.grad((hard * c).sum(), theta)[0]
        gs = torch.autograd.grad((soft * c).sum(), theta)[0]
        torch.testing.assert_close(gh, gs)  # straight-through: the relaxed gradient
        assert gs.abs().sum() > 0


def test_float32_through_core(generator):
    theta = torch.randn(2, 8, 8, generator=generator, requires_grad=True)
    x = perturb.relax(theta, Arborescences(root=3), tau=0.3, generator=generator)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x.sum((-1, -2)), torch.full((2,), 7.0))
    x.sum().backward()
    assert torch.isfinite(theta.grad).all()
