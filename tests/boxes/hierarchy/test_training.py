"""Tests for perturb.boxes.hierarchy.training: reconstruction, training health, diagnostics on a
schedule, the device-resident step (no host reads), reproducibility, checkpoints and resume."""
from __future__ import annotations

import math

import networkx as nx
import pytest
import torch

from perturb.boxes.hierarchy import (
    BoxHierarchyModel,
    all_pairs_f1,
    balanced_tree,
    edge_index,
    evaluate,
    random_dag,
    split_hierarchy,
    train_hierarchy,
    transitive_closure,
)
from perturb.boxes.hierarchy.training import stalled_pairs
from perturb.noise import Gumbel, NegativeExponential, Normal, Uniform

# ----------------------------------------------------------------------------- training

def test_training_reconstructs_small_tree():
    g = balanced_tree(2, 3)
    res = train_hierarchy(g, 2, epochs=40, lr=0.05, batch_size=16,
                          negatives_per_positive=8, seed=0, progress=False)
    clo = edge_index(g, transitive_closure(g).edges)
    f1 = all_pairs_f1(res.model, clo).f1
    h = res.history
    assert f1 >= 0.9, f1
    assert h.loss[-1] < 0.5 * h.loss[0]
    assert len(h.loss) == len(h.volume_quantiles) == len(h.containment_accuracy) == 40
    assert len(h.step_loss) == 40 * 3                                 # 34 edges, 3 batches
    # diagnostics on the first step of each epoch (3 steps < diagnostics_every = 50)
    assert h.diagnostic_steps == list(range(0, 120, 3)) and len(h.zero_grad_fraction) == 40
    q = torch.tensor(h.volume_quantiles)
    assert bool((q[:, 1:] >= q[:, :-1]).all())                     # quantiles are ordered
    assert h.containment_accuracy[-1] > 0.9


def test_hard_boxes_have_zero_gradients_where_gumbel_does_not():
    """Local identifiability: tiny disjoint boxes give hard boxes exactly zero gradients."""
    g = random_dag(30, 0.05, seed=0)
    kw = dict(epochs=1, batch_size=1000, negatives_per_positive=0, seed=0, progress=False,
              init=(0.01, 0.02))
    hard = train_hierarchy(g, 4, noise=None, **kw).history.zero_grad_fraction[0]
    gumbel = train_hierarchy(g, 4, Gumbel(0.05), **kw).history.zero_grad_fraction[0]
    soft = train_hierarchy(g, 4, noise=None, temperature=0.05, **kw).history.zero_grad_fraction[0]
    assert hard > 0.9
    assert gumbel == 0.0
    assert soft < hard


@pytest.mark.parametrize("noise", [Uniform(-0.05, 0.05), NegativeExponential(0.05)], ids=repr)
def test_noise_with_kinks_trains_with_finite_parameters(noise):
    """Uniform boxes reach p = 0 (positives beyond the support: the hard floor) and 1 − p = 0
    (negatives nested deep inside): finite losses, finite parameters, the loss going down;
    Uniform stalls like hard boxes, NegativeExponential (an exponential tail) never."""
    g = balanced_tree(2, 3)
    res = train_hierarchy(g, 2, noise, epochs=15, lr=0.05, batch_size=16,
                          negatives_per_positive=8, seed=0, progress=False, init=(0.05, 0.1))
    params = torch.cat([p.detach().reshape(-1) for p in res.model.parameters()])
    assert bool(torch.isfinite(params).all())
    assert all(math.isfinite(v) for v in res.history.loss)
    assert res.history.loss[-1] < res.history.loss[0]


def test_stalled_pairs_hard_all_gumbel_none():
    """Violated pairs whose own loss has zero gradient: every disjoint hard positive, no
    Gumbel pair (the local identifiability of Dasgupta et al.)."""
    g = random_dag(30, 0.05, seed=0)
    kw = dict(epochs=1, batch_size=1000, negatives_per_positive=0, seed=0, progress=False,
              init=(0.01, 0.02))
    hard = train_hierarchy(g, 4, noise=None, **kw).history
    gumbel = train_hierarchy(g, 4, Gumbel(0.05), **kw).history
    assert hard.epoch_violated_fraction[0] > 0.9          # tiny random boxes: all disjoint
    assert hard.epoch_stalled_fraction[0] > 0.9
    assert gumbel.epoch_violated_fraction[0] > 0.9
    assert gumbel.epoch_stalled_fraction[0] == 0.0
    assert hard.stalled_fraction == hard.epoch_stalled_fraction


def test_stalled_pairs_counts_nested_hard_negative():
    """A negative pair nested by hard boxes (p = 1) is violated and stalled; the same pair as a
    positive is satisfied. Gumbel boxes give it a gradient."""
    for noise, stalled in ((None, 1), (Gumbel(0.01), 0)):
        m = BoxHierarchyModel(2, 2, noise, init=(0.1, 0.5), generator=torch.Generator()
                              .manual_seed(0), dtype=torch.float64)
        with torch.no_grad():      # box 0 = [0.4, 0.5]^2 inside box 1 = [0, 1]^2
            m.embedding.param1.copy_(torch.tensor([[0.45, 0.45], [0.5, 0.5]]))
            m.embedding.param2.copy_(torch.tensor([[0.05, 0.05], [0.5, 0.5]]).expm1().log())
            box = m.embedding.all_boxes()
        torch.testing.assert_close(box.lower[0], torch.full((2,), 0.4, dtype=torch.float64))
        pairs = torch.tensor([[0, 1]])
        counts = lambda p, n_pos: tuple(int(c) for c in stalled_pairs(m, p, n_pos))  # noqa
        assert counts(pairs, 0) == (stalled, 1)                         # as a negative
        assert counts(pairs.repeat(9, 1), 0) == (9 * stalled, 9)
        assert counts(pairs, 1) == (0, 0)                               # as a positive


def test_training_is_reproducible_and_accepts_edges():
    g = random_dag(15, 0.1, seed=4)
    kw = dict(epochs=3, batch_size=8, negatives_per_positive=3, progress=False)
    a = train_hierarchy(g, 3, seed=5, **kw).model.state_dict()
    b = train_hierarchy(g, 3, generator=torch.Generator().manual_seed(5), **kw).model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
        else:
            assert a[k] == b[k]
    c = train_hierarchy(g, 3, seed=5, train_edges=list(transitive_closure(g).edges), **kw)
    assert c.model.nodes == list(g.nodes)
    evals = train_hierarchy(g, 3, seed=5, eval_fn=lambda m: {"x": 1.0}, eval_every=2, **kw)
    assert [e["epoch"] for e in evals.history.eval] == [2, 3]


def test_generalisation_split_pipeline():
    g = balanced_tree(2, 3)
    split = split_hierarchy(g, train_fraction=0.5, val_fraction=0.5, seed=0)
    res = train_hierarchy(g, 2, epochs=5, seed=0, train_edges=split.train, progress=False,
                          negatives_per_positive=4)
    gen = torch.Generator().manual_seed(1)
    n = g.number_of_nodes()
    val_neg = torch.randint(n, (split.val.shape[0] * 4, 2), generator=gen)
    pairs = torch.cat([split.val, val_neg])
    labels = torch.cat([torch.ones(split.val.shape[0]), torch.zeros(val_neg.shape[0])])
    val = evaluate(res.model, pairs, labels)
    test = evaluate(res.model, split.test, torch.ones(split.test.shape[0]), val.threshold)
    assert 0.0 <= test.f1 <= 1.0 and test.threshold == val.threshold


def test_bad_arguments():
    g = balanced_tree(2, 2)
    with pytest.raises(ValueError, match="acyclic"):
        train_hierarchy(nx.DiGraph([(0, 1), (1, 0)]), 2, progress=False)
    with pytest.raises(ValueError, match="method"):
        train_hierarchy(g, 2, "fuzzy", epochs=1, progress=False)
    with pytest.raises(ValueError, match="not a node"):
        train_hierarchy(g, 2, train_edges=[(0, 99)], epochs=1, progress=False)
    with pytest.raises(ValueError, match="beta"):
        train_hierarchy(g, 2, beta=0.0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        train_hierarchy(g, 2, batch_size=0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="either generator or seed"):
        train_hierarchy(g, 2, seed=1, generator=torch.Generator(), epochs=1, progress=False)


# ----------------------------------------------------------------------------- the step

def test_diagnostics_schedule():
    g = random_dag(60, 0.05, seed=1)          # closure of ~150 edges, batches of 16: ~10 steps
    kw = dict(epochs=2, batch_size=16, negatives_per_positive=2, seed=0, progress=False)
    every3 = train_hierarchy(g, 3, diagnostics_every=3, **kw).history
    steps = len(every3.step_loss) // 2
    expect = [e * steps + s for e in range(2) for s in range(0, steps, 3)]
    assert every3.diagnostic_steps == expect
    assert len(every3.zero_grad_fraction) == len(every3.stalled_fraction) == len(expect)
    every1 = train_hierarchy(g, 3, diagnostics_every=1, **kw).history
    assert every1.diagnostic_steps == list(range(2 * steps))
    never = train_hierarchy(g, 3, diagnostics_every=0, **kw).history
    assert never.diagnostic_steps == [] and never.epoch_stalled_fraction == [0.0, 0.0]
    # the diagnostics read the step, they never change it
    for a, b in zip(every1.step_loss, never.step_loss):
        assert a == b


@pytest.mark.parametrize("n", [300, 3000])    # child volumes per node; the fused pair score
def test_step_reads_nothing_back(monkeypatch, n):
    """A training step (diagnostics included) makes no host read: with the box core on its
    branch-free path (what it does on CUDA, where reads stall: regime checks assumed true,
    nested pairs computed densely), no `.item()`-like op remains except the CPU fused-Adam
    kernel's reads of its CPU step counter (no device sync on CUDA), and no `nonzero` (a
    synchronisation on CUDA) at all."""
    import sys
    from perturb._validation import set_validation
    from perturb.boxes.hierarchy import HierarchyConfig, Trainer
    from perturb.boxes.losses import PairSet
    import perturb.boxes  # noqa: F401  (the submodules below are shadowed by functions)
    vol, inter = sys.modules["perturb.boxes.volumes"], sys.modules["perturb.boxes.intersections"]
    monkeypatch.setattr(vol, "_any", lambda cond: True)
    monkeypatch.setattr(sys.modules["perturb.boxes._bessel"], "_any", lambda cond: True)
    monkeypatch.setattr(inter, "reads_stall", lambda t: True)
    monkeypatch.setattr(sys.modules["perturb.boxes._bessel"], "reads_stall", lambda t: True)
    monkeypatch.setattr(sys.modules["perturb.boxes._gumbel_pairs"], "reads_stall",
                        lambda t: True)
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(n, (500, 2), generator=gen)
    cfg = HierarchyConfig(dim=4, sampler="fixed", negative_max_tries=8, volume_reg=0.1)
    model = BoxHierarchyModel(n, generator=gen, **cfg.model_kwargs())
    trainer = Trainer(model, pos, PairSet(pos, n, include_self=True), cfg,
                      torch.Generator().manual_seed(1))
    for diagnostics in (False, True):
        with set_validation(False):
            trainer.step(pos[:32], diagnostics)
            with torch.profiler.profile(with_stack=True) as prof:
                trainer.step(pos[:32], diagnostics)
        for e in prof.events():
            if e.name == "aten::_local_scalar_dense":
                parents = []
                p = e.cpu_parent
                while p is not None:
                    parents.append(p.name)
                    p = p.cpu_parent
                assert "aten::_fused_adam_" in parents, parents
            assert e.name != "aten::nonzero", e.stack


def test_fixed_and_adaptive_samplers_train_alike():
    g = balanced_tree(2, 3)
    clo = edge_index(g, transitive_closure(g).edges)
    kw = dict(epochs=40, lr=0.05, batch_size=16, negatives_per_positive=8, seed=0,
              progress=False)
    for sampler in ("adaptive", "fixed"):
        res = train_hierarchy(g, 2, sampler=sampler, **kw)
        assert all_pairs_f1(res.model, clo).f1 >= 0.9
        assert sum(res.history.known_negatives) == 0


def test_volume_penalty_counts_each_box_once():
    """λ Σ_{distinct boxes of the batch} 1[Vol > τ]·Vol, computed without finding the
    distinct ids, against a direct sum over torch.unique."""
    from perturb.boxes.hierarchy import HierarchyConfig, Trainer
    from perturb.boxes.losses import PairSet
    gen = torch.Generator().manual_seed(0)
    cfg = HierarchyConfig(dim=2, volume_reg=1.0, volume_threshold=0.01, dtype=torch.float64)
    model = BoxHierarchyModel(10, generator=gen, **cfg.model_kwargs())
    pairs = torch.tensor([[0, 1], [0, 2], [3, 1], [0, 1]])
    trainer = Trainer(model, pairs, PairSet(pairs, 10), cfg, torch.Generator())
    ours = trainer._volume_penalty(pairs)
    vol = torch.exp(model.log_volume(torch.unique(pairs)))
    torch.testing.assert_close(ours, torch.where(vol > 0.01, vol, 0.0).sum(), rtol=1e-12,
                               atol=0)


# ----------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kw,match", [
    (dict(accuracy_threshold=2.0), "accuracy_threshold"),
    (dict(grad_tol=-1.0), "grad_tol"),
    (dict(volume_reg=float("nan")), "volume_reg"),
    (dict(negative_weight=float("nan")), "negative_weight"),
    (dict(negative_max_tries=0), "negative_max_tries"),
    (dict(diagnostics_every=-1), "diagnostics_every"),
    (dict(lr=float("inf")), "lr"),
    (dict(sampler="magic"), "sampler"),
    (dict(dim=0), "dim"),
])
def test_bad_hyper_parameters_name_the_argument(kw, match):
    kw = {"dim": 2, **kw}
    with pytest.raises(ValueError, match=match):
        train_hierarchy(balanced_tree(2, 2), epochs=1, progress=False, **kw)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="epochz"):
        train_hierarchy(balanced_tree(2, 2), 2, epochz=1, progress=False)


# ----------------------------------------------------------------------------- checkpoints

_RUN = dict(epochs=6, batch_size=16, negatives_per_positive=4, seed=7, progress=False,
            diagnostics_every=2, checkpoint_every=1)
_KILLED_RUN = """
import os, signal, sys, torch
torch.set_num_threads(1)
from perturb.boxes.hierarchy import random_dag, train_hierarchy
path, kill_after = sys.argv[1], int(sys.argv[2])
def hook(epoch, trainer):
    if epoch == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)      # no clean-up, no atexit: a hard crash
train_hierarchy(random_dag(40, 0.1, seed=3), 3, checkpoint=path, resume=True,
                on_epoch_end=hook, **%r)
""" % (_RUN,)


@pytest.fixture
def one_thread(torch_threads):
    torch_threads(1)


def test_killed_run_resumes_bit_identically(tmp_path, one_thread):
    """A run killed (SIGKILL) after epoch 3 and resumed from its checkpoint ends with exactly
    the parameters, optimizer state and history of a run that was never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[3])
    path = tmp_path / "run.ckpt"
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(path), "3"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert path.is_file() and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    g = random_dag(40, 0.1, seed=3)
    resumed = train_hierarchy(g, 3, checkpoint=path, resume=True, **_RUN)
    straight = train_hierarchy(g, 3, **_RUN)
    for name, p in straight.model.state_dict().items():
        q = resumed.model.state_dict()[name]
        assert (torch.equal(q, p) if isinstance(p, torch.Tensor) else q == p), name
    a, b = resumed.history, straight.history
    assert a.step_loss == b.step_loss and a.loss == b.loss
    assert a.diagnostic_steps == b.diagnostic_steps and a.stalled_fraction == b.stalled_fraction
    assert a.volume_quantiles == b.volume_quantiles and len(a.seconds) == 6
    # resuming a finished run trains no more; a longer run continues from it
    again = train_hierarchy(g, 3, checkpoint=path, resume=True, **_RUN)
    assert torch.equal(again.model.embedding.param1, straight.model.embedding.param1)
    longer = train_hierarchy(g, 3, checkpoint=path, resume=True, **{**_RUN, "epochs": 7})
    assert len(longer.history.loss) == 7


def test_resume_refuses_another_run(tmp_path):
    g = random_dag(30, 0.1, seed=0)
    path = tmp_path / "c.pt"
    kw = dict(epochs=1, batch_size=16, seed=0, progress=False)
    train_hierarchy(g, 2, checkpoint=path, **kw)
    with pytest.raises(ValueError, match="lr"):
        train_hierarchy(g, 2, checkpoint=path, resume=True, **{**kw, "lr": 0.1})
    with pytest.raises(ValueError, match="other data"):
        train_hierarchy(g, 2, checkpoint=path, resume=True, train_edges=list(g.edges), **kw)
    with pytest.raises(ValueError, match="checkpoint"):
        train_hierarchy(g, 2, resume=True, **kw)
    # no file yet: resume=True starts from scratch
    fresh = train_hierarchy(g, 2, checkpoint=tmp_path / "new.pt", resume=True, **kw)
    assert len(fresh.history.loss) == 1 and (tmp_path / "new.pt").is_file()


def test_atomic_save_keeps_the_old_file_when_a_write_fails(tmp_path):
    from perturb.boxes.hierarchy.io import atomic_save

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    path = tmp_path / "ckpt.pt"
    atomic_save({"epoch": 1}, path)
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_save({"epoch": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


# ----------------------------------------------------------------------------- Adam moments

def test_tiny_moments_are_zeroed_and_updates_unchanged():
    from perturb.boxes.hierarchy.training import MOMENT_CLEANUP_EVERY, zero_tiny_moments
    assert 0.9 ** MOMENT_CLEANUP_EVERY > 2.0 ** -24       # no moment turns denormal between
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(1000, 4))
    q = torch.nn.Parameter(p.detach().clone())
    opts = [torch.optim.Adam([t], lr=0.05) for t in (p, q)]
    for i in range(3):
        for t, opt in zip((p, q), opts):
            opt.zero_grad()
            g = torch.zeros_like(t)
            g[: 10 * (i + 1)] = torch.randn(10 * (i + 1), 4, generator=torch.Generator()
                                            .manual_seed(i))
            g[500:510] = 1e-33                             # a few tiny gradients
            t.grad = g
            opt.step()
    state = opts[0].state[p]
    tiny = state["exp_avg"].abs() < torch.finfo(torch.float32).tiny * 2 ** 24
    assert tiny.any() and (state["exp_avg"][tiny] != 0).any()
    kept = state["exp_avg"][~tiny].clone()
    zero_tiny_moments(opts[0])
    assert bool((state["exp_avg"][tiny] == 0).all())
    torch.testing.assert_close(state["exp_avg"][~tiny], kept, rtol=0, atol=0)
    for t, opt in zip((p, q), opts):                       # one more step, same update
        t.grad = torch.ones_like(t)
        opt.step()
    torch.testing.assert_close(p, q, rtol=0, atol=1e-20)


def test_volume_quantiles_equal_torch_quantile():
    from perturb.boxes.hierarchy.training import VOLUME_QUANTILES, _volume_quantiles
    for x in (torch.randn(1001), torch.tensor([3.0]),
              torch.tensor([-math.inf, 0.5, -math.inf, 2.0, 1.0])):
        want = torch.quantile(x.double().clamp(min=-1e300),
                              torch.tensor(VOLUME_QUANTILES, dtype=torch.float64))
        assert _volume_quantiles(x) == want.tolist()


@pytest.mark.parametrize("kw", [dict(), dict(noise=None), dict(noise=None, temperature=0.3),
                                dict(noise=Normal(0.05))])
def test_log_p_given_volumes_equals_score_pairs(kw):
    from perturb.boxes.hierarchy.evaluation import score_pairs
    from perturb.boxes.hierarchy.training import _log_p_given_volumes
    gen = torch.Generator().manual_seed(3)
    model = BoxHierarchyModel(60, 3, generator=gen, dtype=torch.float64, **kw)
    pairs = torch.randint(60, (40, 2), generator=gen)
    with torch.no_grad():
        got = _log_p_given_volumes(model, pairs, model.log_volume())
    torch.testing.assert_close(got, score_pairs(model, pairs), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- lazy Adam

def test_default_optimizer_is_dense_fused_adam():
    """The default is today's dense Adam: dense gradients, torch.optim.Adam, and the same
    parameters bit for bit as optimizer="adam" spelled out."""
    from perturb.boxes.hierarchy import HierarchyConfig
    assert HierarchyConfig().optimizer == "adam"
    g = balanced_tree(2, 3)
    kw = dict(epochs=3, batch_size=8, negatives_per_positive=3, seed=2, progress=False)
    a = train_hierarchy(g, 2, **kw).model
    b = train_hierarchy(g, 2, optimizer="adam", **kw).model
    assert not a.sparse_grad
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q) and not p.grad.is_sparse


def test_sparse_adam_learns_the_small_tree_like_adam():
    """The lazy Adam reaches the dense Adam's F1 on the 15-node tree (within 0.05), and halves
    the loss, with the settings of test_training_reconstructs_small_tree."""
    g = balanced_tree(2, 3)
    clo = edge_index(g, transitive_closure(g).edges)
    f1 = {}
    for opt in ("adam", "sparse_adam"):
        res = train_hierarchy(g, 2, epochs=40, lr=0.05, batch_size=16, negatives_per_positive=8,
                              seed=0, progress=False, optimizer=opt, volume_reg=0.01)
        f1[opt] = all_pairs_f1(res.model, clo).f1
        assert not res.model.sparse_grad               # the returned model: dense gradients
        assert res.history.loss[-1] < 0.5 * res.history.loss[0], opt
    assert f1["sparse_adam"] >= f1["adam"] - 0.05 and f1["sparse_adam"] >= 0.9, f1


def _lazy_trainer(optimizer: str, n: int = 40):
    from perturb.boxes.hierarchy import HierarchyConfig, Trainer, initial_model
    from perturb.boxes.losses import PairSet
    g = random_dag(n, 0.1, seed=1)
    pos = edge_index(g, transitive_closure(g).edges)
    cfg = HierarchyConfig(dim=3, optimizer=optimizer, batch_size=4, negatives_per_positive=2,
                          lr=0.1, seed=0)
    model = initial_model(n, list(g.nodes), cfg, pos, torch.Generator().manual_seed(0))
    return Trainer(model, pos, PairSet(pos, n, include_self=True), cfg,
                   torch.Generator().manual_seed(1)), pos


def test_sparse_adam_step_is_the_lazy_adam_update_by_hand():
    """One trainer step with optimizer="sparse_adam" moves exactly the boxes of the step's
    pairs, by the lazy Adam update of the dense trainer's gradient (same pairs: same
    generator), computed here by hand; every other box and moment is untouched."""
    lazy, pos = _lazy_trainer("sparse_adam")
    dense, _ = _lazy_trainer("adam")
    before = [p.detach().clone() for p in lazy.model.parameters()]
    batch = pos[:4]
    lazy.step(batch)
    dense.step(batch)                     # its .grad: the dense gradient at the same start
    # the step's pairs: 4 positives and 8 negatives, drawn alike by both trainers
    gen = torch.Generator().manual_seed(1)
    from perturb.boxes.losses import sample_negatives
    neg = sample_negatives(batch, 40, 2, known=lazy.known, generator=gen, strict=False,
                           mode=lazy.config.sampler)
    touched = torch.zeros(40, dtype=torch.bool)
    touched[torch.cat([batch, neg.reshape(-1, 2)]).reshape(-1)] = True
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.1
    for p, p0, q in zip(lazy.model.parameters(), before, dense.model.parameters()):
        g = q.grad
        m, v = (1 - b1) * g, (1 - b2) * g * g
        want = p0 - lr * math.sqrt(1 - b2) / (1 - b1) * m / (v.sqrt() + eps)
        want = torch.where(touched.unsqueeze(1), want, p0)
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach()[~touched], p0[~touched])
        st = lazy.optimizer.state[p]
        assert not st["exp_avg"][~touched].any() and not st["exp_avg_sq"][~touched].any()
        torch.testing.assert_close(st["exp_avg"], m.where(touched.unsqueeze(1), 0.0))


def test_sparse_adam_diagnostics_equal_the_dense_first_step():
    """The first step is the same for both optimizers (same start, same pairs): the same loss
    and the same diagnostic counts from the sparse gradient."""
    g = random_dag(30, 0.15, seed=2)
    kw = dict(epochs=1, batch_size=8, negatives_per_positive=3, seed=4, progress=False,
              diagnostics_every=1)
    a = train_hierarchy(g, 3, **kw).history
    b = train_hierarchy(g, 3, optimizer="sparse_adam", **kw).history
    assert a.step_loss[0] == b.step_loss[0]
    assert a.zero_grad_fraction[0] == b.zero_grad_fraction[0]
    assert a.stalled_fraction[0] == b.stalled_fraction[0]


def test_sparse_adam_resumes_bit_for_bit(tmp_path, one_thread):
    """3 epochs, checkpoint, resume to 6 = 6 straight (parameters, moments, history); and a
    Trainer state_dict loaded into a fresh trainer continues the same."""
    g = random_dag(40, 0.1, seed=3)
    kw = {**_RUN, "optimizer": "sparse_adam", "volume_reg": 0.01}
    path = tmp_path / "lazy.ckpt"
    train_hierarchy(g, 3, checkpoint=path, **{**kw, "epochs": 3})
    resumed = train_hierarchy(g, 3, checkpoint=path, resume=True, **kw)
    straight = train_hierarchy(g, 3, **kw)
    for p, q in zip(resumed.model.parameters(), straight.model.parameters()):
        assert torch.equal(p, q)
    assert resumed.history.step_loss == straight.history.step_loss
    state = torch.load(path, weights_only=True)["trainer"]["optimizer"]["state"]
    assert {k for s in state.values() for k in s} == {"step", "exp_avg", "exp_avg_sq"}
    import copy
    a, pos = _lazy_trainer("sparse_adam")
    for s in range(3):
        a.step(pos[4 * s:4 * s + 4])
    b, _ = _lazy_trainer("sparse_adam")
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for t in (a, b):
        t.run_epoch()
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)


def test_stalled_pairs_same_counts_through_the_composition(monkeypatch):
    """stalled_pairs scores with the fused Gumbel pair score; the composition (the path of
    the other box models, here forced) gives the same counts on a trained model's step."""
    import perturb.boxes.hierarchy.model as model_module
    g = random_dag(40, 0.08, seed=1)
    res = train_hierarchy(g, 3, Gumbel(0.01), epochs=3, batch_size=64, seed=0,
                          progress=False, volume_beta=0.1)
    gen = torch.Generator().manual_seed(0)
    from perturb.boxes.hierarchy import edge_index
    pairs = torch.cat([edge_index(g)[:20], torch.randint(40, (60, 2), generator=gen)])
    fused = [int(c) for c in stalled_pairs(res.model, pairs, 20)]
    monkeypatch.setattr(model_module, "_FUSED_DTYPES", ())
    composed = [int(c) for c in stalled_pairs(res.model, pairs, 20)]
    assert fused == composed and fused[1] > 0
