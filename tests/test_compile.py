"""torch.compile: no graph breaks in the hot paths, no recompilation when τ changes.

A host read of a tensor value (``.item()``, ``bool(t)``) breaks a compiled graph. Value checks
become ``torch._assert_async`` under compilation (:mod:`perturb._validation`), so the functions
below compile to one graph with validation on and off; a bad value still raises (a
RuntimeError with the check's message). τ given as a 0-dim tensor is a graph input, and the
``perturb.nn`` layers pass theirs as a buffer, so a temperature schedule compiles once.
"""
import pytest
import torch
import torch._dynamo.testing

import perturb
from perturb import structured
from perturb.nn import GumbelSoftmax, LinearSchedule, StochasticSoftmax

X = torch.randn(4, 6)
W = torch.randn(3, 5, 5, requires_grad=True)

CASES = {
    "gumbel_softmax": lambda: perturb.gumbel_softmax(X, 0.5),
    "gaussian_softmax": lambda: perturb.gaussian_softmax(X, 0.5),
    "softmax": lambda: perturb.softmax(X, tau=0.5),
    "sparsemax": lambda: perturb.sparsemax(X),
    "relax simplex": lambda: perturb.relax(X, tau=0.5),
    "relax ksubset": lambda: perturb.relax(X, structured.KSubset(2), tau=0.5),
    "relaxed_topk": lambda: structured.relaxed_topk(X, 2, tau=0.5),
    "ksubset_marginals": lambda: structured.ksubset_marginals(X, 2),
    "sinkhorn": lambda: structured.sinkhorn(W, tau=0.5),
    "sinkhorn unroll": lambda: structured.sinkhorn(W, tau=0.5, n_iters=30, backward="unroll"),
    "gumbel_sinkhorn": lambda: structured.gumbel_sinkhorn(W, tau=0.5),
    "relax permutations": lambda: perturb.relax(W, structured.Permutations(), tau=0.5),
    "spanning_tree_marginals": lambda: structured.spanning_tree_marginals(W),
    "arborescence_marginals": lambda: structured.arborescence_marginals(W, root=1),
    "relax spanning trees": lambda: perturb.relax(W, structured.SpanningTrees(), tau=0.5),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # torch._dynamo.explain switches torch.distributions' argument validation off
    # process-wide (torch/_dynamo/eval_frame.py); later tests rely on torch's default
    validate = torch.distributions.Distribution._validate_args
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.distributions.Distribution.set_default_validate_args(validate)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_no_graph_breaks(name, validate):
    with perturb.set_validation(validate):
        explanation = torch._dynamo.explain(CASES[name])()
    reasons = [str(b.reason).splitlines()[0] for b in explanation.break_reasons]
    assert explanation.graph_break_count == 0, reasons
    assert explanation.graph_count == 1


def test_bad_value_still_raises_under_compile():
    f = torch.compile(lambda x: perturb.gumbel_softmax(x, 0.5), backend="eager")
    with perturb.set_validation(True), pytest.raises(RuntimeError, match="logits contains NaN"):
        f(torch.full((2, 3), float("nan")))
    assert torch.is_grad_enabled()  # the failed graph did not leave a no_grad region open


@pytest.mark.parametrize("fn", [
    lambda x, t: perturb.gumbel_softmax(x, t),
    lambda x, t: perturb.relax(x, structured.KSubset(2), tau=t),
])
def test_tensor_tau_compiles_once(fn):
    counter = torch._dynamo.testing.CompileCounter()
    f = torch.compile(fn, backend=counter)
    for tau in (1.0, 0.9, 0.8, 0.5, 0.1):
        f(X, torch.tensor(tau))
    assert counter.frame_count == 1


@pytest.mark.parametrize("make", [
    lambda s: GumbelSoftmax(schedule=s),
    lambda s: StochasticSoftmax(structured.KSubset(2), schedule=s),
])
def test_layer_schedule_does_not_recompile(make):
    layer = make(LinearSchedule(1.0, 0.1, 9))
    counter = torch._dynamo.testing.CompileCounter()
    f = torch.compile(layer, backend=counter)
    for _ in range(9):
        y = f(X)
        layer.step()
    assert counter.frame_count == 1
    # the compiled layer used the current τ: same sample as the eager layer at that τ
    layer.generator = torch.Generator().manual_seed(0)
    a = f(X)
    layer.generator = torch.Generator().manual_seed(0)
    torch.testing.assert_close(a, layer(X))
    assert y.shape == X.shape and layer.tau == pytest.approx(0.1)


def test_compiled_sinkhorn_matches_eager():
    # under compilation the iterations are a traced while_loop (plain log-domain blocks)
    w = torch.randn(2, 6, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 6, 6, dtype=torch.float64)
    f = torch.compile(lambda w: structured.sinkhorn(w, tau=0.3, tol=1e-10), backend="eager",
                      fullgraph=True)
    compiled = f(w)
    (grad_compiled,) = torch.autograd.grad((compiled * g).sum(), w)
    eager = structured.sinkhorn(w, tau=0.3, tol=1e-10)
    (grad_eager,) = torch.autograd.grad((eager * g).sum(), w)
    torch.testing.assert_close(compiled, eager, atol=1e-9, rtol=0)
    torch.testing.assert_close(grad_compiled, grad_eager, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(compiled.sum(-1), torch.ones(2, 6, dtype=torch.float64),
                               atol=1e-10, rtol=0)


@pytest.mark.parametrize("fn", [
    lambda w: structured.spanning_tree_marginals(w, tau=0.7),
    lambda w: structured.arborescence_marginals(
        w, root=2, lengths=torch.tensor([6, 4]), mask=torch.ones(6, 6, dtype=torch.bool)),
])
def test_compiled_tree_marginals_match_eager(fn):
    # under compilation the marginals are one custom operator (the eager solve inside) and
    # the backward a second one: the same numbers, value and gradient
    w = 20 * torch.randn(2, 6, 6, dtype=torch.float64)   # peaked: the fallback tiers run too
    w.requires_grad_(True)
    g = torch.randn(2, 6, 6, dtype=torch.float64)
    compiled = torch.compile(fn, backend="eager", fullgraph=True)(w)
    (grad_compiled,) = torch.autograd.grad((compiled * g).sum(), w)
    eager = fn(w)
    (grad_eager,) = torch.autograd.grad((eager * g).sum(), w)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.testing.assert_close(grad_compiled, grad_eager, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda g: GumbelSoftmax(tau=0.5, generator=g),
                                  lambda g: StochasticSoftmax(structured.KSubset(2), tau=0.5,
                                                              generator=g)])
def test_layers_compile_in_one_graph_without_a_generator_and_break_at_its_draw_with_one(make):
    """No generator: one graph, no break. A generator cannot enter a dynamo graph: its draw
    runs eagerly, one break per frame of the call stack (at most 3), and the compiled layer
    gives the eager layer's values for the same generator state."""
    layer = make(None)
    explanation = torch._dynamo.explain(layer)(X)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    layer = make(torch.Generator().manual_seed(0))
    explanation = torch._dynamo.explain(layer)(X)
    reasons = [str(b.reason).splitlines()[0] for b in explanation.break_reasons]
    assert explanation.graph_break_count <= 3, reasons
    assert all("disable" in r or "skip" in r.lower() for r in reasons), reasons
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager")
    layer.generator = torch.Generator().manual_seed(5)
    got = compiled(X)
    layer.generator = torch.Generator().manual_seed(5)
    torch.testing.assert_close(got, layer(X))
