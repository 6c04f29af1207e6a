"""torch.func: vmap and jacrev (and jacfwd where there is a forward-mode rule) agree with the
batched calls and with autograd.

Solver Functions either carry a generated vmap rule (plain torch ops) or fold the vmapped dim
into their batch (:mod:`perturb._vmap`); value checks are skipped inside the transforms and
data-dependent shortcuts take their general path (:func:`perturb._validation.reads_stall`).
"""
import pytest
import torch
from torch.func import functional_call, grad, jacfwd, jacrev, vmap

import perturb
from perturb import structured
from perturb.boxes import (Box, BoxEmbedding, containment_prob, expected_volume, intersection,
                           join, log1m_containment_prob, log_containment_prob, overlap, volume)
from perturb.noise import Gumbel, Logistic, NegativeExponential, Normal, Uniform

G = torch.Generator().manual_seed(0)
X = torch.randn(3, 4, 6, dtype=torch.float64, generator=G)
W = torch.randn(3, 4, 5, 5, dtype=torch.float64, generator=G)
X7 = torch.randn(3, 4, 7, dtype=torch.float64, generator=G)       # correlated top-k: 2d − 1

CASES = {
    "softmax": (lambda x: perturb.softmax(x, tau=0.5), X, True),
    "sparsemax": (lambda x: perturb.sparsemax(x), X, True),
    "relax simplex entropy": (lambda x: perturb.regularized_argmax(x, tau=0.7), X, True),
    "ksubset_marginals": (lambda x: structured.ksubset_marginals(x, 2), X, False),
    "relaxed_topk": (lambda x: structured.relaxed_topk(x, 2, tau=0.5), X, False),
    "ksubset binary entropy": (lambda x: perturb.regularized_argmax(
        x, structured.KSubset(2), perturb.BinaryEntropy()), X, False),
    "sinkhorn": (lambda w: structured.sinkhorn(w, n_iters=200), W, False),
    "spanning_tree_marginals": (lambda w: structured.spanning_tree_marginals(w), W, False),
    "arborescence_marginals": (lambda w: structured.arborescence_marginals(w, root=1), W, False),
    "peaked arborescence_marginals": (
        lambda w: structured.arborescence_marginals(20 * w), W, False),
    # the log-partition functions, whose gradients are the marginals above
    "ksubset_log_partition": (lambda x: structured.ksubset_log_partition(x, 2), X, False),
    "correlated_topk_log_partition": (
        lambda x: structured.correlated_topk_log_partition(x, 2), X7, False),
    "dag_path_log_partition": (lambda w: structured.dag_path_log_partition(w), W, False),
    "spanning_tree_log_partition": (lambda w: structured.spanning_tree_log_partition(w), W,
                                    False),
    "arborescence_log_partition": (
        lambda w: structured.arborescence_log_partition(w, root=1), W, False),
    "peaked arborescence_log_partition": (
        lambda w: structured.arborescence_log_partition(20 * w), W, False),
}


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_equals_the_batched_call(name, validate):
    fn, x, _ = CASES[name]
    with perturb.set_validation(validate):
        torch.testing.assert_close(vmap(fn)(x), fn(x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_jacobians_match_autograd(name):
    fn, x, forward_mode = CASES[name]
    x0 = x[0]
    expected = torch.autograd.functional.jacobian(fn, x0)
    torch.testing.assert_close(jacrev(fn)(x0), expected)
    assert float(expected.abs().sum()) > 0
    if forward_mode:
        torch.testing.assert_close(jacfwd(fn)(x0), expected)


LOG_PARTITIONS = sorted(k for k in CASES if k.endswith("log_partition"))


@pytest.mark.parametrize("name", LOG_PARTITIONS)
def test_per_example_gradients_of_log_partitions(name):
    """vmap(grad(log Z)), the per-example gradient idiom, equals autograd's gradient of the
    batched call (the marginals), and jacrev(jacrev(log Z)) autograd's Hessian."""
    fn, x, _ = CASES[name]
    leaf = x.clone().requires_grad_(True)
    expected, = torch.autograd.grad(fn(leaf).sum(), leaf)
    torch.testing.assert_close(vmap(grad(lambda a: fn(a).sum()))(x), expected)
    x0 = x[0, 0]
    hess = torch.autograd.functional.hessian(fn, x0)
    assert float(hess.abs().sum()) > 0
    torch.testing.assert_close(jacrev(jacrev(fn))(x0), hess)


def test_vmap_tree_marginals_with_lengths_and_mask():
    w = torch.randn(3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([6, 5, 4])
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.2
    mask = mask | mask.T

    def fn(x, n):
        return structured.arborescence_marginals(x, lengths=n, mask=mask)
    torch.testing.assert_close(vmap(fn)(w, lengths), fn(w, lengths))


# --------------------------------------------------------------------------------------------
# the random functions under vmap: randomness="different" and "same" (and torch's error mode)
# --------------------------------------------------------------------------------------------

R = torch.randn(6, dtype=torch.float64, generator=G).expand(4, 6).contiguous()   # equal rows
RM = torch.randn(5, 5, dtype=torch.float64, generator=G).expand(4, 5, 5).contiguous()
R7 = torch.randn(7, dtype=torch.float64, generator=G).expand(4, 7).contiguous()
SAMPLERS = {
    "perturb gumbel": (lambda v: perturb.perturb(v), R),
    "perturb normal": (lambda v: perturb.perturb(v, perturb.Normal()), R),
    "perturb logistic": (lambda v: perturb.perturb(v, perturb.Logistic()), R),
    "perturb uniform": (lambda v: perturb.perturb(v, perturb.Uniform()), R),
    "perturb discrete": (lambda v: perturb.perturb(v, perturb.Discrete([-1.0, 0.0, 2.0])), R),
    "gumbel_softmax": (lambda v: perturb.gumbel_softmax(v, tau=0.5), R),
    "gaussian_softmax": (lambda v: perturb.gaussian_softmax(v, tau=0.5), R),
    "relax hard": (lambda v: perturb.relax(v, tau=0.5, hard=True), R),
    "relax ksubset": (lambda v: perturb.relax(v, structured.KSubset(2), tau=0.5), R),
    "gumbel_sinkhorn": (lambda v: structured.gumbel_sinkhorn(v, tau=0.5), RM),
    "perturbed": (lambda v: perturb.perturbed(perturb.Simplex().argmax, v, n_samples=5), R),
    "sample_ksubset": (lambda v: structured.sample_ksubset(v, 2, 3), R),
    "sample_correlated_topk": (lambda v: structured.sample_correlated_topk(v, 2, 3), R7),
    "sample_spanning_tree": (lambda v: structured.sample_spanning_tree(v, 3), RM),
    "sample_arborescence": (lambda v: structured.sample_arborescence(v, 1, 3), RM),
    "PerturbedStructure.rsample": (lambda v: perturb.distributions.PerturbedStructure(
        v, perturb.Simplex(), tau=0.5).rsample((3,)), R),
    "KSubsetDistribution.sample": (lambda v: perturb.distributions.KSubsetDistribution(
        v, 2).sample((3,)), R),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_samplers_vmap_with_different_and_same_randomness(name):
    """On equal rows, randomness="same" gives equal samples and "different" does not (the
    draws are independent), with the shapes of the batched call; vmap's default mode refuses
    the random call, as it does for torch's own samplers."""
    fn, x = SAMPLERS[name]
    batched = fn(x)
    if batched.shape[0] == 3:                 # a leading sample dim: vmap's dim comes first
        batched = batched.movedim(1, 0)
    for randomness in ("same", "different"):
        torch.manual_seed(0)
        out = vmap(fn, randomness=randomness)(x)
        assert out.shape == batched.shape
        rows = [out[i] for i in range(4)]
        equal = all(torch.equal(rows[0], r) for r in rows[1:])
        assert equal == (randomness == "same"), (name, randomness)
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(fn)(x)


# --------------------------------------------------------------------------------------------
# boxes: the volumes, expected volumes of 1 to 3 boxes and containment functions, every model
# --------------------------------------------------------------------------------------------

INF = float("inf")
# rows: overlapping the fixed box, nested in it, disjoint (30 noise scales apart), unbounded
BOX_LO = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.2, 0.25], [3.0, 3.0, 3.0], [-INF, 0.1, 0.2]],
                      dtype=torch.float64)
BOX_UP = torch.tensor([[1.0, 1.5, 0.8], [0.6, 0.7, 0.55], [4.0, 4.0, 4.0], [0.9, INF, 0.7]],
                      dtype=torch.float64)
FIXED = Box(torch.tensor([0.1, -0.2, 0.2], dtype=torch.float64),
            torch.tensor([0.9, 1.2, 0.8], dtype=torch.float64))
THIRD = Box(torch.tensor([0.2, 0.0, 0.1], dtype=torch.float64),
            torch.tensor([1.1, 0.9, 0.7], dtype=torch.float64))
BOX_MODELS = {"hard": {}, "soft": {"temperature": 0.3}, "beta": {"beta": 0.1},
              "Gumbel": {"noise": Gumbel(0.1)}, "Normal": {"noise": Normal(0.1)},
              "Logistic": {"noise": Logistic(0.1)}, "Uniform": {"noise": Uniform(-0.1, 0.1)},
              "NegativeExponential": {"noise": NegativeExponential(0.1)}}


def _box_cases() -> dict:
    """name → (fn of the vmapped box's corners ``(3,)``, whether the unbounded row applies)."""
    cases = {}
    for model, kw in BOX_MODELS.items():
        cases[f"volume {model}"] = (lambda lo, up, kw=kw: volume(Box(lo, up), log=True, **kw),
                                    False)
        for fn in (containment_prob, log_containment_prob, log1m_containment_prob, overlap):
            cases[f"{fn.__name__} {model}"] = (
                lambda lo, up, fn=fn, kw=kw: fn(Box(lo, up), FIXED, **kw), True)
        for fn in (log_containment_prob, log1m_containment_prob):     # the vmapped box inside
            cases[f"{fn.__name__} of it {model}"] = (
                lambda lo, up, fn=fn, kw=kw: fn(FIXED, Box(lo, up), **kw), True)
        if model in ("soft", "beta"):
            continue
        for m in (1, 2, 3):
            cases[f"expected_volume {m} {model}"] = (
                lambda lo, up, m=m, kw=kw: expected_volume(
                    *(Box(lo, up), FIXED, THIRD)[:m], log=m != 2, **kw), False)
    for model, beta in (("hard", None), ("beta", 0.1)):
        cases[f"intersection {model}"] = (lambda lo, up, beta=beta: _corners(
            intersection(Box(lo, up), FIXED, beta=beta)), True)
    cases["join"] = (lambda lo, up: _corners(join(Box(lo, up), FIXED)), True)
    return cases


def _corners(box: Box) -> torch.Tensor:
    return torch.cat([box.lower, box.upper], -1)


BOX_CASES = _box_cases()


def _box_rows(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = slice(None) if BOX_CASES[name][1] else slice(0, 3)
    return BOX_LO[rows], BOX_UP[rows]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("name", sorted(BOX_CASES))
def test_boxes_vmap_equals_the_batched_call(name, validate):
    fn, _ = BOX_CASES[name]
    lo, up = _box_rows(name)
    with perturb.set_validation(validate):
        torch.testing.assert_close(vmap(fn)(lo, up), fn(lo, up))


@pytest.mark.parametrize("name", sorted(k for k in BOX_CASES if not k.startswith(
    ("intersection", "join"))))
def test_boxes_per_example_gradients(name):
    """vmap(grad(·)) equals autograd's gradient of the batched call, row by row (finite: no
    NaN leaks from the branches a transform computes for every row)."""
    fn, _ = BOX_CASES[name]
    lo, up = _box_rows(name)
    leaves = lo.clone().requires_grad_(True), up.clone().requires_grad_(True)
    expected = torch.autograd.grad(fn(*leaves).sum(), leaves)
    got = vmap(grad(fn, argnums=(0, 1)))(lo, up)
    torch.testing.assert_close(got, expected)
    assert all(bool(torch.isfinite(g).all()) for g in got)


@pytest.mark.parametrize("name", sorted(BOX_CASES))
def test_boxes_jacobians_match_autograd(name):
    """jacrev at an overlapping and a nested pair (the near-nesting branches) equals
    autograd's jacobian."""
    fn, _ = BOX_CASES[name]
    total = 0.0
    for row in (0, 1):
        x = BOX_LO[row], BOX_UP[row]
        expected = torch.autograd.functional.jacobian(fn, x)
        torch.testing.assert_close(jacrev(fn, argnums=(0, 1))(*x), expected)
        total += sum(float(e.abs().sum()) for e in expected)
    assert total > 0


@pytest.mark.parametrize("name", sorted(k for k in BOX_CASES if not k.startswith(
    ("intersection", "join"))))
def test_boxes_far_apart_under_vmap(name):
    """Corners at 1e4 against boxes near 0 (inverted by 1e5 noise scales): vmap and
    vmap(grad) stay finite and agree with the batched call (the quadrature models run the
    eager engine, folded into one node, so they agree to the bit)."""
    fn, _ = BOX_CASES[name]
    lo = torch.tensor([[1e4, 0.0, 0.0], [-1e4, -1e4, 0.0]], dtype=torch.float64)
    up = lo + torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    out = vmap(fn)(lo, up)
    torch.testing.assert_close(out, fn(lo, up))
    leaves = lo.clone().requires_grad_(True), up.clone().requires_grad_(True)
    expected = torch.autograd.grad(fn(*leaves).sum(), leaves)
    got = vmap(grad(fn, argnums=(0, 1)))(lo, up)
    assert all(bool(torch.isfinite(g).all()) for g in got)
    torch.testing.assert_close(got, expected)


def test_box_embedding_per_example_gradients():
    """The per-example gradients of the embedding's parameters (functional_call under
    vmap(grad)) equal autograd's, pair by pair."""
    torch.manual_seed(0)
    emb = BoxEmbedding(8, 3).double()
    ids = torch.tensor([[1, 2], [3, 4], [5, 1]])
    params = {k: v.detach() for k, v in emb.named_parameters()}

    def loss(p, pair):
        boxes = functional_call(emb, p, (pair,))
        return log_containment_prob(boxes[0], boxes[1], noise=Gumbel(0.1))

    got = vmap(grad(loss), in_dims=(None, 0))(params, ids)
    for i, pair in enumerate(ids):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        expected = torch.autograd.grad(loss(leaves, pair), list(leaves.values()))
        for k, e in zip(leaves, expected):
            torch.testing.assert_close(got[k][i], e)
