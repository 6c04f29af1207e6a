"""Unsupervised parsing of simplified ListOps with a latent arborescence (Paulus et al. 2020).

A model reads a ListOps expression (nested MIN/MAX/MED/SM over digits, perturb.latent.listops)
and must output its value (10 classes). It has no access to the parse: a BiLSTM scores every arc
head i → dependent j, a latent graph X is drawn from the scores, and a GNN passes messages from
dependents to heads over X before a classifier reads the root (the outermost operator). The
latent graph is

    arborescence:  X = relax(s, Arborescences(0), Gumbel(), tau)   (Tutte marginals)
    arborescence:normal, arborescence:negexp: the same with Normal() or NegativeExponential()
                   noise (the seed's comparison of noise families)
    independent:   X_ij = σ((s_ij + Logistic)/tau)                  (binary Concrete per arc)
    gold:          the true parse (optional upper bound, --models gold)

and at test time the mode: the maximum arborescence (Chu-Liu/Edmonds) or the arcs with s > 0.
We report test accuracy and arc precision/recall of the mode against the gold parse (mean ± std
over seeds), a markdown table and a plot (test accuracy per epoch; the last seed's mode graph
of one test expression against its parse).

Scale (default): sequences ≤ 25 tokens, depth ≤ 3, ≤ 4 arguments, 12,000 training expressions,
10 epochs, batch 64, one CPU thread; arcs only from earlier to later tokens (heads precede their
dependents in prefix notation; ``--all-arcs`` lifts this order prior); the seed paper uses ≤ 50
tokens, 5 arguments and 100,000 expressions. ``--quick`` is a < 1 min smoke run.

    python examples/listops.py --seeds 3 --out results/listops
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from _common import generator, md_table, mean_std, minibatches, parser, progress, save_plot
from _common import session, write_results

import perturb
from perturb.latent.listops import (
    LISTOPS_VOCAB,
    LatentListOpsModel,
    arc_precision_recall,
    gold_arborescence,
    make_listops,
)

#: the seed slides' numbers (Paulus et al. 2020, table 3): accuracy, precision, recall
SEED = {"arborescence": ("95.0 ± 3.0", "75.5 ± 7.0", "71.9 ± 12.4"),
        "arborescence:normal": ("95.0 ± 2.2", "65.3 ± 3.7", "60.8 ± 7.3"),
        "arborescence:negexp": ("71.5 ± 1.4", "23.2 ± 10.2", "20.0 ± 6.0"),
        "independent": ("90.1 ± 0.5", "13.0 ± 2.0", "56.4 ± 6.7"),
        "gold": ("98.1 ± 0.1", "100", "100")}


#: the noises of the arborescence's arc scores, by the suffix of a model name
NOISES = {"gumbel": perturb.Gumbel, "normal": perturb.Normal,
          "negexp": perturb.NegativeExponential}


def _batches(data, size: int, generator: torch.Generator | None = None):
    """Minibatches trimmed to their own longest sequence (shuffled when a generator is given)."""
    for idx in minibatches(len(data.values), size, generator):
        n = int(data.lengths[idx].max())
        yield (data.tokens[idx, :n], data.lengths[idx], data.heads[idx, :n], data.values[idx])


@torch.no_grad()
def evaluate(model, data, device, batch_size: int = 250):
    """Test accuracy and arc precision/recall of the mode graph (micro-averaged)."""
    model.eval()
    correct, tp, n_pred, n_gold = 0, 0.0, 0.0, 0.0
    for tok, lens, heads, vals in _batches(data, batch_size):
        tok, lens, heads, vals = (t.to(device) for t in (tok, lens, heads, vals))
        logits, X = model(tok, lens, heads)
        correct += (logits.argmax(-1) == vals).sum().item()
        gold = gold_arborescence(heads, X.dtype)
        p, r = arc_precision_recall(X, gold, lens)
        k_pred, k_gold = (X > 0.5).sum().item(), gold.sum().item()
        tp += p * k_pred
        n_pred += k_pred
        n_gold += k_gold
    model.train()
    return correct / len(data.values), tp / max(n_pred, 1), tp / max(n_gold, 1)


def train_one(graph: str, train, test, args, seed: int, device, bar):
    torch.manual_seed(seed)
    base, _, noise = graph.partition(":")
    model = LatentListOpsModel(base, dim=args.dim, n_rounds=args.rounds, tau=args.tau,
                               hard=args.hard, heads_precede=not args.all_arcs,
                               noise=NOISES[noise or "gumbel"]()).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = generator(seed)
    noise_gen = generator(seed + 1, device)
    curve = []
    for epoch in range(args.epochs):
        for tok, lens, heads, vals in _batches(train, args.batch_size, gen):
            tok, lens, heads, vals = (t.to(device) for t in (tok, lens, heads, vals))
            logits, _ = model(tok, lens, heads, generator=noise_gen)
            loss = F.cross_entropy(logits, vals)
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc, p, r = evaluate(model, test, device)
        curve.append(acc)
        bar.update(1)
        bar.set_postfix(model=graph, seed=seed, epoch=epoch, loss=f"{loss.item():.3f}",
                        acc=f"{acc:.3f}", prec=f"{p:.2f}")
    return model, curve, (acc, p, r)


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__, quick="a < 60 s version", threads=1)
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (from --seed on)")
    p.add_argument("--models", default="arborescence,independent",
                   help="comma-separated: arborescence (Gumbel noise), arborescence:normal, "
                        "arborescence:negexp, independent, gold")
    p.add_argument("--n-train", type=int, default=12000)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--max-length", type=int, default=25)
    p.add_argument("--max-depth", type=int, default=3)
    p.add_argument("--max-args", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--hard", action="store_true",
                   help="straight-through: exact max arborescence / thresholded arcs forward")
    p.add_argument("--all-arcs", action="store_true",
                   help="allow every arc (default: only i -> j with i < j, heads precede "
                        "their dependents in prefix notation)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=None,
                   help="GNN rounds (default: max depth + 1)")
    args = p.parse_args(argv)
    for m in args.models.split(","):
        base, _, noise = m.strip().partition(":")
        if m.strip() and (base not in ("arborescence", "independent", "gold")
                          or (noise and (base != "arborescence" or noise not in NOISES))):
            p.error(f"unknown model {m.strip()!r}: arborescence[:gumbel|normal|negexp], "
                    f"independent or gold")
    if args.quick:
        args.seeds, args.n_train, args.n_test, args.epochs = 1, 1500, 300, 2
        args.max_length = 18
    args.rounds = args.rounds or args.max_depth + 1
    # validation (connectivity BFS, finiteness) on every training step costs host syncs; the
    # masks are built correct by construction
    with session(args) as out, perturb.set_validation(False):
        return _run(args, out)


def _run(args, out) -> dict:
    device = torch.device(args.device)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results = {m: [] for m in models}
    curves = {m: [] for m in models}
    last = {}
    t0 = time.time()
    seeds = range(args.seed, args.seed + args.seeds)
    bar = progress(total=len(seeds) * len(models) * args.epochs, desc="listops",
                   disable=args.no_progress)
    for seed in seeds:
        g = generator(seed)
        kw = dict(max_depth=args.max_depth, max_args=args.max_args, max_length=args.max_length)
        train = make_listops(args.n_train, generator=g, **kw)
        test = make_listops(args.n_test, generator=g, **kw)
        for m in models:
            t1 = time.time()
            model, curve, res = train_one(m, train, test, args, seed, device, bar)
            results[m].append((*res, time.time() - t1))
            curves[m].append(curve)
            last[m] = model
    bar.close()
    wall = time.time() - t0

    lines = [f"# Latent arborescences on simplified ListOps ({len(seeds)} seeds)", "",
             f"≤ {args.max_length} tokens, depth ≤ {args.max_depth}, ≤ {args.max_args} "
             f"arguments; {args.n_train} training / {args.n_test} test expressions, "
             f"{args.epochs} epochs, batch {args.batch_size}, tau {args.tau}"
             f"{' (straight-through)' if args.hard else ''}, dim {args.dim}, "
             f"{args.rounds} GNN rounds, "
             f"{'all arcs allowed' if args.all_arcs else 'arcs i → j only for i < j'}. "
             "Mean ± std over seeds (%); precision/recall of the "
             "mode graph's arcs against the gold parse. Seed: Paulus et al. 2020 (full scale).",
             "", md_table(["latent graph", "test acc.", "edge precision", "edge recall",
                           "time/run (s)", "seed acc.", "seed precision", "seed recall"],
                          [(m, *(mean_std([r[i] for r in rs], 1, 100) for i in range(3)),
                            f"{statistics.mean(r[3] for r in rs):.0f}", *SEED.get(m, ("", "", "")))
                           for m, rs in results.items()]),
             "", f"Wall time {wall:.0f} s ({args.threads} thread(s), device {args.device})."]
    table = "\n".join(lines) + "\n"
    summary = {"seeds": list(seeds), "chance_accuracy": 0.1,
               **{m: {"accuracy": [r[0] for r in rs], "precision": [r[1] for r in rs],
                      "recall": [r[2] for r in rs], "seconds": [r[3] for r in rs],
                      "curves": curves[m]} for m, rs in results.items()}}
    write_results(out, "listops", table, summary)
    print(table)

    j = int(torch.argmax(test.lengths))                     # the longest test expression
    n = int(test.lengths[j])
    tok, lens, heads = test.tokens[j:j + 1, :n], test.lengths[j:j + 1], test.heads[j:j + 1, :n]
    words = [LISTOPS_VOCAB[t] for t in tok[0]]

    def draw(plt):
        fig, axes = plt.subplots(1, 2 + len(models), figsize=(5 * (2 + len(models)), 4.2))
        for m, cs in curves.items():
            for k, c in enumerate(cs):
                axes[0].plot(range(1, len(c) + 1), c, color=f"C{models.index(m)}", alpha=0.8,
                             label=m if k == 0 else None)
        axes[0].set_xlabel("epoch")
        axes[0].set_ylabel("test accuracy (mode graph)")
        axes[0].legend()
        panels = [(gold_arborescence(heads)[0], "gold parse")]
        for m, model in last.items():
            model.eval()
            with torch.no_grad():
                mode = model(tok.to(device), lens.to(device), heads.to(device))[1][0].cpu()
            panels.append((mode, f"mode graph ({m}, seed {seeds[-1]})"))
        for ax, (M, title) in zip(axes[1:], panels):
            ax.imshow(M.numpy(), cmap="Greys", vmin=0, vmax=1)
            ax.set_xticks(range(n), words, rotation=90, fontsize=7)
            ax.set_yticks(range(n), words, fontsize=7)
            ax.set_xlabel("dependent j")
            ax.set_ylabel("head i")
            ax.set_title(title)
        return fig

    save_plot(out / "listops.png", draw)
    print(f"wrote {out / 'listops.md'}, .json and .png")
    return summary


if __name__ == "__main__":
    main()
