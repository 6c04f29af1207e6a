"""The contract every registered (structure, regularizer) pair must meet, driven by the registry.

For each pair listed by :func:`perturb.registered_pairs` (so new registrations are tested
automatically): shapes, dtypes and finiteness of the regularized argmax; batched equals looped;
the output lies in conv Z (checked through the support function of Z's enumerated vertices);
every backward mode the pair lists agrees with its first (native) mode; bad inputs raise
ValueError. Each structure's exact ``argmax`` is checked against brute-force enumeration.
Unsupported pairs must raise NotImplementedError with their reason. A structure whose solvers are
still stubs (NotImplementedError("in progress")) is skipped, not passed.
"""
import math

import pytest
import torch

import perturb
from perturb import registered_pairs, regularized_argmax
from perturb import regularizers as regs
from _specs import SPECS

#: one small example per structure type, from the one spec per structure in tests/_specs.py
EXAMPLES = {name: sp.example for name, sp in SPECS.items()}
TAU = 0.7
PAIRS = registered_pairs()
SUPPORTED = [p for p in PAIRS if p.supported]
UNSUPPORTED = [p for p in PAIRS if not p.supported]


def _ids(pairs):
    return [f"{p.structure}-{p.regularizer}" for p in pairs]


def _example(name):
    if name not in EXAMPLES:
        pytest.fail(f"no example input for structure {name!r}: add one to SPECS in "
                    f"tests/_specs.py")
    return EXAMPLES[name]()


def _regularizer(name):
    return getattr(regs, name)()


def _scores(event_shape, batch=(2, 3), dtype=torch.float64, seed=0):
    return torch.randn(*batch, *event_shape, dtype=dtype,
                       generator=torch.Generator().manual_seed(seed))


def _run(fn, *args, **kwargs):
    """Call fn; a stub still "in progress" skips the test instead of failing it."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        if "in progress" in str(err):
            pytest.skip(f"stub: {err}")
        raise


def test_registry_is_not_empty():
    assert len(SUPPORTED) >= 3
    assert {p.structure for p in PAIRS} <= set(EXAMPLES), "add examples for new structures"


@pytest.mark.filterwarnings("ignore:sinkhorn did not converge")  # tol=1e-12 is below float32
@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_contract(pair, dtype):
    structure, event = _example(pair.structure)
    reg = _regularizer(pair.regularizer)
    w = _scores(event, dtype=dtype)
    y = _run(regularized_argmax, w, structure, reg, TAU)
    assert y.shape == w.shape and y.dtype == dtype and y.device == w.device
    assert bool(torch.isfinite(y).all())
    # batched equals looped
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-8, rtol=1e-7)
    for i in (0, 1):
        for j in (0, 2):
            torch.testing.assert_close(y[i, j], regularized_argmax(w[i, j], structure, reg, TAU),
                                       **tol)


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_output_in_convex_hull(pair):
    """x ∈ conv Z iff ⟨d, x⟩ ≤ max_z ⟨d, z⟩ for every direction d (support function)."""
    structure, event = _example(pair.structure)
    y = _run(regularized_argmax, _scores(event), structure, _regularizer(pair.regularizer), TAU)
    verts = _run(structure.enumerate, event[-1], dtype=torch.float64)
    d = torch.randn(200, *event, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dims = tuple(range(-len(event), 0))
    support = (d.unsqueeze(1) * verts.unsqueeze(0)).sum(dims).amax(-1)  # (200,)
    value = (d.unsqueeze(1).unsqueeze(1) * y.unsqueeze(0)).sum(dims)     # (200, 2, 3)
    assert bool((value <= support[:, None, None] + 1e-6).all())


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_backward_modes_agree(pair):
    """Every listed backward mode gives the gradient of the first (native) one. Finite
    differences (ε = 1e-3, float64) carry an O(ε²) truncation error: tolerance 1e-4."""
    structure, event = _example(pair.structure)
    reg = _regularizer(pair.regularizer)
    w = _scores(event, batch=(2,), seed=3).requires_grad_()
    c = _scores(event, batch=(2,), seed=4)
    grads = {}
    for mode in pair.backward:
        y = _run(regularized_argmax, w, structure, reg, TAU, backward=mode)
        (grads[mode],) = torch.autograd.grad((y * c).sum(), w)
        assert bool(torch.isfinite(grads[mode]).all()), mode
    native = pair.backward[0]
    for mode, g in grads.items():
        torch.testing.assert_close(g, grads[native], atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"{mode} vs {native}: {m}")


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_bad_input_contract(pair):
    structure, event = _example(pair.structure)
    reg = _regularizer(pair.regularizer)
    w = _scores(event)
    cases = [
        (dict(tau=0.0), w, "tau"),
        (dict(tau=-1.0), w, "tau"),
        (dict(), torch.where(w > 0.5, math.nan, w), "w"),
        (dict(), w.long(), "w"),
        (dict(), torch.zeros(event[:-1]), "w"),
        (dict(backward="no-such-mode"), w, "backward"),
    ]
    if len(event) == 2:   # a matrix of the wrong shape: not square, or not the marginals' sizes
        cases.append((dict(), torch.zeros(2, event[0], event[1] + 1),
                      "square" if structure.square else "shape"))
    for kwargs, bad, match in cases:
        with pytest.raises(ValueError, match=match):
            _run(regularized_argmax, bad, structure, reg, **kwargs)


@pytest.mark.parametrize("name", sorted({p.structure for p in PAIRS}))
def test_exact_argmax_is_brute_force(name):
    structure, event = _example(name)
    w = _scores(event, batch=(6,), seed=5)
    y = _run(perturb.argmax, w, structure)
    assert y.shape == w.shape and y.dtype == w.dtype
    assert bool(structure.check(y).all())
    verts = _run(structure.enumerate, event[-1], dtype=torch.float64)
    dims = tuple(range(-len(event), 0))
    best = (w.unsqueeze(1) * verts.unsqueeze(0)).sum(dims).amax(-1)
    torch.testing.assert_close((w * y).sum(dims), best)


@pytest.mark.parametrize("pair", UNSUPPORTED, ids=_ids(UNSUPPORTED))
def test_unsupported_pairs_explain(pair):
    structure, event = _example(pair.structure)
    reason = pair.description.removeprefix("unsupported: ")
    with pytest.raises(NotImplementedError, match="not supported") as info:
        regularized_argmax(_scores(event), structure, _regularizer(pair.regularizer))
    assert reason[:40] in str(info.value)
