"""Learning to explain (L2X-style) with relaxed top-k: which k features carry the label?

Synthetic "switch" data (after Chen et al. 2018, L2X): x ~ N(0, I_n). If x_0 > 0 the label is
1[x_1 + x_2 − x_3 > 0], otherwise 1[x_4 − x_5 + x_6 > 0]; the true explanation of an instance is
{0, 1, 2, 3} or {0, 4, 5, 6} (k = 4 of n = 20 features). A selector network scores the features,
a k-subset is drawn through a stochastic relaxation

    m = relax(θ(x), KSubset(k), noise, regularizer, tau)       (training: soft mask in C_k)
    m = topk(θ(x), k)                                          (test: exact subset)

and a predictor sees only x ⊙ m. We report, per relaxation (Gumbel / Gaussian noise × the four
regularizers), the selection precision |selected ∩ true| / k and the test accuracy of the
predictor on the selected features, as a markdown table and a plot.

Run ``python examples/subset_selection.py --help``.
"""
from __future__ import annotations

import time

import torch
from _common import generator, md_table, minibatches, parser, progress, save_plot, session
from _common import write_results
from torch import nn

import perturb
from perturb.structured import KSubset, topk

K = 4
GROUPS = {True: [0, 1, 2, 3], False: [0, 4, 5, 6]}


def make_data(n_samples: int, n_features: int, generator: torch.Generator):
    """Features, labels and the 0/1 mask of the true explanation of each instance."""
    x = torch.randn(n_samples, n_features, generator=generator)
    pos = x[:, 0] > 0
    logit = torch.where(pos, x[:, 1] + x[:, 2] - x[:, 3], x[:, 4] - x[:, 5] + x[:, 6])
    y = (logit > 0).float()
    truth = torch.zeros_like(x)
    truth[pos.nonzero().squeeze(-1)[:, None], torch.tensor(GROUPS[True])] = 1
    truth[(~pos).nonzero().squeeze(-1)[:, None], torch.tensor(GROUPS[False])] = 1
    return x, y, truth


def mlp(n_in: int, n_out: int, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_out))


def train_one(noise, regularizer, data, args, gen, device):
    x_tr, y_tr, x_te, y_te, t_te = data
    n = x_tr.shape[1]
    selector, predictor = mlp(n, n).to(device), mlp(n, 1).to(device)
    opt = torch.optim.Adam([*selector.parameters(), *predictor.parameters()], lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    history = []
    for _ in range(args.epochs):
        # the shuffle and the noise share one generator on `device` (the permutation is drawn
        # on the generator's device: a CUDA generator cannot drive a CPU randperm)
        for idx in minibatches(len(x_tr), args.batch_size, gen):
            xb, yb = x_tr[idx], y_tr[idx]
            theta = selector(xb)
            mask = perturb.relax(theta, KSubset(K), noise, regularizer, tau=args.tau,
                                 generator=gen)
            loss = loss_fn(predictor(xb * mask).squeeze(-1), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.append(loss.item())
    with torch.no_grad():
        sel = topk(selector(x_te), K)
        precision = float((sel * t_te).sum(-1).mean() / K)
        acc = float(((predictor(x_te * sel).squeeze(-1) > 0).float() == y_te).float().mean())
    return precision, acc, history


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n\n")[0], quick="a < 60 s version")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--n-train", type=int, default=4000)
    p.add_argument("--n-features", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tau", type=float, default=0.5)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.n_train = 4, 1500
    with session(args) as out:
        return _run(args, out)


def _run(args, out) -> dict:
    device = torch.device(args.device)
    gen = generator(args.seed)
    x_tr, y_tr, _ = make_data(args.n_train, args.n_features, gen)
    x_te, y_te, t_te = make_data(2000, args.n_features, gen)
    data = [t.to(device) for t in (x_tr, y_tr, x_te, y_te, t_te)]
    noise_gen = generator(args.seed, device)

    runs = [(nname, noise, rname, reg)
            for nname, noise in (("Gumbel", perturb.Gumbel()), ("Gaussian", perturb.Normal()))
            for rname, reg in (("ExpFamilyEntropy", perturb.ExpFamilyEntropy()),
                               ("Entropy", perturb.Entropy()),
                               ("BinaryEntropy", perturb.BinaryEntropy()),
                               ("SquaredNorm", perturb.SquaredNorm()))]
    results = []
    for nname, noise, rname, reg in progress(runs, desc="relaxations", disable=args.no_progress):
        torch.manual_seed(args.seed)
        t0 = time.perf_counter()
        precision, acc, hist = train_one(noise, reg, data, args, noise_gen, device)
        results.append((nname, rname, precision, acc, time.perf_counter() - t0, hist))

    chance = K / args.n_features
    lines = ["# Learning to explain with relaxed top-k", "",
             f"n = {args.n_features} features, k = {K}, {args.n_train} training samples, "
             f"{args.epochs} epochs, tau = {args.tau}, seed {args.seed}. "
             "Precision = |selected ∩ true| / k on 2000 test points (chance "
             f"{chance:.2f}); accuracy of the predictor on the exact top-k.", "",
             md_table(["noise", "regularizer", "selection precision", "test accuracy",
                       "train time (s)"],
                      [(nname, rname, f"{p:.3f}", f"{a:.3f}", f"{t:.1f}")
                       for nname, rname, p, a, t, _ in results])]
    table = "\n".join(lines) + "\n"
    summary = {"chance_precision": chance,
               "runs": [dict(zip(("noise", "regularizer", "precision", "accuracy", "seconds",
                                  "loss_history"), r)) for r in results]}
    write_results(out, "subset_selection", table, summary)
    print(table)

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        labels = [f"{n[:3]}/{r}" for n, r, *_ in results]
        pos = range(len(results))
        axes[0].bar([p - 0.2 for p in pos], [r[2] for r in results], 0.4, label="precision")
        axes[0].bar([p + 0.2 for p in pos], [r[3] for r in results], 0.4, label="test accuracy")
        axes[0].axhline(chance, color="gray", ls="--", lw=1, label="chance precision")
        axes[0].set_xticks(list(pos), labels, rotation=45, ha="right", fontsize=8)
        axes[0].set_ylim(0, 1.05)
        axes[0].legend(fontsize=8, loc="lower left")
        axes[0].set_title("selection precision and accuracy")
        for (nname, rname, *_, hist) in results:
            axes[1].plot(hist, label=f"{nname[:3]}/{rname}",
                         ls="-" if nname == "Gumbel" else "--")
        axes[1].set_xlabel("epoch")
        axes[1].set_ylabel("last-batch training loss")
        axes[1].legend(fontsize=7)
        axes[1].set_title("training")
        return fig

    save_plot(out / "subset_selection.png", draw)
    print(f"wrote {out / 'subset_selection.md'}, .json and .png")
    return summary


if __name__ == "__main__":
    main()
