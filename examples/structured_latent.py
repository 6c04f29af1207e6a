"""A k-subset latent variable: which k of the 64 pixels of a digit are enough to classify it?

A selector (:class:`perturb.latent.SubsetSelector`) draws a k-subset of the 64 pixels of
scikit-learn's 8x8 digits (binarised) through the stochastic top-k

    m = relax(θ, KSubset(k), noise, tau, hard=True)   (forward: exact k-hot mask of θ + ε;
                                                       backward: the relaxed gradient)

and an MLP classifies x ⊙ m. The scores θ are either one global vector (``per_example=False``:
a fixed set of k pixels for all images) or computed from the image (``per_example=True``:
an amortised, input-dependent choice). At test time the mask is the exact top-k of θ. Noise:
Gumbel or Gaussian. Baselines: the same classifier on k pixels chosen uniformly at random (a
fresh random set per seed) and on all 64 pixels. Test accuracy is reported as mean ± std over
seeds; the plot shows accuracy against k and the selected pixels as 8x8 images.

Run ``python examples/structured_latent.py --help``; ``--quick`` is a < 60 s version.
"""
from __future__ import annotations

import argparse
import time

import torch
from _common import command_line, generator, md_table, mean_std, minibatches, parser, progress
from _common import save_plot, session, write_results
from torch import nn

from perturb import Gumbel, Normal
from perturb.latent import SubsetSelector, binarized_digits

NOISES = {"Gumbel": Gumbel(), "Gaussian": Normal()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="a < 60 s version (make demo)", threads=1)
    p.add_argument("--n-seeds", type=int, default=3, help="seeds are --seed, --seed + 1, ...")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16], help="subset sizes k")
    p.add_argument("--tau", type=float, default=0.5, help="temperature of the relaxation")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=100)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.n_seeds, args.ks = 6, 2, [8]
    return args


class FixedMask(nn.Module):
    """Baseline: a classifier on a fixed mask (k random pixels, or all of them)."""

    def __init__(self, mask: torch.Tensor, n_classes: int, hidden: int):
        super().__init__()
        self.register_buffer("fixed", mask)
        self.predictor = nn.Sequential(nn.Linear(len(mask), hidden), nn.ReLU(),
                                       nn.Linear(hidden, n_classes))

    def forward(self, x):
        m = self.fixed.expand_as(x)
        return self.predictor(x * m), m


def fit(model: nn.Module, data, args, seed: int) -> tuple[float, torch.Tensor]:
    """Train with cross-entropy; returns test accuracy and the mean test mask (selection map)."""
    x_tr, y_tr, x_te, y_te = data
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    shuffle = generator(seed)
    model.train()
    for _ in range(args.epochs):
        for idx in minibatches(len(x_tr), args.batch_size, shuffle, x_tr.device):
            logits, _ = model(x_tr[idx])
            loss = nn.functional.cross_entropy(logits, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        logits, mask = model(x_te)
        acc = float((logits.argmax(-1) == y_te).float().mean())
    return acc, mask.float().mean(0).cpu()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with session(args) as out:
        return _run(args, out, command_line("structured_latent.py", argv))


def _run(args, out, cmd: str) -> dict:
    device = torch.device(args.device)
    x_tr, y_tr, x_te, y_te = binarized_digits(generator=generator(0))
    data = tuple(t.to(device) for t in (x_tr, y_tr, x_te, y_te))
    n = x_tr.shape[1]
    seeds = [args.seed + i for i in range(args.n_seeds)]
    methods = [(f"{nn_} selector, {'per-example' if pe else 'global'}", nn_, pe)
               for pe in (False, True) for nn_ in NOISES] + [("random k pixels", None, None)]
    runs = [(name, nname, pe, k, seed) for k in args.ks for name, nname, pe in methods
            for seed in seeds] + [("all 64 pixels", None, None, n, seed) for seed in seeds]
    acc: dict[tuple[str, int], list[float]] = {}
    maps: dict[tuple[str, int], torch.Tensor] = {}
    t0 = time.perf_counter()
    for name, nname, pe, k, seed in progress(runs, desc="selectors", unit="run",
                                             disable=args.no_progress):
        torch.manual_seed(seed)
        if nname is not None:
            model = SubsetSelector(n, k, 10, args.hidden, noise=NOISES[nname], tau=args.tau,
                                   per_example=pe)
        else:
            mask = torch.zeros(n)
            mask[torch.randperm(n, generator=generator(10_000 + seed))[:k]] = 1.0
            model = FixedMask(mask, 10, args.hidden)
        a, m = fit(model.to(device), data, args, seed)
        acc.setdefault((name, k), []).append(a)
        if seed == seeds[0]:
            maps[(name, k)] = m
    elapsed = time.perf_counter() - t0

    lines = ["# k-subset latent: selecting informative pixels of the digits", "",
             f"Command: `{cmd}`", "",
             f"Binarised sklearn digits ({len(x_tr)} train / {len(x_te)} test), classifier MLP "
             f"of width {args.hidden}, Adam lr {args.lr}, {args.epochs} epochs, relaxation "
             f"relax(θ, KSubset(k), noise, tau={args.tau}, hard=True) in training and the exact "
             f"top-k at test time; seeds {seeds}; test accuracy mean ± std; total time "
             f"{elapsed:.0f} s.", "",
             md_table(["method", *(f"k = {k}" for k in args.ks)],
                      [(name, *(mean_std(acc[(name, k)]) for k in args.ks))
                       for name, *_ in methods]
                      + [("all 64 pixels", f"{mean_std(acc[('all 64 pixels', n)])} (k = 64)",
                          *[""] * (len(args.ks) - 1))])]
    table = "\n".join(lines) + "\n"
    summary = {"seeds": seeds, "ks": args.ks,
               "accuracy": {name: {str(k): acc[(name, k)] for k in args.ks}
                            for name, *_ in methods},
               "accuracy_all_pixels": acc[("all 64 pixels", n)]}
    write_results(out, "structured_latent", table, summary)
    print(table)

    k_show = 8 if 8 in args.ks else args.ks[0]
    shown = [name for name, *_ in methods]

    def draw(plt):
        fig = plt.figure(figsize=(4 + 2.2 * len(shown), 3.8))
        gs = fig.add_gridspec(1, 1 + len(shown), width_ratios=[2.2] + [1] * len(shown))
        ax = fig.add_subplot(gs[0])
        for name, *_ in methods:
            vals = torch.tensor([acc[(name, k)] for k in args.ks], dtype=torch.float64)
            sd = vals.std(1) if vals.shape[1] > 1 else torch.zeros(len(args.ks))
            ax.errorbar(args.ks, vals.mean(1), sd, marker="o", capsize=3, label=name)
        ax.axhline(sum(acc[("all 64 pixels", n)]) / len(seeds), color="k", ls="--", lw=1,
                   label="all 64 pixels")
        ax.set_xlabel("k (pixels kept)")
        ax.set_ylabel("test accuracy")
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.ks, [str(k) for k in args.ks])
        ax.minorticks_off()
        ax.legend(fontsize=6)
        for i, name in enumerate(shown):
            a2 = fig.add_subplot(gs[1 + i])
            a2.imshow(maps[(name, k_show)].view(8, 8), cmap="viridis", vmin=0, vmax=1)
            a2.set_title(name.replace(" selector, ", "\n"), fontsize=7)
            a2.set_xticks([])
            a2.set_yticks([])
        fig.suptitle(f"selected pixels (k = {k_show}, seed {seeds[0]}; per-example: frequency "
                     "of selection over the test set)", fontsize=8)
        return fig

    save_plot(out / "structured_latent.png", draw)
    print(f"wrote {out / 'structured_latent.md'}, .json and .png")
    return summary


if __name__ == "__main__":
    main()
