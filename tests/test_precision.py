"""The precision policy (perturb/_precision.py): float16 / bfloat16 in, the same dtype out.

Every supported pair of the registry (a pair registered later is picked up and fails until it
has a spec in tests/_specs.py) is run on half-precision scores, relaxed and hard, forward and
backward, and inside a CPU autocast region with scores from a Linear layer; box volumes
likewise. The reference is the float32 computation on the *same* (exactly upcast) inputs, so the
only error allowed is the rounding of the output to the half dtype:
|y − y32| ≤ 2 ε_half · max(1, |y32|) (ε the dtype's machine epsilon, two roundings: the result
and, for composite paths, one intermediate). Gradients must be finite, in the input's dtype,
and equal to the float32 gradient to 4 ε_half relative to its largest entry.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import perturb
from perturb import boxes, regularized_argmax, registered_pairs, relax
from perturb import regularizers as regs
from perturb._precision import LOW_PRECISION, full_precision, upcast, working_dtype
from perturb.structured import SinkhornConvergenceWarning, Transport
from perturb.structures import Simplex

from _specs import SPECS

SUPPORTED = [p for p in registered_pairs() if p.supported]
HALF = [torch.bfloat16, torch.float16]
HERE = "tests/test_precision.py"

#: structure name -> (structure with default solver settings, event shape), from
#: tests/_specs.py
CASES = {name: sp.half for name, sp in SPECS.items()}


def _ids(pairs):
    return [f"{p.structure}-{p.regularizer}" for p in pairs]


def _case(pair):
    if pair.structure not in CASES:
        pytest.fail(f"no precision case for structure {pair.structure!r}: add a spec to SPECS "
                    f"in tests/_specs.py")
    structure, event = CASES[pair.structure]()
    return structure, getattr(regs, pair.regularizer)(), event


def _eps(dtype):
    return torch.finfo(dtype).eps


def _assert_rounding_close(y, ref, dtype, factor=2.0):
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    bound = factor * _eps(dtype) * ref.abs().clamp(min=1.0)
    err = (y.float() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g} > {factor} eps_half"


# --------------------------------------------------------------------------------------------
# the decorator
# --------------------------------------------------------------------------------------------

def test_working_dtype_and_upcast():
    assert working_dtype(torch.bfloat16) == torch.float32
    assert working_dtype(torch.float16) == torch.float32
    assert working_dtype(torch.float64) == torch.float64
    x = torch.ones(2, dtype=torch.float32)
    assert upcast(x) is x
    assert upcast(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert upcast(3) == 3


def test_full_precision_casts_and_disables_autocast():
    seen = {}

    @full_precision
    def f(x, y=None):
        seen["dtype"] = x.dtype
        seen["autocast"] = torch.is_autocast_enabled("cpu")
        return x * 2, torch.ones(1, dtype=torch.int64)

    x = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    out, idx = f(x)
    assert seen == {"dtype": torch.float32, "autocast": False}
    assert out.dtype == torch.bfloat16 and idx.dtype == torch.int64
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    x32 = torch.ones(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = f(x32)
    assert seen == {"dtype": torch.float32, "autocast": False}
    assert out.dtype == torch.float32
    f(torch.ones(3, dtype=torch.float64))
    assert seen["dtype"] == torch.float64


# --------------------------------------------------------------------------------------------
# every registered pair
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_registered_pair_in_half_precision(pair, dtype):
    structure, regularizer, event = _case(pair)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, *event, generator=gen).to(dtype).requires_grad_()
    x32 = x.detach().float().requires_grad_()
    c = torch.randn(3, *event, generator=gen)
    y = regularized_argmax(x, structure, regularizer, tau=0.5)
    ref = regularized_argmax(x32, structure, regularizer, tau=0.5)
    _assert_rounding_close(y, ref.detach(), dtype)
    (y.float() * c).sum().backward()
    (ref * c).sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
    scale = x32.grad.abs().max().clamp(min=1.0)
    err = (x.grad.float() - x32.grad).abs().max()
    assert err <= 4 * _eps(dtype) * scale, f"gradient error {err:.3g}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_registered_pair_hard_in_half_precision(pair, dtype):
    """Straight-through: the exact argmax (scipy / numpy for some structures) takes half
    scores too, and returns a vertex in the input dtype."""
    structure, regularizer, event = _case(pair)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, *event, generator=gen).to(dtype).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornConvergenceWarning)
        y = relax(x, structure, regularizer=regularizer, tau=0.5, hard=True,
                  generator=torch.Generator().manual_seed(2))
    assert y.dtype == dtype
    if isinstance(structure, Transport):                       # vertices are not 0/1
        assert structure.check(y.detach()).all()
    else:
        assert torch.equal(y.detach(), y.detach().round())    # a vertex
    y.float().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_registered_pair_under_cpu_autocast(pair):
    """Scores from a Linear layer in a bfloat16 autocast region: a bfloat16 result equal to the
    float32 solve of the same scores up to rounding, finite float32 parameter gradients."""
    structure, regularizer, event = _case(pair)
    torch.manual_seed(0)
    layer = torch.nn.Linear(event[-1], event[-1])
    inputs = torch.randn(3, *event)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w = layer(inputs)
        y = regularized_argmax(w, structure, regularizer, tau=0.5)
    assert w.dtype == torch.bfloat16
    ref = regularized_argmax(w.detach().float(), structure, regularizer, tau=0.5)
    _assert_rounding_close(y, ref, torch.bfloat16)
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    assert torch.isfinite(layer.weight.grad).all()


# --------------------------------------------------------------------------------------------
# the public functions outside the registry
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["sinkhorn", "ksubset_marginals", "spanning_tree_marginals",
                                  "arborescence_marginals"])
def test_structured_functions_in_half_precision(name, dtype):
    fn = {
        "sinkhorn": lambda w: perturb.structured.sinkhorn(w, tau=0.3),
        "ksubset_marginals": lambda w: perturb.structured.ksubset_marginals(w, 3),
        "spanning_tree_marginals": perturb.structured.spanning_tree_marginals,
        "arborescence_marginals": perturb.structured.arborescence_marginals,
    }[name]
    x = torch.randn(4, 7, 7, generator=torch.Generator().manual_seed(3)).to(dtype)
    _assert_rounding_close(fn(x), fn(x.float()), dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("method", ["hard", "soft", "gumbel", "gumbel-approx"])
def test_box_volume_in_half_precision(method, dtype):
    """The Bessel volume has no half kernels: computed in float32, returned in the dtype."""
    gen = torch.Generator().manual_seed(4)
    lower = torch.randn(8, 5, generator=gen)
    upper = lower + torch.rand(8, 5, generator=gen) + 0.1
    kw = {"hard": dict(), "soft": dict(temperature=0.5),
          "gumbel": dict(beta=0.1), "gumbel-approx": dict(beta=0.1, approx=True)}[method]
    lo, up = lower.to(dtype).requires_grad_(), upper.to(dtype).requires_grad_()
    v = boxes.volume(boxes.Box(lo, up), log=True, **kw)
    ref = boxes.volume(boxes.Box(lo.detach().float(), up.detach().float()), log=True, **kw)
    _assert_rounding_close(v, ref, dtype)
    v.float().sum().backward()
    assert lo.grad.dtype == dtype and torch.isfinite(lo.grad).all()


def test_box_containment_under_cpu_autocast():
    torch.manual_seed(5)
    layer = torch.nn.Linear(6, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = layer(torch.randn(10, 6))
        a = boxes.Box.from_center_offset(h[:5, :6], h[:5, 6:].abs() + 0.5)
        b = boxes.Box.from_center_offset(h[5:, :6], h[5:, 6:].abs() + 0.5)
        p = boxes.log_containment_prob(a, b, beta=0.1)
    assert p.dtype == torch.bfloat16 and torch.isfinite(p).all()
    p.float().sum().backward()
    assert torch.isfinite(layer.weight.grad).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pair", SUPPORTED, ids=_ids(SUPPORTED))
def test_registered_pair_under_cuda_autocast(pair):
    structure, regularizer, event = _case(pair)
    torch.manual_seed(0)
    layer = torch.nn.Linear(event[-1], event[-1]).cuda()
    inputs = torch.randn(3, *event, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        w = layer(inputs)
        y = regularized_argmax(w, structure, regularizer, tau=0.5)
    assert w.dtype == torch.float16
    ref = regularized_argmax(w.detach().float(), structure, regularizer, tau=0.5)
    _assert_rounding_close(y, ref, torch.float16)
    y.float().sum().backward()
    assert torch.isfinite(layer.weight.grad).all()


def test_low_precision_list():
    assert set(LOW_PRECISION) == {torch.float16, torch.bfloat16}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["gumbel_softmax", "gaussian_softmax", "softmax", "sparsemax",
                                  "relax"])
def test_simplex_functions_in_half_precision(name, dtype):
    """The simplex entry points keep the dtype; the noise is drawn in it (as torch's
    F.gumbel_softmax does), and the sample equals the solve of the same perturbed scores."""
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(6)).to(dtype)
    x.requires_grad_()
    fn = {
        "gumbel_softmax": lambda v, g: perturb.gumbel_softmax(v, 0.5, generator=g),
        "gaussian_softmax": lambda v, g: perturb.gaussian_softmax(v, 0.5, generator=g),
        "softmax": lambda v, g: perturb.softmax(v, tau=0.5),
        "sparsemax": lambda v, g: perturb.sparsemax(v),
        "relax": lambda v, g: relax(v, noise=perturb.Gumbel(), tau=0.5, generator=g),
    }[name]
    y = fn(x, torch.Generator().manual_seed(7))
    assert y.dtype == dtype and torch.isfinite(y).all()
    noise = {"gumbel_softmax": perturb.Gumbel(), "gaussian_softmax": perturb.Normal(),
             "relax": perturb.Gumbel()}.get(name)
    reg = regs.SquaredNorm() if name == "sparsemax" else regs.Entropy()
    u = x.detach() if noise is None else perturb.perturb(
        x.detach(), noise, generator=torch.Generator().manual_seed(7))
    assert u.dtype == dtype
    ref = regularized_argmax(u.float(), Simplex(), reg, tau=1.0 if name == "sparsemax" else 0.5)
    _assert_rounding_close(y.detach(), ref, dtype)
    y.float().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
