"""Tests of perturb/structures.py: the Simplex structure and the solver registry."""
import pytest
import torch

from perturb import structures
from perturb.regularizers import BinaryEntropy, Entropy, Regularizer, SquaredNorm
from perturb.structures import (
    Simplex,
    Structure,
    get_solver,
    register_solver,
    register_unsupported,
    registered_pairs,
)


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so test registrations never leak into other tests."""
    monkeypatch.setattr(structures, "_REGISTRY", dict(structures._REGISTRY))
    return structures._REGISTRY


class _Base(Structure):
    pass


class _Child(_Base):
    pass


class _GrandChild(_Child):
    pass


class _SubEntropy(Entropy):
    pass


def _solver(tag):
    def solve(w, structure, regularizer, tau, backward):
        return w * 0 + tag
    solve.__name__ = f"solve_{tag}"
    return solve


# --------------------------------------------------------------------------------------------
# Simplex
# --------------------------------------------------------------------------------------------

def test_simplex_argmax_check_enumerate():
    w = torch.tensor([[0.1, 2.0, -1.0], [3.0, 3.0, 0.0]])
    y = Simplex().argmax(w)
    torch.testing.assert_close(y, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))  # tie: lowest
    assert y.dtype == w.dtype and bool(Simplex().check(y).all())
    assert Simplex().check(torch.tensor([[0.5, 0.5, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
                           ).tolist() == [False, False, False]
    verts = Simplex().enumerate(4, dtype=torch.float64)
    torch.testing.assert_close(verts, torch.eye(4, dtype=torch.float64))
    assert bool(Simplex().check(verts).all())


def test_simplex_argmax_is_brute_force(generator):
    w = torch.randn(10, 5, dtype=torch.float64, generator=generator)
    verts = Simplex().enumerate(5, dtype=torch.float64)
    best = verts[(w @ verts.T).argmax(-1)]
    torch.testing.assert_close(Simplex().argmax(w), best)


def test_structure_basics():
    s = Simplex()
    assert repr(s) == "Simplex()" and s == Simplex() and hash(s) == hash(Simplex())
    assert s != _Base()
    assert isinstance(s.default_regularizer(), Entropy)
    assert s.event_shape(torch.zeros(2, 3, 4)) == (4,)
    with pytest.raises(ValueError, match="w"):
        s.validate(torch.zeros(()))
    with pytest.raises(ValueError, match="floating"):
        s.validate(torch.zeros(3, dtype=torch.long))


def test_square_structure_validation():
    class _Square(Structure):
        event_dim, square = 2, True

    with pytest.raises(ValueError, match="square"):
        _Square().validate(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="at least 2 dims"):
        _Square().validate(torch.zeros(3))
    _Square().validate(torch.zeros(2, 3, 3))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

def test_dispatch_to_most_specific_structure(registry):
    register_solver(_Base, Entropy)(_solver(1))
    register_solver(_Child, Entropy)(_solver(2))
    assert get_solver(_Base(), Entropy()).solver.__name__ == "solve_1"
    assert get_solver(_Child(), Entropy()).solver.__name__ == "solve_2"
    assert get_solver(_GrandChild(), Entropy()).solver.__name__ == "solve_2"  # nearest ancestor


def test_dispatch_to_most_specific_regularizer(registry):
    register_solver(_Base, Regularizer)(_solver(1))
    register_solver(_Base, Entropy)(_solver(2))
    register_solver(_Base, _SubEntropy)(_solver(3))
    assert get_solver(_Base(), SquaredNorm()).solver.__name__ == "solve_1"
    assert get_solver(_Base(), Entropy()).solver.__name__ == "solve_2"
    assert get_solver(_Child(), _SubEntropy()).solver.__name__ == "solve_3"


def test_solver_called_through_regularized_argmax(registry):
    from perturb.core import regularized_argmax
    seen = {}

    @register_solver(_Base, Entropy, backward=("unroll", "analytic"), description="test solver")
    def solve(w, structure, regularizer, tau, backward):
        seen.update(structure=structure, regularizer=regularizer, tau=tau, backward=backward)
        return torch.softmax(w / tau, -1)

    w = torch.randn(2, 3)
    regularized_argmax(w, _Child(), tau=0.5)
    assert seen == dict(structure=_Child(), regularizer=Entropy(), tau=0.5, backward="unroll")
    regularized_argmax(w, _Child(), Entropy(), backward="analytic")
    assert seen["backward"] == "analytic"  # "auto" resolves to the first registered mode


def test_missing_pair_lists_registered(registry):
    register_solver(_Base, Entropy)(_solver(1))
    with pytest.raises(NotImplementedError) as info:
        get_solver(_Child(), BinaryEntropy())
    msg = str(info.value)
    assert "_Child" in msg and "BinaryEntropy" in msg
    assert "(_Base, Entropy)" in msg and "(Simplex, Entropy)" in msg


def test_register_unsupported(registry):
    register_unsupported(_Base, SquaredNorm, "needs an oracle we do not have")
    with pytest.raises(NotImplementedError, match="not supported: needs an oracle"):
        get_solver(_Child(), SquaredNorm())
    info = {(p.structure, p.regularizer): p for p in registered_pairs()}[("_Base", "SquaredNorm")]
    assert not info.supported and info.backward == ()
    assert "needs an oracle" in info.description
    # unsupported pairs are not offered as alternatives in the "missing" message
    with pytest.raises(NotImplementedError) as err:
        get_solver(_Base(), BinaryEntropy())
    assert "(_Base, SquaredNorm)" not in str(err.value)


def test_registered_pairs_listing(registry):
    register_solver(_Base, Entropy, backward=("implicit", "unroll"), description="d")(_solver(1))
    pairs = registered_pairs()
    assert pairs == sorted(pairs, key=lambda p: (p.structure, p.regularizer))
    mine = [p for p in pairs if p.structure == "_Base"]
    assert len(mine) == 1
    assert mine[0].backward == ("implicit", "unroll", "finite_difference")
    assert mine[0].description == "d" and mine[0].supported
    # the simplex pairs of perturb.categorical are there
    names = {(p.structure, p.regularizer) for p in pairs}
    assert {("Simplex", "Entropy"), ("Simplex", "SquaredNorm"),
            ("Simplex", "ExpFamilyEntropy")} <= names


def test_register_bad_arguments(registry):
    with pytest.raises(ValueError, match="unknown backward mode"):
        register_solver(_Base, Entropy, backward=("magic",))
    with pytest.raises(ValueError, match="unknown backward mode"):
        register_solver(_Base, Entropy, backward=("auto",))
    with pytest.raises(TypeError, match="Structure"):
        register_solver(int, Entropy)
    with pytest.raises(TypeError, match="Regularizer"):
        register_unsupported(_Base, str, "x")
