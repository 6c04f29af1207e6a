"""Same generator state, bit-identical results on the CPU: every random public function.

Which functions are random is read off their signatures: every public callable (and every public
method or constructor of a public class) of the packages' ``__all__`` lists that takes a
``generator`` or ``seed`` argument needs an entry in ``CASES``, so a random function added later
fails here until it is covered. Each case runs twice from the same seed and returns its outputs
and, where the function is differentiable, gradients; they must be equal bit for bit
(``torch.equal``), not merely close. Random relaxations are also covered per registered pair.
The CUDA side (which paths are not deterministic there and the switch that makes them so) is in
docs/core.md, "Reproducibility".
"""
from __future__ import annotations

import importlib
import inspect
import warnings

import networkx as nx
import pytest
import torch

import perturb
from perturb import registered_pairs, regularizers as regs
from perturb.structured import KSubset, SinkhornConvergenceWarning, SpanningTrees
from perturb.structures import Simplex

from _specs import SPECS

MODULES = ["perturb", "perturb.structured", "perturb.boxes", "perturb.boxes.datasets",
           "perturb.boxes.hierarchy", "perturb.boxes.distributed", "perturb.boxes.losses",
           "perturb.checks", "perturb.nn", "perturb.latent", "perturb.noise",
           "perturb.distributions"]
HERE = "tests/test_reproducibility.py"


def _random_callables() -> dict[str, object]:
    """'module:qualname' -> callable, for public callables taking ``generator`` or ``seed``."""
    found = {}
    for m in MODULES:
        mod = importlib.import_module(m)
        # `perturb` is public but outside __all__ (a star import must not rebind the package)
        for name in [*getattr(mod, "__all__", []), *(["perturb"] if m == "perturb" else [])]:
            obj = getattr(mod, name)
            targets = []
            if inspect.isclass(obj):
                for attr, f in vars(obj).items():
                    if attr == "__init__" or not attr.startswith("_"):
                        targets.append(f)
            elif callable(obj):
                targets.append(obj)
            for f in targets:
                f = getattr(f, "__func__", f)
                try:
                    params = inspect.signature(f).parameters
                except (TypeError, ValueError):
                    continue
                if "generator" in params or "seed" in params:
                    found[f.__qualname__] = f
    return found


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _grad_of(fn, *inputs):
    """Outputs and the gradients of a fixed random linear functional of them."""
    inputs = [x.clone().requires_grad_() for x in inputs]
    y = fn(*inputs)
    c = torch.randn(y.shape, generator=_gen(99), dtype=y.dtype)
    grads = torch.autograd.grad((c * y).sum(), inputs, allow_unused=True)
    return (y.detach(), *[g for g in grads if g is not None])


W = torch.randn(3, 6, generator=_gen(0), dtype=torch.float64)
M = torch.randn(2, 5, 5, generator=_gen(1), dtype=torch.float64)
W7 = torch.randn(3, 7, generator=_gen(2), dtype=torch.float64)   # correlated k-subsets, d = 4


def _noise_case(noise):
    return lambda s: (noise.sample((4, 5), generator=_gen(s)),)


def _vae_case(method):
    def run(s):
        torch.manual_seed(0)
        vae = perturb.latent.CategoricalVAE(n_obs=16, n_latents=3, n_categories=4, hidden=8)
        x = (torch.rand(5, 16, generator=_gen(3)) < 0.5).float()
        loss = getattr(vae, method)(x, n_samples=2, generator=_gen(s))
        if not loss.requires_grad:          # iw_elbo is an evaluation bound (no_grad)
            return (loss,)
        grads = torch.autograd.grad(loss.sum(), list(vae.parameters()), allow_unused=True)
        return (loss.detach(), *[g for g in grads if g is not None])
    return run


def _graph_vae_case(method):
    def run(s):
        torch.manual_seed(0)
        outs = []
        for latent in ("tree", "independent", "topk"):
            vae = perturb.latent.GraphLayoutVAE(5, latent, hidden=8, n_steps=2).double()
            x = perturb.latent.make_graph_layout(3, 5, 2, generator=_gen(3),
                                                 dtype=torch.float64).trajectories
            if method == "elbo":
                y = vae.elbo(x, generator=_gen(s)).elbo
            else:
                y = vae.sample_graph(vae.edge_scores(x), generator=_gen(s))
            grads = torch.autograd.grad(y.sum(), list(vae.parameters()), allow_unused=True)
            outs += [y.detach(), *[g for g in grads if g is not None]]
        return tuple(outs)
    return run


def _listops_case(method):
    def run(s):
        out = []
        for graph in ("arborescence", "independent"):
            torch.manual_seed(0)
            model = perturb.latent.LatentListOpsModel(graph, dim=8)
            b = perturb.latent.make_listops(4, max_length=12, generator=_gen(0))
            y = getattr(model, method)(b.tokens, b.lengths, generator=_gen(s))
            y = y[0] if isinstance(y, tuple) else y
            grads = torch.autograd.grad(y.sum(), list(model.parameters()), allow_unused=True)
            out += [y.detach(), *[g for g in grads if g is not None]]
        return tuple(out)
    return run


def _layer_case(make):
    def run(s):
        layer = make(_gen(s))
        return _grad_of(layer, W)
    return run


def _train_case(s):
    graph = nx.balanced_tree(2, 3, create_using=nx.DiGraph).reverse()
    result = perturb.boxes.train_hierarchy(graph, dim=2, epochs=3, batch_size=8,
                                           negatives_per_positive=2, seed=s, progress=False)
    return tuple(p.detach() for p in result.model.parameters())


def _distributed_case(s):
    # the seed reaches the distributed trainer through its HierarchyConfig
    graph = nx.balanced_tree(2, 2, create_using=nx.DiGraph).reverse()
    config = perturb.boxes.hierarchy.HierarchyConfig(dim=2, epochs=2, batch_size=4,
                                                     negatives_per_positive=1, seed=s)
    result = perturb.boxes.distributed.train_hierarchy_distributed(graph, config=config,
                                                                   world_size=2)
    return tuple(p.detach() for p in result.model.parameters())


def _trainer_case(s):
    h = perturb.boxes.hierarchy
    graph = nx.balanced_tree(2, 3, create_using=nx.DiGraph).reverse()
    config = h.HierarchyConfig(dim=2, epochs=1, batch_size=4, negatives_per_positive=2)
    model = h.BoxHierarchyModel(graph.number_of_nodes(), 2, generator=_gen(0))
    pos = h.edge_index(graph)
    known = perturb.boxes.losses.PairSet(pos, model.num_nodes, include_self=True)
    trainer = h.Trainer(model, pos, known, config, _gen(s))
    trainer.run_epoch()
    return tuple(p.detach() for p in model.parameters())


def _split_case(s):
    graph = perturb.boxes.hierarchy.random_dag(40, seed=0)
    split = perturb.boxes.hierarchy.dasgupta_split(graph, 0.1, eval_fraction=0.2, seed=s)
    return split.train, split.val, split.test_pairs


def _nested_case(s):
    graph = perturb.boxes.hierarchy.random_tree(30, seed=0)
    box = perturb.boxes.hierarchy.nested_boxes(30, perturb.boxes.hierarchy.edge_index(graph), 3,
                                               generator=_gen(s))
    return box.lower, box.upper


def _checks_case(name):
    def run(s):
        noise = perturb.Normal()
        if name == "identify":
            p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
            out = perturb.checks.identify(p, noise, n_samples=256, n_reps=2, max_iter=3,
                                          generator=_gen(s))
            return (out.theta,)
        report = getattr(perturb.checks, name)(noise, 3, n_samples=256, n_reps=2,
                                               generator=_gen(s))
        return tuple(torch.as_tensor(v) for v in report.details.values()
                     if isinstance(v, (torch.Tensor, float)))
    return run


def _argmax(u):
    return torch.nn.functional.one_hot(u.argmax(-1), u.shape[-1]).to(u.dtype)


CASES = {
    "perturb": lambda s: (perturb.perturb(W, perturb.Gumbel(), generator=_gen(s)),),
    "relax": lambda s: _grad_of(lambda w: perturb.relax(w, tau=0.5, generator=_gen(s)), W),
    "gumbel_softmax": lambda s: _grad_of(
        lambda w: perturb.gumbel_softmax(w, 0.5, hard=True, generator=_gen(s)), W),
    "gaussian_softmax": lambda s: _grad_of(
        lambda w: perturb.gaussian_softmax(w, 0.5, generator=_gen(s)), W),
    "perturbed": lambda s: _grad_of(
        lambda w: perturb.perturbed(_argmax, w, n_samples=8, generator=_gen(s)), W),
    "fenchel_young_loss": lambda s: _grad_of(
        lambda w: perturb.fenchel_young_loss(_argmax, w, _argmax(W), n_samples=8,
                                             generator=_gen(s)).reshape(1), W),
    "PerturbedOptimizer.__init__": lambda s: _grad_of(
        perturb.PerturbedOptimizer(_argmax, n_samples=8, generator=_gen(s)), W),
    "Noise.sample": _noise_case(perturb.Logistic()),
    "Gumbel.sample": _noise_case(perturb.Gumbel(2.0)),
    "Normal.sample": _noise_case(perturb.Normal(0.5)),
    "NegativeExponential.sample": _noise_case(perturb.NegativeExponential(0.3)),
    "Uniform.sample": _noise_case(perturb.Uniform()),
    "Discrete.sample": _noise_case(perturb.Discrete([-1.0, 0.0, 2.0], [0.2, 0.5, 0.3])),
    "gumbel_sinkhorn": lambda s: _grad_of(
        lambda w: perturb.structured.gumbel_sinkhorn(w, 0.5, generator=_gen(s)), M),
    "sample_ksubset": lambda s: (perturb.structured.sample_ksubset(W, 2, n_samples=5,
                                                                   generator=_gen(s)),),
    "sample_correlated_topk": lambda s: (perturb.structured.sample_correlated_topk(
        W7, 2, n_samples=5, generator=_gen(s)),),
    "sample_spanning_tree": lambda s: (perturb.structured.sample_spanning_tree(
        M, n_samples=5, generator=_gen(s)),),
    "sample_arborescence": lambda s: (perturb.structured.sample_arborescence(
        M, root=1, n_samples=5, generator=_gen(s)),),
    "GibbsDistribution.sample": lambda s: (
        perturb.distributions.KSubsetDistribution(W, 2).sample((5,), generator=_gen(s)),
        perturb.distributions.SpanningTreeDistribution(M).sample((5,), generator=_gen(s)),
        perturb.distributions.ArborescenceDistribution(M, root=1).sample(
            (5,), generator=_gen(s))),
    "PerturbedStructure.sample": lambda s: tuple(
        perturb.distributions.PerturbedStructure(w, st).sample((5,), generator=_gen(s))
        for w, st in ((W, Simplex()), (W, KSubset(2)), (M, SpanningTrees()))),
    "PerturbedStructure.rsample": lambda s: _grad_of(
        lambda w: perturb.distributions.PerturbedStructure(w, KSubset(2), tau=0.5).rsample(
            (3,), generator=_gen(s)), W),
    "RelaxedPerturbedStructure.rsample": lambda s: _grad_of(
        lambda w: perturb.distributions.RelaxedPerturbedStructure(
            w, KSubset(2), tau=0.5).rsample((3,), generator=_gen(s)), W),
    "RelaxedPerturbedStructure.sample": lambda s: (
        perturb.distributions.RelaxedPerturbedStructure(W, Simplex(), perturb.Normal(),
                                                        tau=0.5).sample((3,), generator=_gen(s)),),
    "StochasticSoftmax.__init__": _layer_case(
        lambda g: perturb.nn.StochasticSoftmax(tau=0.5, generator=g)),
    "GumbelSoftmax.__init__": _layer_case(lambda g: perturb.nn.GumbelSoftmax(0.5, generator=g)),
    "GaussianSoftmax.__init__": _layer_case(
        lambda g: perturb.nn.GaussianSoftmax(0.5, generator=g)),
    "BoxEmbedding.__init__": lambda s: tuple(
        p.detach() for p in perturb.boxes.BoxEmbedding(7, 3, generator=_gen(s)).parameters()),
    "BoxHierarchyModel.__init__": lambda s: tuple(
        p.detach() for p in perturb.boxes.BoxHierarchyModel(7, 3, generator=_gen(s))
        .parameters()),
    "sample_negatives": lambda s: (perturb.boxes.sample_negatives(
        torch.tensor([[0, 1], [2, 3], [4, 1]]), 6, 3, generator=_gen(s)),),
    "train_hierarchy": _train_case,
    "HierarchyConfig.__init__": _distributed_case,
    "Trainer.__init__": _trainer_case,
    "dasgupta_split": _split_case,
    "nested_boxes": _nested_case,
    "initial_model": lambda s: (perturb.boxes.hierarchy.initial_model(
        30, list(range(30)), perturb.boxes.hierarchy.HierarchyConfig(dim=3, initializer="nested"),
        perturb.boxes.hierarchy.edge_index(perturb.boxes.hierarchy.random_tree(30, seed=0)),
        _gen(s)).embedding.param1.detach(),),
    "resolve_generator": lambda s: (torch.rand(4, generator=perturb.boxes.hierarchy.
                                               resolve_generator(seed=s)),),
    "random_dag": lambda s: (torch.tensor(sorted(perturb.boxes.datasets.random_dag(
        30, seed=s).edges)),),
    "random_tree": lambda s: (torch.tensor(sorted(perturb.boxes.datasets.random_tree(
        30, seed=s).edges)),),
    "split_hierarchy": lambda s: tuple(
        torch.as_tensor(v) for v in perturb.boxes.datasets.split_hierarchy(
            perturb.boxes.datasets.random_dag(30, seed=0), 0.3, seed=s)
        if isinstance(v, torch.Tensor)),
    "check_completeness": _checks_case("check_completeness"),
    "check_minimality": _checks_case("check_minimality"),
    "identify": _checks_case("identify"),
    "CategoricalVAE.elbo": _vae_case("elbo"),
    "CategoricalVAE.iw_elbo": _vae_case("iw_elbo"),
    "binarized_digits": lambda s: perturb.latent.binarized_digits(generator=_gen(s)),
    "make_nonlinear_ica": lambda s: tuple(
        v for v in perturb.latent.make_nonlinear_ica(
            n_sources=2, n_segments=3, n_per_segment=10, d_obs=4, generator=_gen(s))
        if isinstance(v, torch.Tensor)),
    "perturbed_binary": lambda s: _grad_of(
        lambda w: perturb.latent.perturbed_binary(w, 0.5, generator=_gen(s)), W),
    "random_trees": lambda s: (perturb.latent.random_trees(4, 6, generator=_gen(s)),),
    "make_graph_layout": lambda s: tuple(
        perturb.latent.make_graph_layout(3, 5, 2, generator=_gen(s))),
    "GraphLayoutVAE.sample_graph": _graph_vae_case("sample_graph"),
    "GraphLayoutVAE.elbo": _graph_vae_case("elbo"),
    "make_listops": lambda s: tuple(perturb.latent.make_listops(20, generator=_gen(s))),
    "LatentListOpsModel.latent_graph": _listops_case("latent_graph"),
    "LatentListOpsModel.forward": _listops_case("forward"),
}

RANDOM = _random_callables()


def test_every_random_public_function_has_a_case():
    missing = sorted(set(RANDOM) - set(CASES))
    assert not missing, (f"random public callables without a reproducibility case: {missing}; "
                         f"add them to CASES in {HERE}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_generator_state_same_bits(name):
    if name not in RANDOM:
        pytest.fail(f"{name} is not a random public callable (renamed?): update CASES in {HERE}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornConvergenceWarning)
        first, second = CASES[name](11), CASES[name](11)
        other = CASES[name](12)
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        assert torch.equal(a, b), f"{name}: two runs from one seed differ"
    # and the seed matters (the case really is random)
    assert any(not torch.equal(a, b) for a, b in zip(first, other)), f"{name}: seed ignored"


#: instance and event shape per structure, from tests/_specs.py
STRUCTURES = {name: sp.repro() for name, sp in SPECS.items()}
PAIRS = [p for p in registered_pairs() if p.supported]


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p.structure}-{p.regularizer}" for p in PAIRS])
def test_relax_every_pair_same_bits(pair, hard):
    if pair.structure not in STRUCTURES:
        pytest.fail(f"no case for structure {pair.structure!r}: add a spec to SPECS in "
                    f"tests/_specs.py")
    structure, event = STRUCTURES[pair.structure]
    theta = torch.randn(2, *event, generator=_gen(5), dtype=torch.float64)
    reg = getattr(regs, pair.regularizer)()

    def run(s):
        return _grad_of(lambda t: perturb.relax(t, structure, perturb.Logistic(), reg, tau=0.5,
                                                hard=hard, n_samples=2, generator=_gen(s)),
                        theta)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornConvergenceWarning)
        first, second = run(3), run(3)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


SAMPLERS = {"sample_ksubset": ["w", "k"], "sample_correlated_topk": ["w", "k"],
            "sample_spanning_tree": ["w"], "sample_arborescence": ["w", "root"]}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_sampler_takes_one_argument_order(name):
    """(w, [k or root,] n_samples, generator, *, tau, ...): ``sample_ksubset(w, 5, 10)`` and
    ``sample_spanning_tree(w, 10)`` both mean 10 samples, τ is keyword-only."""
    sig = inspect.signature(getattr(perturb.structured, name))
    positional = [p.name for p in sig.parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == SAMPLERS[name] + ["n_samples", "generator"]
    assert sig.parameters["tau"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_old_sampler_orders_keep_their_meaning_for_one_release():
    """The old positional orders, (w, k, tau, n_samples, generator) for subsets and τ, mask, ...
    after generator for trees, give the same samples as the keywords, with a FutureWarning at
    the caller's line."""
    for old, new in [
        (lambda: perturb.structured.sample_ksubset(W, 2, 0.5, 4, _gen(3)),
         lambda: perturb.structured.sample_ksubset(W, 2, 4, _gen(3), tau=0.5)),
        (lambda: perturb.structured.sample_correlated_topk(W7, 2, 0.5, 4, _gen(3)),
         lambda: perturb.structured.sample_correlated_topk(W7, 2, 4, _gen(3), tau=0.5)),
        (lambda: perturb.structured.sample_spanning_tree(M, 4, _gen(3), 0.5),
         lambda: perturb.structured.sample_spanning_tree(M, 4, _gen(3), tau=0.5)),
        (lambda: perturb.structured.sample_arborescence(M, 1, 4, _gen(3), 0.5, None, None,
                                                        "conditional"),
         lambda: perturb.structured.sample_arborescence(M, 1, 4, _gen(3), tau=0.5,
                                                        method="conditional")),
    ]:
        with pytest.warns(FutureWarning, match="is deprecated") as caught:
            a = old()
        assert all(w.filename == __file__ for w in caught)
        assert torch.equal(a, new())
    assert perturb.structured.sample_ksubset(W, 2, 10).shape == (10, *W.shape)
    with pytest.raises(TypeError, match="tau"):
        perturb.structured.sample_ksubset(W, 2, 4, None, 0.5)
