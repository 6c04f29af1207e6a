"""Box embeddings of hierarchies: hard vs soft vs Gumbel boxes under the same budget.

Setting 1 (reconstruction): train on the transitive closure of a balanced binary tree (1,023
nodes; --quick: 63) with k negatives per positive, at two dimensions, and report F1 over all
ordered pairs at the best threshold; then the same on the WordNet mammal closure (1,182 nodes,
6,542 edges, d=10) when WordNet is installed (Debian: ``apt-get install wordnet-base``).

Setting 2 (generalisation, WordNet mammal): train on the transitive reduction plus a fraction of
the other closure edges, pick the threshold on validation pairs, report F1 on held-out closure
pairs (10 corrupted negatives per positive, filtered against the full closure), with a
validation-F1 point per epoch. The full noun hierarchy (82,115 synsets) only with
--full-wordnet. ``--peer box-embeddings`` also trains the Gumbel and soft boxes of setting 2
with the box-embeddings library in a plain Adam loop (bench/_box_peer.py) from the same start,
on the same split and negatives, with the same lr phases and threshold selection.

Outputs in --out: results.md (tables), results.json, f1_curves.png, zero_grad.png, stalled.png and
boxes_2d.png (learned 2-D Gumbel boxes of a 15-node tree).

    python examples/box_hierarchy.py --quick
    python examples/box_hierarchy.py --epochs 60 --seeds 3 --out results/box_hierarchy
    python examples/box_hierarchy.py --no-tree --no-reconstruction --gen-known closure \
        --train-fraction 0 0.1 0.25 0.5 --peer box-embeddings --epochs 80 --decay-epochs 10
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import command_line, mean_std, md_table, parser, save_plot, session  # noqa: E402
from _common import flush_denormals, write_results  # noqa: E402

from perturb.boxes.hierarchy import (  # noqa: E402
    HierarchyConfig,
    all_pairs_f1,
    best_f1_threshold,
    balanced_tree,
    dasgupta_split,
    edge_index,
    evaluate,
    evaluate_split,
    initial_model,
    split_hierarchy,
    train_hierarchy,
    train_hierarchy_distributed,
    transitive_closure,
    wordnet_dir,
    wordnet_noun_hierarchy,
)
from perturb.boxes.losses import PairSet, sample_negatives  # noqa: E402
from perturb.noise import Gumbel, Logistic, NegativeExponential, Normal, Uniform  # noqa: E402

METHODS = ("gumbel", "soft", "hard")
#: Boxes whose corners are perturbed by another noise, of scale --noise-scale (Normal boxes by
#: quadrature, slower; uniform: Uniform(−scale, scale); negexp: NegativeExponential(scale)).
NOISE_METHODS = ("normal", "logistic", "uniform", "negexp")
_NOISES = {"normal": Normal, "logistic": Logistic, "negexp": NegativeExponential,
           "uniform": lambda s: Uniform(-s, s)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="63-node tree, d=2/4, 1 seed")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds per configuration")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs at --lr per run (default 20; --quick 40)")
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   choices=METHODS + NOISE_METHODS,
                   help="box models (normal, logistic, uniform, negexp: corners perturbed by "
                        "that noise)")
    p.add_argument("--noise", nargs="+", default=None, choices=("gumbel",) + NOISE_METHODS,
                   help="the box models named by their corner noise (replaces --methods)")
    p.add_argument("--noise-scale", type=float, default=0.1,
                   help="scale of the corner noise of the normal, logistic, uniform (the "
                        "half-width) and negexp boxes")
    p.add_argument("--dims", nargs="+", type=int, default=None, help="default 8 4 (quick: 4 2)")
    p.add_argument("--height", type=int, default=None, help="tree height (default 9; quick 5)")
    p.add_argument("--negatives", type=int, default=128, help="negatives per positive")
    p.add_argument("--batch-size", type=int, default=None, help="default 256 (quick: 64)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", choices=("adam", "sparse_adam"), default="adam",
                   help="adam (dense, default) or sparse_adam: lazy Adam on sparse row gradients, "
                        "only the step's boxes move (HierarchyConfig.optimizer; not with "
                        "--world-size > 1)")
    p.add_argument("--decay-epochs", type=int, default=None,
                   help="after --epochs, this many epochs at lr/5 and again at lr/25 "
                        "(default 5, --quick 0)")
    p.add_argument("--beta", type=float, default=0.01, help="Gumbel intersection scale")
    p.add_argument("--volume-beta", type=float, default=0.1, help="Gumbel volume scale")
    p.add_argument("--temperature", type=float, default=0.1, help="soft-box temperature")
    p.add_argument("--eval-every", type=int, default=None, help="epochs between F1 points")
    p.add_argument("--no-wordnet", action="store_true", help="skip the WordNet settings")
    p.add_argument("--no-tree", action="store_true", help="skip the balanced-tree setting")
    p.add_argument("--wordnet-dim", type=int, default=10)
    p.add_argument("--wordnet-epochs", type=int, default=None)
    p.add_argument("--wordnet-negatives", type=int, default=None,
                   help="negatives per positive on WordNet (default: --negatives)")
    p.add_argument("--gen-known", choices=("train", "closure", "both"), default="both",
                   help="setting 2: negatives avoid the training edges, or their transitive "
                        "closure (which holds the held-out pairs), or run both")
    p.add_argument("--gen-beta", type=float, default=0.03,
                   help="Gumbel intersection scale in setting 2 (chosen on validation F1)")
    p.add_argument("--gen-negatives", type=int, default=10,
                   help="negatives per positive in setting 2 (chosen on validation F1)")
    p.add_argument("--no-reconstruction", action="store_true",
                   help="skip the mammal reconstruction run (setting 1 on WordNet)")
    p.add_argument("--peer", choices=("box-embeddings",), default=None,
                   help="setting 2 on mammal also with the box-embeddings library in a plain "
                        "Adam loop (gumbel and soft of --methods; same splits, negatives, "
                        "starting boxes, lr schedule and threshold selection)")
    p.add_argument("--no-ours", action="store_true",
                   help="with --peer: skip our trainer's setting-2 runs")
    p.add_argument("--no-mammal", action="store_true",
                   help="skip the mammal runs (e.g. to run only --full-wordnet)")
    p.add_argument("--gen-volume-beta", type=float, default=1.0,
                   help="Gumbel volume scale in setting 2 (chosen on validation F1)")
    p.add_argument("--gen-temperature", type=float, default=1.0,
                   help="soft-box temperature in setting 2 (chosen on validation F1)")
    p.add_argument("--protocol", choices=("fraction", "dasgupta"), default="fraction",
                   help="setting 2: 'fraction' (reduction + --train-fraction of the closure, the "
                        "rest halved into validation and test) or 'dasgupta' (the published "
                        "protocol: root dropped, 5%% validation / 5%% test of the non-basic "
                        "edges, training negatives avoid the closure of the training edges)")
    p.add_argument("--diagnostics-every", type=int, default=50,
                   help="steps between stalled-pair / zero-gradient diagnostics (0: never)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="write a checkpoint per run there and resume from it when present")
    p.add_argument("--train-fraction", type=float, nargs="+", default=[0.25],
                   help="setting 2: fraction(s) of non-basic closure edges used for training "
                        "(several: one run per fraction, e.g. 0 0.1 0.25 0.5)")
    p.add_argument("--initializer", choices=("random", "nested"), default="random",
                   help="initial boxes: random, or nested along the training edges "
                        "(perturb.boxes.hierarchy.nested_boxes)")
    p.add_argument("--full-wordnet", action="store_true",
                   help="setting 2 also on the full noun hierarchy (slow)")
    p.add_argument("--world-size", type=int, default=1,
                   help="DDP processes (gloo on CPU) for the full noun hierarchy")
    p.add_argument("--full-seeds", type=int, default=None,
                   help="seeds for the full noun hierarchy (default: --seeds)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (per process with --world-size)")
    args = p.parse_args(argv)
    if args.noise:
        args.methods = list(args.noise)
    return args


def box_model(method, hp, noise_scale):
    """The trainer's box model of a method name of the flags: the corner noise (Gumbel with
    the setting's β, or Normal / Logistic / Uniform / NegativeExponential with --noise-scale),
    or no noise (soft boxes with the setting's temperature, hard boxes)."""
    if method == "gumbel":
        return dict(noise=Gumbel(hp["beta"]), volume_beta=hp["volume_beta"])
    if method in NOISE_METHODS:
        return dict(noise=_NOISES[method](noise_scale))
    return dict(noise=None, temperature=hp["temperature"] if method == "soft" else None)


def lr_phases(args, epochs) -> list[tuple[int, float]]:
    """(epochs, lr) of each phase: `epochs` at --lr, then --decay-epochs at lr/5 and lr/25."""
    phases = [(epochs, args.lr)]
    if args.decay_epochs:
        phases += [(args.decay_epochs, args.lr / 5), (args.decay_epochs, args.lr / 25)]
    return phases


def train_phased(graph, dim, method, args, epochs, negatives, seed, hp, eval_fn=None,
                 eval_every=0, train_edges=None, world_size=1, known_edges=None, tag=None):
    """train_hierarchy with the lr schedule: `epochs` at lr, then --decay-epochs at lr/5 and at
    lr/25 (on `world_size` DDP processes when > 1). Returns the model and the run's
    training-health record."""
    phases = lr_phases(args, epochs)
    model, zero, zero_curve, stalled_curve, f1_curve, done = None, [], [], [], [], 0
    for i, (ep, lr) in enumerate(phases):
        kw = dict(**box_model(method, hp, args.noise_scale), epochs=ep, lr=lr, negatives_per_positive=negatives, batch_size=args.batch_size,
                  seed=seed + 1000 * i, device=args.device, model=model, train_edges=train_edges,
                  known_edges=known_edges, diagnostics_every=args.diagnostics_every,
                  initializer=args.initializer, optimizer=args.optimizer)
        if args.checkpoint_dir and tag:          # resumable runs, one file per phase
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            kw.update(checkpoint=os.path.join(args.checkpoint_dir, f"{tag}-{method}-d{dim}-"
                                              f"seed{seed}-phase{i}.pt"), resume=True)
        if world_size > 1:
            res = train_hierarchy_distributed(graph, dim, world_size=world_size,
                                              threads_per_process=args.threads or 1, **kw)
        else:
            res = train_hierarchy(graph, dim, progress=not args.no_progress,
                                  eval_fn=eval_fn,
                                  eval_every=min(eval_every, ep) if eval_fn else 0, **kw)
        model, h = res.model, res.history
        zero += h.zero_grad_fraction
        zero_curve += h.epoch_zero_grad_fraction
        stalled_curve += h.epoch_stalled_fraction
        f1_curve += [(done + e["epoch"], e["f1"]) for e in h.eval]
        done += ep
    return model, dict(epochs=done, zero_grad=sum(zero) / max(1, len(zero)),
                       zero_grad_curve=zero_curve,
                       stalled=sum(stalled_curve) / len(stalled_curve),
                       stalled_curve=stalled_curve, f1_curve=f1_curve,
                       containment_accuracy=h.containment_accuracy[-1],
                       volume_quantiles=h.volume_quantiles[-1], loss=h.loss[-1])


def run_reconstruction(name, graph, dims, args, epochs, negatives, log) -> list[dict]:
    """Setting 1: train on the closure, F1 over all ordered pairs at the best threshold."""
    clo = edge_index(graph, transitive_closure(graph).edges)
    eval_every = args.eval_every or max(1, epochs // 10)
    hp = dict(beta=args.beta, volume_beta=args.volume_beta, temperature=args.temperature)
    rows = []
    for dim in dims:
        for method in args.methods:
            for s in range(args.seeds):
                seed = args.seed + s
                t0 = time.perf_counter()
                model, health = train_phased(graph, dim, method, args, epochs, negatives, seed,
                                             hp, lambda m: {"f1": all_pairs_f1(m, clo).f1},
                                             eval_every)
                final = all_pairs_f1(model, clo)
                row = dict(setting=f"reconstruction/{name}", dim=dim, method=method, seed=seed,
                           f1=final.f1, precision=final.precision, recall=final.recall,
                           **health, seconds=time.perf_counter() - t0)
                rows.append(row)
                log(f"[{name}] d={dim} {method:6s} seed={seed}: F1={final.f1:.4f} "
                    f"(P={final.precision:.3f} R={final.recall:.3f}) zero-grad="
                    f"{row['zero_grad']:.3f} stalled={row['stalled']:.3f} "
                    f"{row['seconds']:.0f}s")
    return rows


def eval_pairs(pos, n, k, closure, gen):
    """``k`` negatives per positive outside the full closure (and not self pairs)."""
    neg = sample_negatives(pos, n, k, known=closure, generator=gen).reshape(-1, 2)
    pairs = torch.cat([pos, neg])
    labels = torch.cat([torch.ones(pos.shape[0]), torch.zeros(neg.shape[0])])
    return pairs, labels


def run_generalisation(name, graph, dim, args, epochs, negatives, log, world_size=1,
                       seeds=None) -> list[dict]:
    """Setting 2: train on reduction + a fraction of the closure, threshold on validation."""
    n = graph.number_of_nodes()
    hp = dict(beta=args.gen_beta, volume_beta=args.gen_volume_beta,
              temperature=args.gen_temperature)
    protocols = ["train", "closure"] if args.gen_known == "both" else [args.gen_known]
    rows = []
    for s, fraction in itertools.product(range(args.seeds if seeds is None else seeds),
                                         args.train_fraction):
        seed = args.seed + s
        if args.protocol == "dasgupta":
            rows += run_dasgupta(name, graph, dim, args, epochs, negatives, log, world_size,
                                 seed, fraction)
            continue
        split = split_hierarchy(graph, fraction, 0.5, seed=seed)
        codes = PairSet(split.closure, n, include_self=True)
        gen = torch.Generator().manual_seed(10_000 + seed)
        val_pairs, val_labels = eval_pairs(split.val, n, 10, codes, gen)
        test_pairs, test_labels = eval_pairs(split.test, n, 10, codes, gen)
        # negatives never drawn from: the training edges, or their transitive closure
        # (computable from the training graph; it holds every held-out pair here, because the
        # training edges contain the transitive reduction); computed once per split
        known_edges = {"train": None}
        if "closure" in protocols:
            train_graph = graph.edge_subgraph(
                [(split.nodes[c], split.nodes[p]) for c, p in split.train.tolist()])
            known_edges["closure"] = edge_index(graph, transitive_closure(train_graph).edges)
        eval_every = args.eval_every or 1

        def val_f1(m, vp=val_pairs, vl=val_labels):
            return {"f1": evaluate(m, vp, vl).f1}
        setting_of = {k: (f"generalisation/{name}"
                          + ("" if k == "train" else " (closure-filtered)")
                          + (f" (train + {fraction:.0%})" if len(args.train_fraction) > 1
                             else "")) for k in protocols}
        for known, method in itertools.product(protocols, [] if args.no_ours else args.methods):
            t0 = time.perf_counter()
            model, health = train_phased(graph, dim, method, args, epochs, negatives, seed, hp,
                                         eval_fn=val_f1, eval_every=eval_every,
                                         train_edges=split.train, world_size=world_size,
                                         known_edges=known_edges[known])
            val = evaluate(model, val_pairs, val_labels)
            test = evaluate(model, test_pairs, test_labels, val.threshold)
            rows.append(dict(setting=setting_of[known], dim=dim, method=method, seed=seed,
                             f1=test.f1, precision=test.precision, recall=test.recall,
                             val_f1=val.f1, **health, seconds=time.perf_counter() - t0))
            log(f"[{name} generalisation, negatives not in {known}] d={dim} {method:6s} "
                f"seed={seed}: test F1={test.f1:.4f} (val F1={val.f1:.4f}) train edges="
                f"{split.train.shape[0]} stalled={rows[-1]['stalled']:.3f} "
                f"{rows[-1]['seconds']:.0f}s")
        peer_methods = [m for m in args.methods if m in ("gumbel", "soft")] if args.peer else []
        for known, method in itertools.product(protocols, peer_methods):
            t0 = time.perf_counter()
            loop, curve = train_peer(graph, dim, method, args, epochs, negatives, seed, hp,
                                     split.train, known_edges[known], val_pairs, val_labels,
                                     eval_every)
            val = best_f1_threshold(loop.score(val_pairs), val_labels)
            test = f1_at(loop.score(test_pairs), test_labels, val.threshold)
            rows.append(dict(setting=setting_of[known], dim=dim, method=f"{method} ({args.peer})",
                             seed=seed, f1=test.f1, precision=test.precision,
                             recall=test.recall, val_f1=val.f1, epochs=curve[-1][0] if curve
                             else 0, f1_curve=curve, stalled=math.nan, zero_grad=math.nan,
                             seconds=time.perf_counter() - t0))
            log(f"[{name} generalisation, negatives not in {known}] d={dim} {method} "
                f"({args.peer}) seed={seed}: test F1={test.f1:.4f} (val F1={val.f1:.4f}) "
                f"{rows[-1]['seconds']:.0f}s")
    return rows


def train_peer(graph, dim, method, args, epochs, negatives, seed, hp, train_edges, known_edges,
               val_pairs, val_labels, eval_every):
    """The same run as :func:`train_phased` written with the box-embeddings library
    (``bench._box_peer.PeerLoop``: its ``BoxTensor``, Gumbel or hard intersection, Bessel-approx
    or soft volume, in a plain Adam loop): the same starting boxes (our initial model for
    `seed`), positives, negatives per positive drawn by the same filtered sampler, batch size
    and lr phases (a new Adam per phase, as ours). Returns the last loop and the validation-F1
    curve ``[(epoch, F1)]``."""
    from bench._box_peer import PeerLoop

    n = graph.number_of_nodes()
    cfg = HierarchyConfig(**box_model(method, hp, args.noise_scale), dim=dim,
                          initializer=args.initializer)
    start = initial_model(n, list(graph.nodes), cfg, train_edges,
                          torch.Generator().manual_seed(seed))
    if cfg.parameterisation != "center_offset":
        raise ValueError("the peer loop needs the center_offset parameterisation")
    center, raw = start.embedding.param1, start.embedding.param2
    known = PairSet(train_edges if known_edges is None else known_edges, n, include_self=True)
    curve: list[tuple[int, float]] = []
    done, loop = 0, None
    for i, (ep, lr) in enumerate(lr_phases(args, epochs)):
        loop = PeerLoop(center, raw, train_edges, beta=hp["beta"],
                        volume_beta=hp["volume_beta"], batch_size=args.batch_size,
                        negatives=negatives, lr=lr, seed=seed + 1000 * i, box=method,
                        temperature=hp["temperature"], known=known)
        every = min(eval_every, ep)                   # as train_phased: per phase
        for e in range(ep):
            loop.run_epoch()
            done += 1
            if every and ((e + 1) % every == 0 or e + 1 == ep):
                curve.append((done, best_f1_threshold(loop.score(val_pairs), val_labels).f1))
        center, raw = loop.center, loop.raw
    return loop, curve


def f1_at(scores, labels, threshold):
    """Precision, recall and F1 of ``scores >= threshold`` (an EvalResult-like namespace)."""
    pred, lab = scores >= threshold, labels.bool()
    tp, npred, npos = int((pred & lab).sum()), int(pred.sum()), int(lab.sum())
    return argparse.Namespace(precision=tp / npred if npred else 0.0,
                              recall=tp / npos if npos else 0.0,
                              f1=2 * tp / (npred + npos) if npred + npos else 0.0)


def run_dasgupta(name, graph, dim, args, epochs, negatives, log, world_size, seed, fraction
                 ) -> list[dict]:
    """The published protocol (dasgupta_split): training on the reduction (+ `fraction` of the
    non-basic edges), 5% validation / 5% test positives with 10 negatives each outside
    the closure, training negatives never a held-out positive; test F1 at the validation
    threshold."""
    hp = dict(beta=args.gen_beta, volume_beta=args.gen_volume_beta,
              temperature=args.gen_temperature)
    split = dasgupta_split(graph, fraction, seed=seed)
    rows = []
    for method in args.methods:
        t0 = time.perf_counter()
        model, health = train_phased(split.graph, dim, method, args, epochs, negatives, seed,
                                     hp, train_edges=split.train, world_size=world_size,
                                     known_edges=split.closure, tag=f"{name}-dasgupta")
        ev = evaluate_split(model, split)
        setting = f"dasgupta/{name} (train + {fraction:.0%} non-basic, {args.initializer} init)"
        rows.append(dict(setting=setting, dim=dim, method=method, seed=seed, f1=ev.test.f1,
                         precision=ev.test.precision, recall=ev.test.recall, val_f1=ev.val.f1,
                         **{**health, "f1_curve": []}, seconds=time.perf_counter() - t0))
        log(f"[{name} dasgupta protocol, {split.train.shape[0]} training edges, "
            f"{split.val.shape[0]} val / {split.test.shape[0]} test positives] d={dim} "
            f"{method:6s} seed={seed}: test F1={ev.test.f1:.4f} (val F1={ev.val.f1:.4f}) "
            f"{rows[-1]['seconds']:.0f}s")
    return rows


def table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys((r["setting"], r["dim"], r["method"]) for r in rows))
    lines = []
    for k in keys:
        rs = [r for r in rows if (r["setting"], r["dim"], r["method"]) == k]
        # the peer rows have no training-health record (nan): "-"
        lines.append((*k, *(mean_std([r[c] for r in rs if not math.isnan(r[c])], 4)
                            for c in ("f1", "precision", "recall", "stalled", "zero_grad")),
                      rs[0].get("epochs", "-"), f"{statistics.mean(r['seconds'] for r in rs):.0f}",
                      len(rs)))
    return md_table(["setting", "d", "method", "F1 (mean ± std)", "precision", "recall",
                     "stalled pairs", "zero-grad entries", "epochs", "seconds per run", "seeds"],
                    lines)


def plot_curves(rows: list[dict], path_f1: pathlib.Path, path_zero: pathlib.Path,
                path_stalled: pathlib.Path) -> None:
    recon = [r for r in rows if r["f1_curve"]]
    groups = sorted({(r["setting"], r["dim"]) for r in recon})
    colors = {"gumbel": "tab:blue", "soft": "tab:orange", "hard": "tab:red",
              "normal": "tab:green", "logistic": "tab:purple", "uniform": "tab:brown",
              "negexp": "tab:cyan"}
    ylabels = {"f1_curve": "F1 (reconstruction: all pairs; generalisation: validation)",
               "zero_grad_curve": "fraction of zero gradient entries",
               "stalled_curve": "stalled / violated pairs"}
    for path, key in ((path_f1, "f1_curve"), (path_zero, "zero_grad_curve"),
                      (path_stalled, "stalled_curve")):
        def draw(plt, key=key):
            n_groups = max(1, len(groups))
            fig, axes = plt.subplots(1, n_groups, figsize=(4.5 * n_groups, 3.5), squeeze=False)
            for ax, (setting, dim) in zip(axes[0], groups):
                for r in recon:
                    if (r["setting"], r["dim"]) != (setting, dim):
                        continue
                    pts = r.get(key) or []
                    if not pts:
                        continue
                    xs, ys = zip(*pts) if key == "f1_curve" else (range(1, len(pts) + 1), pts)
                    base = r["method"].split(" ")[0]
                    ax.plot(xs, ys, color=colors[base], alpha=0.8,
                            ls="--" if base != r["method"] else "-",
                            label=r["method"] if r["seed"] == rows[0]["seed"] else None)
                ax.set_title(f"{setting.split('/')[1]}, d={dim}", fontsize=9)
                ax.set_xlabel("epoch")
                ax.set_ylabel(ylabels[key])
                ax.set_ylim(-0.02, 1.02)
                ax.legend(fontsize=8)
            return fig

        save_plot(path, draw)


def plot_boxes_2d(args, path: pathlib.Path) -> None:
    """Learned 2-D Gumbel boxes (corner locations) of a 15-node binary tree, coloured by depth
    (trained only when matplotlib is there to draw them)."""
    save_plot(path, lambda plt: _draw_boxes_2d(plt, args))


def _draw_boxes_2d(plt, args):
    import matplotlib.patches as patches

    g = balanced_tree(2, 3)
    res = train_hierarchy(g, 2, Gumbel(args.beta), volume_beta=args.volume_beta,
                          epochs=100, lr=0.05, batch_size=64, negatives_per_positive=16,
                          seed=args.seed, progress=False)
    boxes = res.model.embedding.all_boxes()
    lo, hi = boxes.lower.detach().cpu(), boxes.upper.detach().cpu()
    f1 = all_pairs_f1(res.model, edge_index(g, transitive_closure(g).edges)).f1
    fig, ax = plt.subplots(figsize=(5, 5))
    cmap = plt.get_cmap("viridis")
    for i in range(g.number_of_nodes()):
        depth = int(math.log2(i + 1))
        ax.add_patch(patches.Rectangle(lo[i].tolist(), *(hi[i] - lo[i]).tolist(), fill=False,
                                       edgecolor=cmap(depth / 3), lw=1.5))
        ax.text(*((lo[i] + hi[i]) / 2).tolist(), str(i), fontsize=7, ha="center", va="center")
    pad = 0.05 * float((hi.max() - lo.min()))
    ax.set_xlim(float(lo[:, 0].min()) - pad, float(hi[:, 0].max()) + pad)
    ax.set_ylim(float(lo[:, 1].min()) - pad, float(hi[:, 1].max()) + pad)
    ax.set_title(f"Gumbel boxes (β={args.beta}, volume β={args.volume_beta}) of a 15-node "
                 f"binary tree\nF1={f1:.3f}; colour = depth; node i's parent is (i-1)//2",
                 fontsize=9)
    return fig


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # subnormal floats (tiny Gumbel gradients, decaying Adam moments) are many times slower on
    # x86 CPUs; flushing them changes nothing measurable here (docs/box_hierarchy.md)
    with flush_denormals(), session(args) as out:
        return _run(args, out, command_line("box_hierarchy.py", argv))


def _run(args, out, cmd: str) -> dict:
    if args.quick:
        args.seeds = 1
    dims = args.dims or ([4, 2] if args.quick else [8, 4])
    height = args.height or (5 if args.quick else 9)
    epochs = args.epochs or (40 if args.quick else 20)
    negatives = args.negatives if not args.quick else min(args.negatives, 32)
    args.batch_size = args.batch_size or (64 if args.quick else 256)
    if args.decay_epochs is None:
        args.decay_epochs = 0 if args.quick else 5
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    t_start = time.perf_counter()
    tree = balanced_tree(2, height)
    log(f"setting 1: balanced binary tree, {tree.number_of_nodes()} nodes, "
        f"{transitive_closure(tree).number_of_edges()} closure edges, {negatives} negatives "
        f"per positive, {epochs} epochs (+ 2 x {args.decay_epochs} decayed), batch "
        f"{args.batch_size}, lr={args.lr} ({args.optimizer}), "
        f"beta={args.beta}, volume_beta={args.volume_beta}, T={args.temperature}")
    rows = [] if args.no_tree else run_reconstruction(f"tree{tree.number_of_nodes()}", tree,
                                                      dims, args, epochs, negatives, log)
    have_wn = (wordnet_dir() / "data.noun").is_file() and not args.no_wordnet and not args.quick
    if have_wn:
        wn_epochs = args.wordnet_epochs or epochs
        wn_neg = args.wordnet_negatives or negatives
        if not args.no_mammal:
            mammal = wordnet_noun_hierarchy(root="mammal.n.01")
            log(f"WordNet mammal: {mammal.number_of_nodes()} synsets, "
                f"{transitive_closure(mammal).number_of_edges()} closure edges")
            if not args.no_reconstruction:
                rows += run_reconstruction("mammal", mammal, [args.wordnet_dim], args,
                                           wn_epochs, wn_neg, log)
            log(f"setting 2: train fraction {args.train_fraction}, {args.gen_negatives} "
                f"negatives, beta={args.gen_beta}, volume_beta={args.gen_volume_beta}, "
                f"T={args.gen_temperature}")
            rows += run_generalisation("mammal", mammal, args.wordnet_dim, args, wn_epochs,
                                       args.gen_negatives, log)
        if args.full_wordnet:
            nouns = wordnet_noun_hierarchy()
            rows += run_generalisation("nouns", nouns, args.wordnet_dim, args, wn_epochs,
                                       args.gen_negatives, log, world_size=args.world_size,
                                       seeds=args.full_seeds)
    elif not args.quick and not args.no_wordnet:
        log(f"WordNet not found in {wordnet_dir()}: skipping the mammal settings")
    plot_curves(rows, out / "f1_curves.png", out / "zero_grad.png", out / "stalled.png")
    plot_boxes_2d(args, out / "boxes_2d.png")
    md = ["# Box embeddings of hierarchies: hard vs soft vs Gumbel", "",
          f"Command: `{cmd}`; total {time.perf_counter() - t_start:.0f} s.", "",
          "F1 over all ordered pairs at the best threshold (reconstruction), or on held-out "
          "closure pairs with the validation threshold (generalisation). stalled pairs: mean "
          "over epochs of the fraction of violated pairs (positives with P < 1/2, negatives "
          "with P > 1/2) whose own loss has a zero gradient. zero-grad entries: "
          "mean over steps of the fraction of gradient entries of the boxes in the batch that "
          "are exactly zero (|g| <= 1e-12).", "", table(rows), "", "## Log", "", "```",
          *lines, "```", ""]
    write_results(out, "results", "\n".join(md), rows)
    print(table(rows))
    print(f"wrote {out}/results.md, results.json, f1_curves.png, zero_grad.png, stalled.png, "
          f"boxes_2d.png")
    return {"rows": rows}


if __name__ == "__main__":
    main()
