"""torch.func: vmap and jacrev (and jacfwd where there is a forward-mode rule) agree with the
batched calls and with autograd.

Solver Functions either carry a generated vmap rule (plain torch ops) or fold the vmapped dim
into their batch (:mod:`perturb._vmap`); value checks are skipped inside the transforms and
data-dependent shortcuts take their general path (:func:`perturb._validation.reads_stall`).
"""
import pytest
import torch
from torch.func import jacfwd, jacrev, vmap

import perturb
from perturb import structured

G = torch.Generator().manual_seed(0)
X = torch.randn(3, 4, 6, dtype=torch.float64, generator=G)
W = torch.randn(3, 4, 5, 5, dtype=torch.float64, generator=G)

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


def test_vmap_tree_marginals_with_lengths_and_mask():
    w = torch.randn(3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([6, 5, 4])
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.2
    mask = mask | mask.T

    def fn(x, n):
        return structured.arborescence_marginals(x, lengths=n, mask=mask)
    torch.testing.assert_close(vmap(fn)(w, lengths), fn(w, lengths))
