"""The cases and exclusions of the CUDA-against-CPU parity harness (:mod:`gpu_check_parity`).

A case builds its inputs on the CPU, runs one function (or several related ones) of the public
API and returns its outputs; :data:`EXCLUDED` names the public names with no case and why. The
harness runs each case on both devices and compares.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

import perturb

F32, F64 = torch.float32, torch.float64


def _flatten(obj: Any, path: str = "out") -> list[tuple[str, Any]]:
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, (bool, int, float)):
        return [(path, obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "lower") and hasattr(obj, "upper") and not isinstance(obj, dict):
        obj = {"lower": obj.lower, "upper": obj.upper}
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _flatten(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _flatten(v, f"{path}[{i}]")]
    return []



# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One parity case.

    ``inputs(g, dtype)`` builds CPU tensors (``g`` a seeded CPU generator); ``fn(x)`` runs on a
    dict of those tensors moved to the device (float ones cast to the case dtype) and returns
    tensors or containers of them; ``grad`` names the inputs differentiated. ``covers`` lists
    the public names the case exercises (qualified, ``perturb.structured.sinkhorn``).
    """

    name: str
    covers: tuple[str, ...]
    inputs: Callable[[torch.Generator, torch.dtype], dict[str, Any]]
    fn: Callable[[dict[str, Any]], Any]
    grad: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = (F64, F32)
    tol: dict | None = None
    note: str = ""


def _r(g, *shape, dtype=F64, scale=1.0):
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def _u(g, *shape, dtype=F64, low=0.0, high=1.0):
    return low + (high - low) * torch.rand(*shape, generator=g, dtype=dtype)


def _theta(*shape, scale=1.0):
    return lambda g, dt: {"w": _r(g, *shape, dtype=dt, scale=scale)}


def _gen(x: torch.Tensor) -> torch.Generator:
    """A generator on ``x``'s device (redirected to the CPU stream by :class:`CpuRandom`)."""
    return torch.Generator(device=x.device).manual_seed(0)


def _boxes(g, dt, n=6, d=4, prefix=""):
    lo = _r(g, n, d, dtype=dt)
    return {prefix + "lo": lo, prefix + "side": _u(g, n, d, dtype=dt, low=0.3, high=2.0)}


def _box(x, prefix=""):
    from perturb.boxes import Box
    return Box(x[prefix + "lo"], x[prefix + "lo"] + x[prefix + "side"])


def _two_boxes(g, dt):
    return {**_boxes(g, dt), **_boxes(g, dt, prefix="b_")}


_BOX_GRAD = ("lo", "side", "b_lo", "b_side")


def _module_case(name, covers, make, inputs, call, grad=("x",), **kw) -> Case:
    """A module built on the CPU from a fixed seed, then moved to the device and dtype; its
    outputs, and the gradients of its parameters (of ⟨cotangent, outputs⟩) as more outputs."""
    def fn(x):
        torch.manual_seed(0)
        m = make()
        ref = next(iter(x.values()))
        dtype = next((v.dtype for v in x.values() if isinstance(v, torch.Tensor)
                      and v.is_floating_point()), kw.get("dtypes", (F64,))[0])
        m = m.to(device=ref.device, dtype=dtype)
        out = call(m, x)
        terms = [(t * torch.randn(t.shape, dtype=t.dtype).to(t.device)).sum()
                 for _, t in _flatten(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        params = [q for q in m.parameters() if q.requires_grad]
        if not terms or not params:
            return out
        grads = torch.autograd.grad(sum(terms), params, retain_graph=True, allow_unused=True)
        return [out, {"param_grads": [g for g in grads if g is not None]}]
    return Case(name, covers, inputs, fn, grad, **kw)


def _cases() -> list[Case]:
    P = "perturb."
    S = "perturb.structured."
    B = "perturb.boxes."
    H = "perturb.boxes.hierarchy."
    L = "perturb.latent."
    N = "perturb.nn."
    D = "perturb.distributions."
    import perturb.boxes as boxes
    import perturb.boxes.hierarchy as hier
    import perturb.distributions as dist
    import perturb.latent as latent
    import perturb.nn as pnn
    import perturb.structured as st
    from perturb import noise as nz

    tight = {F64: (1e-10, 1e-8), F32: (2e-4, 2e-3)}
    cases = [
        # ---------------- core and the simplex ----------------
        Case("softmax", (P + "softmax",), _theta(4, 7), lambda x: perturb.softmax(x["w"], tau=0.7),
             ("w",)),
        Case("sparsemax", (P + "sparsemax",), _theta(4, 7),
             lambda x: perturb.sparsemax(x["w"], tau=0.7), ("w",)),
        Case("sparsemax_loss", (P + "sparsemax_loss",),
             lambda g, dt: {"w": _r(g, 5, 6, dtype=dt),
                            "y": torch.randint(0, 6, (5,), generator=g)},
             lambda x: perturb.sparsemax_loss(x["w"], x["y"]), ("w",)),
        Case("gumbel_softmax", (P + "gumbel_softmax",), _theta(4, 7),
             lambda x: [perturb.gumbel_softmax(x["w"], tau=0.5, generator=_gen(x["w"])),
                        perturb.gumbel_softmax(x["w"], tau=0.5, hard=True,
                                               generator=_gen(x["w"]))], ("w",)),
        Case("gaussian_softmax", (P + "gaussian_softmax",), _theta(4, 7),
             lambda x: perturb.gaussian_softmax(x["w"], tau=0.5, generator=_gen(x["w"])),
             ("w",)),
        Case("argmax", (P + "argmax", P + "Simplex", S + "Permutations", S + "KSubset"),
             _theta(3, 5, 5),
             lambda x: [perturb.argmax(x["w"]), perturb.argmax(x["w"], st.Permutations()),
                        perturb.argmax(x["w"], st.KSubset(2))]),
        Case("regularized_argmax",
             (P + "regularized_argmax", P + "Entropy", P + "SquaredNorm", P + "Regularizer"),
             _theta(3, 6),
             lambda x: [perturb.regularized_argmax(x["w"], tau=0.5),
                        perturb.regularized_argmax(x["w"], regularizer=perturb.SquaredNorm(),
                                                   tau=0.5)], ("w",)),
        Case("relax", (P + "relax", P + "Gumbel", P + "Structure"), _theta(3, 6),
             lambda x: [perturb.relax(x["w"], noise=perturb.Gumbel(), tau=0.5, n_samples=4,
                                      generator=_gen(x["w"])),
                        perturb.relax(x["w"], noise=perturb.Gumbel(), tau=0.5, hard=True,
                                      generator=_gen(x["w"]))], ("w",)),
        Case("relax_binary_entropy", (P + "BinaryEntropy",), _theta(3, 6),
             lambda x: perturb.relax(x["w"], st.KSubset(2), regularizer=perturb.BinaryEntropy(),
                                     tau=0.5), ("w",)),
        Case("relax_expfamily", (P + "ExpFamilyEntropy",), _theta(3, 6),
             lambda x: perturb.relax(x["w"], st.KSubset(2),
                                     regularizer=perturb.ExpFamilyEntropy(), tau=0.5), ("w",)),
        *[Case(f"noise_{cls.__name__}", (P + cls.__name__,) + extra, _theta(3, 5),
               (lambda c: lambda x: [
                   c().sample((3, 5), generator=_gen(x["w"]), device=x["w"].device,
                              dtype=x["w"].dtype),
                   perturb.relax(x["w"], noise=c(), tau=0.5, n_samples=3,
                                 generator=_gen(x["w"]))])(cls), ("w",))
          for cls, extra in ((nz.Normal, (P + "Gaussian", P + "Noise")), (nz.Logistic, ()),
                             (nz.NegativeExponential, ()), (nz.Uniform, ()))],
        Case("noise_Discrete", (P + "Discrete",), _theta(3, 5),
             lambda x: perturb.relax(x["w"], noise=nz.Discrete([-1.0, 0.0, 2.0]), tau=0.5,
                                     n_samples=3, generator=_gen(x["w"])), ("w",)),
        Case("perturbed", (P + "perturbed", P + "perturbed_optimizer", P + "PerturbedOptimizer"),
             _theta(3, 5),
             lambda x: [perturb.perturbed(perturb.Simplex(), x["w"], n_samples=8,
                                          generator=_gen(x["w"])),
                        perturb.PerturbedOptimizer(perturb.Simplex(), n_samples=8,
                                                   generator=_gen(x["w"]))(x["w"]),
                        perturb.perturbed_optimizer(n_samples=8, generator=_gen(x["w"]))(
                            lambda t: torch.nn.functional.one_hot(
                                t.argmax(-1), t.shape[-1]).to(t.dtype))(x["w"])], ("w",)),
        Case("fenchel_young_loss", (P + "fenchel_young_loss",),
             lambda g, dt: {"w": _r(g, 3, 5, dtype=dt),
                            "y": torch.nn.functional.one_hot(
                                torch.randint(0, 5, (3,), generator=g), 5).to(dt)},
             lambda x: perturb.fenchel_young_loss(perturb.Simplex(), x["w"], x["y"],
                                                  n_samples=8, generator=_gen(x["w"])), ("w",)),
        Case("implicit_root", (P + "implicit_root",), _theta(3, 5),
             lambda x: perturb.implicit_root(
                 lambda y, t: y - torch.softmax(t, -1), torch.softmax(x["w"], -1).detach(),
                 x["w"]), ("w",)),
        Case("finite_difference_solve", (P + "finite_difference_solve",), _theta(3, 5),
             lambda x: perturb.finite_difference_solve(lambda t: torch.softmax(2 * t, -1),
                                                       x["w"]), ("w",),
             tol={F64: (1e-7, 1e-6), F32: (5e-3, 5e-2)},
             note="central differences: their rounding error is eps/h"),
        Case("straight_through", (P + "straight_through",), _theta(3, 5),
             lambda x: perturb.straight_through(
                 torch.nn.functional.one_hot(x["w"].argmax(-1), 5).to(x["w"].dtype),
                 torch.softmax(x["w"], -1)), ("w",)),
        # ---------------- permutations ----------------
        Case("sinkhorn", (S + "sinkhorn", S + "Transport"),
             lambda g, dt: {"w": _r(g, 3, 6, 6, dtype=dt), "a": _u(g, 3, 6, dtype=dt, low=0.5)},
             lambda x: [st.sinkhorn(x["w"], tau=0.3, tol=1e-12, n_iters=20000),
                        st.sinkhorn(x["w"], tau=0.3, tol=1e-12, n_iters=20000,
                                    a=x["a"], b=x["a"].flip(-1)),
                        perturb.relax(x["w"], st.Transport(x["a"], x["a"].flip(-1), tol=1e-12,
                                                           n_iters=20000), tau=0.3)],
             ("w", "a"), tol=tight, note="tol 1e-12: stopping points may differ by device"),
        Case("sinkhorn_padded", (S + "sinkhorn",),
             lambda g, dt: {"w": _r(g, 3, 7, 7, dtype=dt),
                            "mask": torch.tensor([7, 5, 6]).view(3, 1, 1).gt(
                                torch.arange(7).view(1, 7, 1))
                            & torch.tensor([7, 5, 6]).view(3, 1, 1).gt(
                                torch.arange(7).view(1, 1, 7))},
             lambda x: st.sinkhorn(x["w"], tau=0.3, tol=1e-12, n_iters=20000, mask=x["mask"]),
             ("w",), tol=tight, note="padded batch (the CUDA graphs' padded path)"),
        Case("gumbel_sinkhorn", (S + "gumbel_sinkhorn",), _theta(2, 5, 5),
             lambda x: st.gumbel_sinkhorn(x["w"], tau=0.5, n_samples=3, tol=1e-12,
                                          n_iters=20000, generator=_gen(x["w"])), ("w",),
             tol=tight),
        Case("matching", (S + "matching",), _theta(3, 6, 6), lambda x: st.matching(x["w"])),
        # ---------------- subsets ----------------
        Case("topk", (S + "topk",), _theta(3, 9), lambda x: st.topk(x["w"], 3)),
        Case("relaxed_topk", (S + "relaxed_topk",), _theta(3, 9),
             lambda x: [st.relaxed_topk(x["w"], 3, tau=0.5),
                        st.relaxed_topk(x["w"], 3, tau=0.5,
                                        regularizer=perturb.ExpFamilyEntropy())], ("w",)),
        Case("ksubset_dp", (S + "ksubset_log_partition", S + "ksubset_marginals"), _theta(3, 9),
             lambda x: [st.ksubset_log_partition(x["w"], 3, tau=0.7),
                        st.ksubset_marginals(x["w"], 3, tau=0.7)], ("w",)),
        Case("sample_ksubset", (S + "sample_ksubset",), _theta(3, 9),
             lambda x: st.sample_ksubset(x["w"], 3, n_samples=4, generator=_gen(x["w"]))),
        Case("correlated_topk", (S + "CorrelatedKSubset", S + "correlated_topk_argmax",
                                 S + "correlated_topk_log_partition",
                                 S + "correlated_topk_marginals", S + "sample_correlated_topk"),
             _theta(2, 11),
             lambda x: [st.correlated_topk_argmax(x["w"], 3),
                        st.correlated_topk_log_partition(x["w"], 3, tau=0.7),
                        st.correlated_topk_marginals(x["w"], 3, tau=0.7),
                        st.sample_correlated_topk(x["w"], 3, n_samples=3,
                                                  generator=_gen(x["w"])),
                        perturb.relax(x["w"], st.CorrelatedKSubset(3), tau=0.7)], ("w",)),
        # ---------------- trees ----------------
        Case("spanning_trees", (S + "SpanningTrees", S + "spanning_tree_marginals",
                                S + "spanning_tree_log_partition", S + "max_spanning_tree"),
             lambda g, dt: {"w": (lambda a: a + a.mT)(_r(g, 3, 6, 6, dtype=dt))},
             lambda x: [st.spanning_tree_marginals(x["w"], tau=0.7),
                        st.spanning_tree_log_partition(x["w"], tau=0.7),
                        st.max_spanning_tree(x["w"]),
                        perturb.relax(x["w"], st.SpanningTrees(), tau=0.7)], ("w",)),
        Case("arborescences", (S + "Arborescences", S + "arborescence_marginals",
                               S + "arborescence_log_partition", S + "max_arborescence"),
             _theta(3, 6, 6),
             lambda x: [st.arborescence_marginals(x["w"], tau=0.7),
                        st.arborescence_log_partition(x["w"], tau=0.7),
                        st.max_arborescence(x["w"]),
                        perturb.relax(x["w"], st.Arborescences(), tau=0.7)], ("w",)),
        # ---------------- paths ----------------
        Case("dag_paths", (S + "DAGPaths", S + "dag_path_log_partition"), _theta(3, 7, 7),
             lambda x: [st.dag_path_log_partition(x["w"], tau=0.7),
                        perturb.regularized_argmax(x["w"], st.DAGPaths(), tau=0.7),
                        perturb.argmax(x["w"], st.DAGPaths())], ("w",)),
        Case("sample_trees", (S + "sample_spanning_tree", S + "sample_arborescence"),
             lambda g, dt: {"w": (lambda a: a + a.mT)(_r(g, 2, 6, 6, dtype=dt))},
             lambda x: [st.sample_spanning_tree(x["w"], n_samples=3, generator=_gen(x["w"])),
                        st.sample_arborescence(x["w"], n_samples=3, generator=_gen(x["w"]))]),
        # ---------------- boxes ----------------
        Case("box_volumes", (B + "Box", B + "volume", B + "join", B + "intersection",
                             B + "gumbel_side_length", B + "log_gumbel_side_length"),
             _two_boxes,
             lambda x: [boxes.volume(_box(x), beta=0.3, log=True),
                        boxes.volume(_box(x)),
                        boxes.join(_box(x), _box(x, "b_")).lower,
                        boxes.intersection(_box(x), _box(x, "b_"), beta=0.3).upper,
                        boxes.gumbel_side_length(x["lo"], x["lo"] + x["side"], beta=0.3),
                        boxes.log_gumbel_side_length(x["lo"], x["lo"] + x["side"], beta=0.3)],
             _BOX_GRAD),
        Case("expected_volume", (B + "expected_volume",), _two_boxes,
             lambda x: [boxes.expected_volume(_box(x), _box(x, "b_"), noise=perturb.Gumbel(0.2),
                                              log=True),
                        boxes.expected_volume(_box(x), noise=perturb.Normal(0.2), log=True)],
             _BOX_GRAD),
        Case("containment", (B + "containment_prob", B + "log_containment_prob",
                             B + "log1m_containment_prob", B + "overlap", B + "containment_loss",
                             B + "overlap_loss", B + "volume_regularizer"), _two_boxes,
             lambda x: [boxes.containment_prob(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.log_containment_prob(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.log1m_containment_prob(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.overlap(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.containment_loss(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.overlap_loss(_box(x), _box(x, "b_"), beta=0.3),
                        boxes.volume_regularizer(_box(x), 1.0, beta=0.3)], _BOX_GRAD),
        Case("log1mexp", (B + "log1mexp",),
             lambda g, dt: {"w": -_u(g, 20, dtype=dt, low=1e-3, high=5.0)},
             lambda x: boxes.log1mexp(x["w"]), ("w",)),
        Case("sample_negatives", (B + "sample_negatives",),
             lambda g, dt: {"p": torch.randint(0, 12, (8, 2), generator=g)},
             lambda x: boxes.sample_negatives(x["p"], 12, 2, generator=_gen(x["p"]))),
        _module_case("box_embedding", (B + "BoxEmbedding",),
                     lambda: boxes.BoxEmbedding(10, 3),
                     lambda g, dt: {"ids": torch.randint(0, 10, (6,), generator=g)},
                     lambda m, x: [m(x["ids"]).lower, m(x["ids"]).upper], grad=()),
        _module_case("box_hierarchy_model",
                     (B + "BoxHierarchyModel", B + "evaluate", B + "all_pairs_f1",
                      H + "score_pairs", H + "score_all_pairs", H + "best_f1_threshold",
                      H + "nested_boxes"),
                     lambda: boxes.BoxHierarchyModel(8, 3),
                     lambda g, dt: {"pairs": torch.randint(0, 8, (10, 2), generator=g),
                                    "labels": torch.randint(0, 2, (10,), generator=g).bool()},
                     lambda m, x: [m(x["pairs"][:, 0]).lower,
                                   hier.score_pairs(m, x["pairs"]),
                                   hier.score_all_pairs(m),
                                   tuple(boxes.evaluate(m, x["pairs"], x["labels"]))[:3],
                                   tuple(boxes.all_pairs_f1(m, x["pairs"]))[:3],
                                   hier.nested_boxes(8, torch.tensor([[0, 1], [0, 2], [1, 3]],
                                                                  device=x["pairs"].device),
                                                     3, seed=0).lower],
                     grad=(), dtypes=(F32,),
                     note="scores compared; F1 read at the same threshold"),
        # ---------------- distributions ----------------
        Case("perturbed_structure", (D + "PerturbedStructure", D + "RelaxedPerturbedStructure"),
             _theta(3, 5),
             lambda x: [dist.PerturbedStructure(x["w"], perturb.Simplex()).sample((4,)),
                        dist.RelaxedPerturbedStructure(x["w"], perturb.Simplex(),
                                                       tau=0.5).rsample((4,))], ("w",)),
        Case("gibbs", (D + "GibbsDistribution", D + "KSubsetDistribution",
                       D + "SpanningTreeDistribution", D + "ArborescenceDistribution"),
             lambda g, dt: {"w": _r(g, 2, 6, dtype=dt),
                            "t": (lambda a: a + a.mT)(_r(g, 2, 5, 5, dtype=dt))},
             lambda x: [(lambda d: [d.mean, d.log_prob(d.sample((2,))), d.entropy()])(
                            dist.KSubsetDistribution(x["w"], 2)),
                        (lambda d: [d.mean, d.log_prob(d.sample((2,))), d.entropy()])(
                            dist.SpanningTreeDistribution(x["t"])),
                        (lambda d: [d.mean, d.log_prob(d.sample((2,))), d.entropy()])(
                            dist.ArborescenceDistribution(x["t"]))], ("w", "t")),
        # ---------------- nn ----------------
        Case("nn_layers", (N + "StochasticSoftmax", N + "GumbelSoftmax", N + "GaussianSoftmax",
                           N + "Sparsemax", N + "SparsemaxLoss"),
             lambda g, dt: {"w": _r(g, 4, 6, dtype=dt),
                            "y": torch.randint(0, 6, (4,), generator=g)},
             lambda x: [pnn.StochasticSoftmax(tau=0.5).eval()(x["w"]),
                        pnn.GumbelSoftmax(tau=0.5, generator=_gen(x["w"]))(x["w"]),
                        pnn.GaussianSoftmax(tau=0.5, generator=_gen(x["w"]))(x["w"]),
                        pnn.Sparsemax()(x["w"]), pnn.SparsemaxLoss()(x["w"], x["y"])], ("w",)),
        # ---------------- latent ----------------
        _module_case("categorical_vae", (L + "CategoricalVAE",),
                     lambda: latent.CategoricalVAE(12, 3, 4, hidden=16),
                     lambda g, dt: {"x": torch.rand(5, 12, generator=g, dtype=dt).round()},
                     lambda m, x: [m(x["x"]), m.elbo(x["x"], generator=_gen(x["x"]))]),
        _module_case("ivae", (L + "IVAE",), lambda: latent.IVAE(6, 2, 3, hidden=8),
                     lambda g, dt: {"x": _r(g, 5, 6, dtype=dt),
                                    "u": torch.randint(0, 3, (5,), generator=g)},
                     lambda m, x: m(x["x"], x["u"])),
        _module_case("subset_selector", (L + "SubsetSelector",),
                     lambda: latent.SubsetSelector(8, 3, 2, hidden=8),
                     lambda g, dt: {"x": _r(g, 5, 8, dtype=dt)},
                     lambda m, x: m.eval()(x["x"])),
        _module_case("graph_layout_vae", (L + "GraphLayoutVAE",),
                     lambda: latent.GraphLayoutVAE(5, hidden=8, n_steps=3),
                     lambda g, dt: {"x": _r(g, 2, 4, 5, 2, dtype=dt)},
                     lambda m, x: tuple(m.elbo(x["x"], generator=_gen(x["x"])))),
        _module_case("listops_model", (L + "LatentListOpsModel",),
                     lambda: latent.LatentListOpsModel(dim=8, n_rounds=2),
                     lambda g, dt: {"x": torch.randint(1, 10, (3, 6), generator=g),
                                    "len": torch.tensor([6, 4, 5])},
                     lambda m, x: m(x["x"], x["len"], generator=_gen(x["x"])), grad=(),
                     dtypes=(F32,)),
        Case("latent_functions", (L + "perturbed_binary", L + "correlation_matrix",
                                  L + "mean_corr_coef", L + "gumbel_kl",
                                  L + "force_directed_layout", L + "edge_precision_recall",
                                  L + "gold_arborescence", L + "arc_precision_recall"),
             lambda g, dt: {"w": _r(g, 20, 3, dtype=dt), "z": _r(g, 20, 3, dtype=dt),
                            "adj": (lambda a: (a + a.mT > 0.5).to(dt))(_r(g, 2, 5, 5, dtype=dt)),
                            "pos": _r(g, 2, 5, 2, dtype=dt),
                            "heads": torch.tensor([[0, 0, 1, 1], [0, 0, 0, 2]])},
             lambda x: [latent.perturbed_binary(x["w"], tau=0.5, generator=_gen(x["w"])),
                        latent.correlation_matrix(x["w"], x["z"]),
                        latent.mean_corr_coef(x["w"], x["z"]),
                        latent.gumbel_kl(x["w"]),
                        latent.force_directed_layout(x["adj"], x["pos"], 3),
                        latent.edge_precision_recall(x["adj"], x["adj"].flip(-1)),
                        latent.gold_arborescence(x["heads"]),
                        list(latent.arc_precision_recall(
                            latent.gold_arborescence(x["heads"]),
                            latent.gold_arborescence(x["heads"]).flip(-2),
                            torch.tensor([4, 3], device=x["heads"].device)))],
             ("w", "z", "pos")),
        Case("identify", ("perturb.checks.identify",),
             lambda g, dt: {"p": torch.softmax(_r(g, 4, dtype=dt), -1)},
             lambda x: perturb.checks.identify(x["p"], perturb.Gumbel(), max_iter=30,
                                               n_samples=512, n_reps=2).theta, dtypes=(F64,)),
    ]
    return cases


#: public names with no parity case, and why (a test checks that every public name is covered
#: here or by a case, and that nothing here is stale)
EXCLUDED: dict[str, str] = {
    **{n: "registry or process-wide switch: no tensor computation" for n in (
        "perturb.register_solver", "perturb.register_unsupported", "perturb.registered_pairs",
        "perturb.support_table", "perturb.settings", "perturb.set_validation",
        "perturb.validation_enabled")},
    **{n: "exception or warning class" for n in (
        "perturb.structured.SinkhornConvergenceWarning", "perturb.structured.WilsonStepLimit")},
    **{n: "constant" for n in (
        "perturb.noise.EULER_GAMMA", "perturb.boxes.EULER_GAMMA", "perturb.latent.LISTOPS_VOCAB",
        "perturb.boxes.hierarchy.VOLUME_QUANTILES", "perturb.boxes.hierarchy.DEFAULT_WORDNET_DIR")},
    **{n: "record type (NamedTuple or dataclass): no computation" for n in (
        "perturb.noise.QuadratureLayout", "perturb.latent.NonlinearICAData",
        "perturb.latent.GraphELBO", "perturb.latent.GraphLayoutData", "perturb.latent.ListOpsBatch",
        "perturb.checks.CompletenessReport", "perturb.checks.MinimalityReport",
        "perturb.checks.CompletenessWitness", "perturb.checks.MinimalityWitness",
        "perturb.checks.IdentifyResult", "perturb.boxes.hierarchy.PairScores",
        "perturb.boxes.hierarchy.TrainHistory", "perturb.boxes.hierarchy.TrainResult",
        "perturb.boxes.hierarchy.SavedModel", "perturb.boxes.hierarchy.EvalResult",
        "perturb.boxes.hierarchy.SplitEval", "perturb.boxes.hierarchy.HierarchySplit",
        "perturb.boxes.hierarchy.BenchmarkSplit", "perturb.boxes.hierarchy.WordNetSynset",
        "perturb.boxes.hierarchy.HierarchyConfig")},
    **{n: "temperature schedule: host-side floats, no tensors" for n in (
        "perturb.nn.TemperatureSchedule", "perturb.nn.ConstantSchedule",
        "perturb.nn.ExponentialSchedule", "perturb.nn.LinearSchedule")},
    **{n: "host-side graph, file or process utility (networkx, files, sockets): no device "
          "computation" for n in (
        "perturb.boxes.hierarchy.hierarchy_levels", "perturb.boxes.hierarchy.edge_index",
        "perturb.boxes.hierarchy.check_pairs", "perturb.boxes.hierarchy.check_model",
        "perturb.boxes.hierarchy.check_hierarchy", "perturb.boxes.hierarchy.transitive_closure",
        "perturb.boxes.hierarchy.transitive_reduction", "perturb.boxes.hierarchy.sub_hierarchy",
        "perturb.boxes.hierarchy.balanced_tree", "perturb.boxes.hierarchy.random_tree",
        "perturb.boxes.hierarchy.random_dag", "perturb.boxes.hierarchy.resolve_generator",
        "perturb.boxes.hierarchy.split_hierarchy", "perturb.boxes.hierarchy.dasgupta_split",
        "perturb.boxes.hierarchy.wordnet_dir", "perturb.boxes.hierarchy.read_wordnet_nouns",
        "perturb.boxes.hierarchy.read_wordnet_index",
        "perturb.boxes.hierarchy.wordnet_noun_hierarchy", "perturb.boxes.hierarchy.select_backend",
        "perturb.boxes.hierarchy.free_port", "perturb.boxes.hierarchy.save_model",
        "perturb.boxes.hierarchy.load_model", "perturb.boxes.hierarchy.load_checkpoint")},
    **{n: "data generator without a device argument: CPU tensors by design" for n in (
        "perturb.latent.make_nonlinear_ica", "perturb.latent.binarized_digits",
        "perturb.latent.make_graph_layout", "perturb.latent.random_trees",
        "perturb.latent.make_listops")},
    **{n: "training loop (minutes): its CUDA run is the box-epoch row of "
          "`python -m bench --device cuda`; its pieces (model, scores, losses) have cases" for n in (
        "perturb.boxes.train_hierarchy", "perturb.boxes.hierarchy.train_hierarchy_distributed",
        "perturb.boxes.hierarchy.Trainer", "perturb.boxes.hierarchy.initial_model")},
    "perturb.boxes.hierarchy.evaluate_split": "evaluate on a split's two pair sets: covered by "
                                              "the evaluate case",
    **{n: "identifiability check building its own CPU float64 problems (no tensor argument); "
          "`identify`, which takes one, has a case" for n in (
        "perturb.checks.check_completeness", "perturb.checks.check_minimality")},
}
