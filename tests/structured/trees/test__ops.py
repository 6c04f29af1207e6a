"""perturb/structured/trees/_ops.py: the tree marginals as custom operators (torch.compile,
torch.func), against brute-force enumeration and the eager Function, with a float64 gradcheck
of the backward operator."""
import pytest
import torch

from perturb.structured.trees import _ops
from perturb.structured.trees._graph_input import _prepare
from perturb.structured.trees._matrix_tree import analytic_marginals as _analytic_marginals
from perturb.structured.trees.structures import enumerate_arborescences

pytestmark = pytest.mark.skipif(not _ops.AVAILABLE, reason="needs torch.library.custom_op")


def _args(w, root):
    s, valid, nodes, root = _prepare(w, 1.0, None, None, root, False)
    return s, valid, nodes, root


@pytest.mark.parametrize("scale", [1.0, 20.0])      # 20: the fallback tiers run as well
def test_operator_equals_enumeration_and_the_eager_function(scale):
    n, root = 5, 2
    w = scale * torch.randn(3, n, n, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(0))
    args = _args(w, root)
    mu = _ops.TracedMarginals.apply(*args)
    torch.testing.assert_close(mu, _analytic_marginals(*args), rtol=0, atol=0)
    trees = enumerate_arborescences(n, root, dtype=torch.float64)       # (N, n, n)
    scores = (trees * w.unsqueeze(1)).sum((-1, -2))                       # (3, N)
    p = torch.softmax(scores, -1)
    torch.testing.assert_close(mu, torch.einsum("bt,tij->bij", p, trees), rtol=0, atol=1e-10)


def test_backward_operator_gradcheck():
    w = torch.randn(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    s, valid, nodes, root = _args(w, 0)
    s = s.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: _ops.TracedMarginals.apply(x, valid, nodes, root), (s,))


def test_vmap_rules_fold_into_the_batch():
    w = torch.randn(3, 2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    args = _args(w, 1)
    valid, nodes, root = args[1:]
    g = torch.randn_like(w)

    def marginals(x):
        return _ops.TracedMarginals.apply(x, valid[0], nodes, root)

    torch.testing.assert_close(torch.func.vmap(marginals)(args[0]), marginals(args[0]))
    # the backward operator under vmap: one VJP per vmapped cotangent (what jacrev does)
    s0 = args[0][0]
    _, vjp = torch.func.vjp(marginals, s0)
    batched = torch.func.vmap(vjp)(g)[0]
    looped = torch.stack([vjp(gi)[0] for gi in g])
    torch.testing.assert_close(batched, looped)
