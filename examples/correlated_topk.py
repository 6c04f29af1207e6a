"""Selecting contiguous spans: correlated top-k against the plain top-k relaxations.

Synthetic data in the spirit of the BeerAdvocate aspect spans of Paulus et al. (2020, §7.2): an
example has d features and a target t ~ N(0, 1); a contiguous span of k features, at a random
position, carries it (x_i = t + σ ε_i inside the span), every other feature is noise of the same
variance (x_i = √(1 + σ²) ε_i). No single feature shows where the span is; only the agreement
of neighbouring features does. A selector (a small 1-D CNN over the features) scores the
features, a k-subset is drawn through a stochastic relaxation, and an MLP regresses t from the
selected features x ⊙ m:

    (a) correlated top-k: m = first d entries of
        relax([unary, pairwise], CorrelatedKSubset(k), Gumbel(), ExpFamilyEntropy(), tau)
        (Gumbel noise on the d unary and the d − 1 adjacent-pair scores of the CNN);
    (b) top-k:            m = relax(unary, KSubset(k), Gumbel(), f, tau), f one of
        ExpFamilyEntropy, Entropy, SquaredNorm (Euclidean), BinaryEntropy.

At test time the selection is exact: correlated_topk_argmax(...) for (a), topk(unary) for
(b). We report the subset precision |selected ∩ span| / k and the test MSE of the regressor on the
exact selection, as mean ± std over seeds (markdown table), and a plot.

Run ``python examples/correlated_topk.py --help``; ``--quick`` is a < 60 s version.
"""
from __future__ import annotations

import argparse
import time

import torch
from _common import command_line, generator, md_table, mean_std, minibatches, parser, progress
from _common import save_plot, session, write_results
from torch import nn

import perturb
from perturb.structured import (
    CorrelatedKSubset,
    KSubset,
    correlated_topk_argmax,
    topk,
)

METHODS = {
    "correlated top-k (ExpFamilyEntropy)": None,
    "top-k ExpFamilyEntropy": perturb.ExpFamilyEntropy(),
    "top-k Entropy": perturb.Entropy(),
    "top-k Euclidean (SquaredNorm)": perturb.SquaredNorm(),
    "top-k BinaryEntropy": perturb.BinaryEntropy(),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="a < 60 s version (make demo)", threads=1)
    p.add_argument("--n-seeds", type=int, default=5, help="seeds are --seed, --seed + 1, ...")
    p.add_argument("--d", type=int, default=40, help="number of features")
    p.add_argument("--k", type=int, default=5, help="span length = subset size")
    p.add_argument("--sigma", type=float, default=0.5, help="noise of the span features")
    p.add_argument("--n-train", type=int, default=4000)
    p.add_argument("--n-test", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tau", type=float, default=0.5, help="temperature of the relaxations")
    args = p.parse_args(argv)
    if args.quick:
        args.n_seeds, args.epochs, args.n_train, args.n_test, args.d = 2, 5, 1500, 1000, 24
    if not 1 <= args.k <= args.d:
        p.error(f"--k must be in [1, --d], got k={args.k}, d={args.d}")
    return args


def make_data(n: int, d: int, k: int, sigma: float, generator: torch.Generator):
    """Features ``(n, d)``, targets ``(n,)`` and the 0/1 span of each example ``(n, d)``."""
    t = torch.randn(n, generator=generator)
    start = torch.randint(0, d - k + 1, (n,), generator=generator)
    pos = torch.arange(d)
    span = ((pos >= start[:, None]) & (pos < start[:, None] + k)).float()
    noise = torch.randn(n, d, generator=generator)
    x = torch.where(span.bool(), t[:, None] + sigma * noise, (1 + sigma**2) ** 0.5 * noise)
    return x, t, span


class Selector(nn.Module):
    """A local scorer: one conv layer (receptive field 3), then d unary scores (1 × 1 conv) and
    d − 1 adjacent-pair scores (a width-2 conv over the hidden units, receptive field 4). The
    evidence for a span is spread over k positions; only the structured argmax combines it."""

    def __init__(self, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(1, hidden, 3, padding=1), nn.ReLU())
        self.unary = nn.Conv1d(hidden, 1, 1)
        self.pair = nn.Conv1d(hidden, 1, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x[:, None])
        return self.unary(h)[:, 0], self.pair(h)[:, 0]


def regressor(d: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, 1))


def select(method: str, selector: Selector, x: torch.Tensor, k: int, tau: float,
           generator: torch.Generator | None, exact: bool) -> torch.Tensor:
    """The mask ``(n, d)``: relaxed (training) or exact (test)."""
    unary, pair = selector(x)
    d = x.shape[-1]
    if METHODS[method] is None:
        theta = torch.cat([unary, pair], -1)
        if exact:
            return correlated_topk_argmax(theta, k)[:, :d]
        return perturb.relax(theta, CorrelatedKSubset(k), perturb.Gumbel(),
                             perturb.ExpFamilyEntropy(), tau=tau, generator=generator)[:, :d]
    if exact:
        return topk(unary, k)
    return perturb.relax(unary, KSubset(k), perturb.Gumbel(), METHODS[method], tau=tau,
                         generator=generator)


def train_one(method: str, data, args, seed: int, device):
    x_tr, t_tr, x_te, t_te, s_te = data
    torch.manual_seed(seed)
    d = x_tr.shape[1]
    selector, reg = Selector(args.hidden).to(device), regressor(d, args.hidden).to(device)
    opt = torch.optim.Adam([*selector.parameters(), *reg.parameters()], lr=args.lr)
    gen = generator(seed, device)
    order = generator(seed)
    history = []
    for _ in range(args.epochs):
        total = torch.zeros((), device=device)
        for idx in minibatches(len(x_tr), args.batch_size, order, device):
            xb, tb = x_tr[idx], t_tr[idx]
            mask = select(method, selector, xb, args.k, args.tau, gen, exact=False)
            loss = ((reg(xb * mask).squeeze(-1) - tb) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach() * len(idx)
        history.append(float(total) / len(x_tr))
    with torch.no_grad():
        sel = select(method, selector, x_te, args.k, args.tau, None, exact=True)
        precision = float((sel * s_te).sum(-1).mean() / args.k)
        mse = float(((reg(x_te * sel).squeeze(-1) - t_te) ** 2).mean())
    return precision, mse, history


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with session(args) as out:
        return _run(args, out, command_line("correlated_topk.py", argv))


def _run(args, out, cmd: str) -> dict:
    device = torch.device(args.device)
    seeds = list(range(args.seed, args.seed + args.n_seeds))
    results = {m: {"precision": [], "mse": [], "history": [], "time": []} for m in METHODS}
    t0 = time.perf_counter()
    runs = [(m, s) for s in seeds for m in METHODS]
    for method, seed in progress(runs, desc="selectors", unit="run", disable=args.no_progress):
        gen = generator(1000 + seed)
        x_tr, t_tr, _ = make_data(args.n_train, args.d, args.k, args.sigma, gen)
        x_te, t_te, s_te = make_data(args.n_test, args.d, args.k, args.sigma, gen)
        data = [v.to(device) for v in (x_tr, t_tr, x_te, t_te, s_te)]
        t1 = time.perf_counter()
        precision, mse, hist = train_one(method, data, args, seed, device)
        r = results[method]
        r["precision"].append(precision)
        r["mse"].append(mse)
        r["history"].append(hist)
        r["time"].append(time.perf_counter() - t1)
    elapsed = time.perf_counter() - t0

    lines = ["# Contiguous spans: correlated top-k vs top-k relaxations", "",
             f"Command: `{cmd}`", "",
             f"d = {args.d} features, span length k = {args.k} at a random position, "
             f"σ = {args.sigma}, {args.n_train} training / {args.n_test} test examples, "
             f"{args.epochs} epochs, Gumbel noise, τ = {args.tau}; seeds {seeds}; exact "
             f"selection at test time. Subset precision = |selected ∩ span| / k (chance "
             f"{args.k / args.d:.3f}); test MSE of the regressor on the selected features "
             f"(Var t = 1). Mean ± std over seeds; total time {elapsed:.0f} s "
             f"({args.threads} thread(s), {args.device}).", "",
             md_table(["selector", "subset precision", "test MSE", "train time per run (s)"],
                      [(m, mean_std(r["precision"]), mean_std(r["mse"]),
                        f"{sum(r['time']) / len(r['time']):.1f}") for m, r in results.items()])]
    table = "\n".join(lines) + "\n"
    per_seed = {m: {"seeds": seeds, **{key: r[key] for key in ("precision", "mse", "time")}}
                for m, r in results.items()}
    write_results(out, "correlated_topk", table, per_seed)
    print(table)

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        names = list(results)
        prec = [torch.tensor(results[m]["precision"]) for m in names]
        std = [float(p.std()) if len(seeds) > 1 else 0.0 for p in prec]
        axes[0].bar(range(len(names)), [float(p.mean()) for p in prec], yerr=std, capsize=4,
                    color=["C3"] + ["C0"] * (len(names) - 1))
        axes[0].axhline(args.k / args.d, color="gray", ls="--", lw=1, label="chance")
        axes[0].set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names],
                           rotation=30, ha="right", fontsize=7)
        axes[0].set_ylim(0, 1.05)
        axes[0].set_ylabel("subset precision (test, exact selection)")
        axes[0].legend(fontsize=8)
        for i, m in enumerate(names):
            h = torch.tensor(results[m]["history"]).mean(0)
            axes[1].plot(range(1, len(h) + 1), h, label=m, color=f"C{3 if i == 0 else i - 1}",
                         ls="-" if i == 0 else "--")
        axes[1].set_xlabel("epoch")
        axes[1].set_ylabel("training MSE (relaxed mask), mean over seeds")
        axes[1].legend(fontsize=7)
        return fig

    save_plot(out / "correlated_topk.png", draw)
    print(f"wrote {out / 'correlated_topk.md'}, .json and .png")
    return per_seed


if __name__ == "__main__":
    main()
