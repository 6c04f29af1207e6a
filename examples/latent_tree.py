"""Recover a hidden tree from data with relaxed spanning trees.

A random tree on n nodes defines a Gaussian graphical model (each node is a noisy linear function
of its parent). From m samples we learn edge scores θ by minimising a neighbourhood
reconstruction loss (pseudo-likelihood): every variable is predicted from its neighbours in a
random tree X drawn as a *relaxed spanning tree* of θ,

    X = relax(θ, SpanningTrees(), noise, tau)      (Gumbel or Gaussian noise),
    x̂_i = Σ_j X_ij β_ij x_j,   loss = mean_i ‖x_i − x̂_i‖²,

so gradients reach θ through the matrix-tree marginals. The learned tree is the maximum spanning
tree of θ. Baseline: the Chow-Liu tree (maximum spanning tree of the Gaussian mutual information
−½ log(1 − ρ²)), the maximum-likelihood tree. We report edge precision/recall against the true
tree (a spanning tree has n − 1 edges, so precision = recall for tree estimates) and plot the
learned marginals.

    python examples/latent_tree.py --quick
"""
from __future__ import annotations

import time

import torch
from _common import generator, md_table, parser, progress, save_plot, session, write_results

import perturb
from perturb import Gumbel, Normal
from perturb.structured import (
    SpanningTrees,
    max_spanning_tree,
    spanning_tree_marginals,
)


def random_tree(n: int, g: torch.Generator) -> torch.Tensor:
    """A uniformly random labelled tree as a parent array (random attachment order)."""
    order = torch.randperm(n, generator=g)
    parent = torch.full((n,), -1, dtype=torch.long)
    for k in range(1, n):
        parent[order[k]] = order[torch.randint(0, k, (1,), generator=g)]
    return parent


def sample_tree_gaussian(parent: torch.Tensor, m: int, g: torch.Generator) -> torch.Tensor:
    """x_root ~ N(0, 1); x_child = a x_parent + sqrt(1 − a²) ε with |a| ∈ [0.4, 0.9]."""
    n = len(parent)
    a = (0.4 + 0.5 * torch.rand(n, generator=g)) * torch.where(
        torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = torch.zeros(m, n, dtype=torch.float64)
    done = torch.zeros(n, dtype=torch.bool)
    while not done.all():
        for v in range(n):
            p = int(parent[v])
            if done[v] or (p >= 0 and not done[p]):
                continue
            eps = torch.randn(m, generator=g, dtype=torch.float64)
            x[:, v] = eps if p < 0 else a[v] * x[:, p] + (1 - a[v] ** 2).sqrt() * eps
            done[v] = True
    return x


def adjacency(parent: torch.Tensor) -> torch.Tensor:
    n = len(parent)
    A = torch.zeros(n, n, dtype=torch.float64)
    for v in range(n):
        if parent[v] >= 0:
            A[v, parent[v]] = A[parent[v], v] = 1
    return A


def precision_recall(est: torch.Tensor, true: torch.Tensor) -> tuple[float, float]:
    e, t = est.triu(1) > 0.5, true.triu(1) > 0.5
    tp = (e & t).sum().item()
    return tp / max(e.sum().item(), 1), tp / max(t.sum().item(), 1)


def chow_liu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rho = torch.corrcoef(x.T).clamp(-0.999999, 0.999999)
    mi = -0.5 * torch.log1p(-rho ** 2)
    mi.fill_diagonal_(0)
    return max_spanning_tree(mi), mi


def learn(x: torch.Tensor, noise, steps: int, n_samples: int, seed: int, device: str):
    """Minimise the neighbourhood reconstruction loss through relaxed spanning trees."""
    g = generator(seed, device)
    m, n = x.shape
    x = x.to(device)
    theta = torch.zeros(n, n, dtype=torch.float64, device=device, requires_grad=True)
    beta = torch.zeros(n, n, dtype=torch.float64, device=device, requires_grad=True)
    opt = torch.optim.Adam([theta, beta], lr=0.05)
    for step in range(steps):
        tau = max(0.2, 1.0 * (0.2 / 1.0) ** (step / max(1, steps - 1)))
        X = perturb.relax(theta, SpanningTrees(), noise, tau=tau, n_samples=n_samples,
                          generator=g)                      # (K, n, n) relaxed trees
        B = 0.5 * (beta + beta.T)
        xhat = torch.einsum("mj,kij->kmi", x, X * B)          # neighbours' prediction
        loss = ((x.unsqueeze(0) - xhat) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return theta.detach().cpu(), tau, loss.item()


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__, quick="a < 60 s version")
    p.add_argument("--epochs", type=int, default=300, help="optimisation steps per run")
    p.add_argument("--trials", type=int, default=5, help="random trees to recover")
    p.add_argument("--n", type=int, default=15, help="number of nodes (10..20)")
    p.add_argument("--m", type=int, default=40, help="samples per data set")
    p.add_argument("--samples", type=int, default=8, help="relaxed trees per step")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.trials, args.n = 120, 2, 10
    with session(args) as out:
        return _run(args, out)


def _run(args, out) -> dict:
    g = generator(args.seed)
    methods = {"Gumbel": Gumbel(), "Gaussian": Normal()}
    scores = {"Chow-Liu": [], **{k: [] for k in methods}}
    last = {}
    t0 = time.time()
    bar = progress(total=args.trials * len(methods), desc="latent trees",
                   disable=args.no_progress)
    for trial in range(args.trials):
        parent = random_tree(args.n, g)
        true = adjacency(parent)
        x = sample_tree_gaussian(parent, args.m, g)
        x = (x - x.mean(0)) / x.std(0)
        cl, mi = chow_liu(x)
        scores["Chow-Liu"].append(precision_recall(cl, true))
        for name, noise in methods.items():
            theta, tau, loss = learn(x, noise, args.epochs, args.samples,
                                     args.seed + 1000 * trial, args.device)
            est = max_spanning_tree(theta)
            scores[name].append(precision_recall(est, true))
            last[name] = spanning_tree_marginals(theta, tau=tau)
            bar.update(1)
            bar.set_postfix(trial=trial, method=name, loss=f"{loss:.3f}")
        last["true"], last["Chow-Liu MI"] = true, mi
    bar.close()

    summary = {name: {"precision": sum(a for a, _ in pr) / len(pr),
                      "recall": sum(b for _, b in pr) / len(pr),
                      "per_trial": [list(t) for t in pr]} for name, pr in scores.items()}
    summary["chance_precision"] = 2 / args.n   # n − 1 of the n(n − 1)/2 pairs are edges
    lines = [f"# Latent tree recovery (n={args.n}, m={args.m} samples, {args.trials} trees, "
             f"{args.epochs} steps, seed {args.seed})", "",
             md_table(["method", "edge precision", "edge recall"],
                      [(name, f"{summary[name]['precision']:.3f}",
                        f"{summary[name]['recall']:.3f}") for name in scores]),
             "", f"Wall time {time.time() - t0:.1f} s. Learned trees are max spanning trees of "
             "θ; Chow-Liu is the maximum spanning tree of the sample mutual information."]
    table = "\n".join(lines) + "\n"
    write_results(out, "latent_tree", table, summary)
    print(table)

    def draw(plt):
        fig, axes = plt.subplots(1, 4, figsize=(16, 4))
        panels = [("true tree", last["true"]), ("Chow-Liu MI", last["Chow-Liu MI"]),
                  ("marginals (Gumbel)", last["Gumbel"]),
                  ("marginals (Gaussian)", last["Gaussian"])]
        ii, jj = last["true"].nonzero(as_tuple=True)
        for ax, (title, M) in zip(axes, panels):
            im = ax.imshow(M.numpy(), cmap="viridis")
            ax.scatter(jj.numpy(), ii.numpy(), marker="s", s=30, facecolors="none",
                       edgecolors="red", linewidths=0.8)
            ax.set_title(title)
            fig.colorbar(im, ax=ax, fraction=0.046)
        fig.suptitle("last trial; red squares: true edges")
        return fig

    save_plot(out / "latent_tree.png", draw)
    print(f"wrote {out / 'latent_tree.md'}, .json and .png")
    return summary


if __name__ == "__main__":
    main()
