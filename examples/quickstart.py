"""Quickstart: perturb, then take a regularized argmax.

Section 1 shows the simplex relaxations on a toy score vector: softmax and sparsemax at several
temperatures, a Gumbel-softmax sample and its straight-through (hard) version.

Section 2 compares gradient estimators of the discrete objective

    f(θ) = E[⟨c, onehot(argmax_i θ_i + ε_i)⟩]

for Gumbel noise (then f(θ) = ⟨c, softmax(θ)⟩) and Gaussian noise (a multinomial probit; the
class probabilities are 1-D integrals, computed here by quadrature and differentiated with
autograd). The relaxed estimator ∇_θ⟨c, X_τ⟩ with X_τ = softmax((θ + ε)/τ) (also the
gradient of the straight-through estimator) is biased; its bias shrinks and its variance grows
as τ → 0. The script estimates both against the exact gradient and writes a table and a plot.

Run ``python examples/quickstart.py --quick`` (a few seconds); outputs go to ``--out``.
"""
from __future__ import annotations

import math
import pathlib
import time
import warnings

import torch
from _common import generator, md_table, parser, progress, save_plot, session, write_results

import perturb
from perturb import Gumbel, Normal, Simplex, SquaredNorm
from perturb.categorical import gumbel_softmax, softmax, sparsemax


# --------------------------------------------------------------------------------------------
# section 1: relaxations on a toy problem
# --------------------------------------------------------------------------------------------

def section_relaxations(args, out: pathlib.Path, results: dict) -> str:
    """softmax / sparsemax / Gumbel-softmax / straight-through on one score vector."""
    theta = torch.tensor([1.0, 0.6, 0.2, -0.5, -1.0], dtype=torch.float64, device=args.device)
    gen = generator(args.seed, args.device)
    rows, bars = [], {}
    for tau in (0.1, 0.5, 2.0):
        bars[f"softmax τ={tau}"] = softmax(theta, tau=tau)
        bars[f"sparsemax τ={tau}"] = sparsemax(theta, tau=tau)
    bars["Gumbel-softmax τ=0.5"] = gumbel_softmax(theta, tau=0.5, generator=gen)
    bars["straight-through τ=0.5"] = gumbel_softmax(theta, tau=0.5, hard=True, generator=gen)
    # the same abstraction, spelled out: relax = regularized_argmax(perturb(θ))
    bars["relax(Normal, SquaredNorm) τ=0.5"] = perturb.relax(
        theta, Simplex(), Normal(), SquaredNorm(), tau=0.5, generator=gen)
    for name, y in bars.items():
        rows.append([name] + [round(float(v), 3) for v in y] + [int((y > 0).sum())])
    results["relaxations"] = {r[0]: {"x": r[1:6], "support": r[6]} for r in rows}

    def draw(plt):
        fig, ax = plt.subplots(figsize=(10, 3.5))
        width = 0.8 / len(bars)
        for k, (name, y) in enumerate(bars.items()):
            ax.bar(torch.arange(5) + k * width, y.cpu(), width, label=name)
        ax.set_xticks(torch.arange(5) + 0.4 - width / 2, [f"θ={v:g}" for v in theta.tolist()])
        ax.set_ylabel("probability")
        ax.set_title("Regularized argmax on the simplex (one sample for the stochastic ones)")
        ax.legend(fontsize=7, ncol=2)
        return fig

    save_plot(out / "quickstart_relaxations.png", draw)
    return ("## Relaxations of θ = (1, 0.6, 0.2, −0.5, −1)\n\n"
            + md_table(["relaxation", "x1", "x2", "x3", "x4", "x5", "support"], rows)
            + "\n\nsparsemax has exact zeros; as τ → 0 both tend to the one-hot argmax.\n")


# --------------------------------------------------------------------------------------------
# section 2: Gumbel vs Gaussian softmax gradients: bias and variance
# --------------------------------------------------------------------------------------------

def _probit_probs(theta: torch.Tensor, sigma: float = 1.0, n_grid: int = 4001) -> torch.Tensor:
    """P(argmax_j θ_j + σZ_j = i) = ∫ φ(x − t_i) Π_{j≠i} Φ(x − t_j) dx with t = θ/σ, by the
    trapezoid rule on a wide grid (differentiable in θ)."""
    t = theta / sigma
    lo, hi = float(t.detach().min()) - 12, float(t.detach().max()) + 12
    x = torch.linspace(lo, hi, n_grid, dtype=theta.dtype, device=theta.device)
    d = x[:, None] - t[None, :]                                    # (grid, n)
    log_cdf = torch.special.log_ndtr(d)
    log_pdf = -0.5 * d * d - 0.5 * math.log(2 * math.pi)
    integrand = torch.exp(log_pdf + log_cdf.sum(-1, keepdim=True) - log_cdf)
    return torch.trapezoid(integrand, x, dim=0)


def _exact_gradient(noise_name: str, theta: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    th = theta.detach().clone().requires_grad_()
    p = torch.softmax(th, -1) if noise_name == "Gumbel" else _probit_probs(th)
    (g,) = torch.autograd.grad((p * c).sum(), th)
    return g


def _estimates(noise, theta, c, tau, hard, n, gen) -> torch.Tensor:
    """n independent single-sample estimates ∇_θ⟨c, X_τ⟩, shape (n, d)."""
    th = theta.expand(n, -1).clone().requires_grad_()
    x = perturb.relax(th, Simplex(), noise, tau=tau, hard=hard, generator=gen)
    (g,) = torch.autograd.grad((x @ c).sum(), th)
    return g


def section_gumbel_vs_gaussian(args, out: pathlib.Path, results: dict) -> str:
    """Bias and variance of relaxed gradient estimators against the exact gradient."""
    theta = torch.tensor([0.5, 0.0, -0.3, 0.8, -1.0], dtype=torch.float64, device=args.device)
    c = torch.tensor([1.0, -0.5, 2.0, 0.0, -1.0], dtype=torch.float64, device=args.device)
    n = 4_000 if args.quick else 40_000
    taus = [0.1, 0.2, 0.5, 1.0, 2.0]
    gen = generator(args.seed, args.device)
    rows, curves = [], {}
    check = {}
    for noise_name, noise in (("Gumbel", Gumbel()), ("Gaussian", Normal())):
        exact = _exact_gradient(noise_name, theta, c)
        # sanity: the exact τ→0 objective matches Monte Carlo argmax frequencies
        freq = perturb.argmax(perturb.perturb(theta, noise, n_samples=n, generator=gen)).mean(0)
        probs = (torch.softmax(theta, -1) if noise_name == "Gumbel" else _probit_probs(theta))
        check[noise_name] = float((freq - probs).abs().max())
        # and the library's own quadrature (perturb.noise) agrees with this one
        check[noise_name + " quad"] = float((noise.argmax_probs(theta) - probs).abs().max())
        label = f"{noise_name}-softmax"
        bias_curve, var_curve = [], []
        for tau in progress(taus, desc=label, leave=False, disable=args.no_progress):
            g = _estimates(noise, theta, c, tau, False, n, gen)
            bias = float((g.mean(0) - exact).norm())
            var = float(g.var(0).sum())
            se_bias = float((g.var(0).sum() / n).sqrt())
            bias_curve.append(bias)
            var_curve.append(var)
            rows.append([label, tau, bias, se_bias, var, bias ** 2 + var])
        curves[label] = (bias_curve, var_curve)

    results["gradients"] = {"n": n, "taus": taus, "check": check,
                            "rows": [dict(zip(("estimator", "tau", "bias", "bias_se",
                                                "variance", "mse"), r)) for r in rows]}

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for label, (b, v) in curves.items():
            axes[0].plot(taus, b, marker="o", label=label)
            axes[1].plot(taus, v, marker="o", label=label)
        for ax, title in zip(axes, ("bias ‖E[ĝ] − ∇f‖", "variance tr Cov[ĝ] (one sample)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("temperature τ")
            ax.set_title(title)
        axes[0].legend(fontsize=7)
        fig.suptitle("Gradient of E⟨c, onehot(argmax(θ + ε))⟩: relaxed estimators")
        return fig

    save_plot(out / "quickstart_gradients.png", draw)
    return ("## Gumbel- vs Gaussian-softmax gradient estimators\n\n"
            f"Objective f(θ) = E⟨c, onehot(argmax(θ + ε))⟩, θ = {theta.tolist()}, "
            f"c = {c.tolist()}; {n} single-sample estimates per row. The exact gradient is "
            "(diag p − p pᵀ) c with p = softmax(θ) for Gumbel noise and the autograd gradient "
            "of the quadrature probit probabilities for Gaussian noise (max |Monte-Carlo "
            f"frequency − exact probability|: Gumbel {check['Gumbel']:.3g}, "
            f"Gaussian {check['Gaussian']:.3g}; |this quadrature − Normal().argmax_probs|: "
            f"{check['Gaussian quad']:.2g}).\n\n"
            + md_table(["estimator", "τ", "bias", "bias SE", "variance", "MSE"], rows)
            + "\n\nSmaller τ: less bias, more variance (bias SE: the Monte-Carlo error of the "
              "bias column). The straight-through estimator (``hard=True``) has exactly these "
              "gradients: only its forward value changes (to the exact one-hot).\n")


def section_structures(args, out: pathlib.Path, results: dict) -> str:
    """One call for every structure: relax(θ, structure, noise, tau) → exact argmax as τ → 0."""
    from perturb import argmax, regularized_argmax
    from perturb import perturb as perturb_scores
    from perturb.structured import (Arborescences, KSubset, Permutations,
                                    SinkhornConvergenceWarning, SpanningTrees)

    gen = torch.Generator().manual_seed(args.seed)
    cases = [("Simplex (softmax)", Simplex(), torch.randn(8, generator=gen)),
             ("KSubset(3) (exp. family DP)", KSubset(3), torch.randn(8, generator=gen)),
             ("Permutations (Sinkhorn)", Permutations(n_iters=20000, tol=1e-9),
              torch.randn(6, 6, generator=gen)),
             ("SpanningTrees (Kirchhoff)", SpanningTrees(), torch.randn(6, 6, generator=gen)),
             ("Arborescences (Tutte)", Arborescences(root=0), torch.randn(6, 6, generator=gen))]
    taus = [1.0, 0.1, 0.01, 0.001]
    rows = []
    for name, structure, theta in cases:
        theta = theta.double()
        u = perturb_scores(theta, Gumbel(), generator=gen)  # one perturbed score, shared
        exact = argmax(u, structure)
        with warnings.catch_warnings():
            # Sinkhorn's iterations grow like 1/τ: at τ <= 0.01 it stops short (see footnote)
            warnings.simplefilter("ignore", SinkhornConvergenceWarning)
            errors = [(regularized_argmax(u, structure, tau=t) - exact).abs().max().item()
                      for t in taus]
        rows.append([name] + [f"{e:.3g}" for e in errors])
        results.setdefault("structures", {"taus": taus})[name] = errors
    boxes = _box_demo(results)
    return ("## One abstraction, every structure\n\n"
            "max |X_τ − X| between the regularized argmax of one Gumbel-perturbed score and the "
            "exact argmax of the same score (trees use the exponential-family regularizer: the "
            "Gibbs marginals at temperature τ):\n\n"
            + md_table(["structure"] + [f"τ = {t}" for t in taus], rows)
            + "\n\nSinkhorn (20,000 iterations here) converges slowly at small τ — the number "
              "of iterations grows like 1/τ — so its last columns show the unconverged marginal "
              "error rather than the τ-bias; `sinkhorn` warns when that happens.\n\n" + boxes)


def _box_demo(results: dict) -> str:
    from perturb.boxes import Box, containment_prob, volume

    parent = Box(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]))
    child = Box(torch.tensor([0.2, 0.3]), torch.tensor([0.6, 0.7]))
    far = Box(torch.tensor([3.0, 3.0]), torch.tensor([4.0, 4.0]))
    rows = []
    for beta in (None, 0.1, 0.01):
        rows.append([("hard" if beta is None else f"Gumbel β={beta}"),
                     f"{volume(parent, beta=beta).item():.4f}",
                     f"{containment_prob(parent, child, beta=beta).item():.4f}",
                     f"{containment_prob(child, parent, beta=beta).item():.4f}",
                     f"{containment_prob(far, child, beta=beta, log=True).item():.4g}"])
    results["boxes"] = {r[0]: [float(v) for v in r[1:]] for r in rows}
    return ("Gumbel boxes: volumes and containment probabilities P(b ⊆ a) approach the hard "
            "ones as β → 0; for disjoint boxes the hard probability is 0 with no gradient, the "
            "Gumbel log-probability stays finite and has one (the probability itself underflows "
            "to 0 in floating point once it is below e^-104 in float32):\n\n"
            + md_table(["boxes", "Vol(parent)", "P(child ⊆ parent)", "P(parent ⊆ child)",
                         "log P(child ⊆ far box)"], rows) + "\n")


# >>> DEMO SECTIONS: each is `section(args, out_dir, results) -> markdown`, its numbers put in
# >>> `results`; the lead appends the demos of other structures (permutations, subsets, trees,
# >>> boxes) to this list.
SECTIONS = [
    section_relaxations,
    section_gumbel_vs_gaussian,
    section_structures,
]


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__, quick="fewer samples (a few seconds)")
    args = p.parse_args(argv)
    results: dict = {}
    with session(args) as out:
        start = time.perf_counter()
        parts = ["# perturb quickstart\n"]
        for section in progress(SECTIONS, desc="sections", disable=args.no_progress):
            text = section(args, out, results)
            print(text)
            parts.append(text)
        write_results(out, "quickstart", "\n".join(parts), results)
        print(f"wrote {out / 'quickstart.md'}, .json and PNG plots in "
              f"{time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    main()
