"""Identifiable VAE (iVAE) vs plain VAE on synthetic nonlinear ICA, and perturbed binary data.

Part 1 (``--part continuous``): sources s ∈ R^5 are conditionally independent Gaussians given a
segment label u (40 segments, random means and variances per segment); observations
x = f(s) ∈ R^25 with f an injective leaky-ReLU MLP (``make_nonlinear_ica``). An iVAE (prior
p(z | u), encoder q(z | x, u)) and a plain VAE (prior N(0, I), encoder q(z | x)) of the same size
are trained by the ELBO; the mean correlation coefficient (MCC) between the true sources and the
posterior means measures recovery up to permutation and scaling. Theory (Khemakhem et al. 2020):
the iVAE is identifiable, the VAE is not.

Part 2 (``--part discrete``): the same sources, observed through the perturbation model

    x = σ((f(s) + ε)/T),   ε ~ Logistic (binary Concrete) or N(0, 1),

whose T → 0 limit is the binary x = 1[f(s) + ε > 0] (P(x = 1) = σ(f) for logistic noise, Φ(f)
for normal noise). An iVAE with the matching perturbed likelihood
(``IVAE(likelihood="perturbed", noise=..., tau=T)``) is trained for each T and noise;
MCC is reported as T decreases to 0.

Run ``python examples/ivae.py --help``; ``--quick`` is a < 60 s version.
"""
from __future__ import annotations

import argparse
import pathlib
import time

import torch
from _common import command_line, generator, md_table, mean_std, minibatches, parser, progress
from _common import save_plot, session, write_results

from perturb import Logistic, Normal
from perturb.latent import IVAE, make_nonlinear_ica, mean_corr_coef, perturbed_binary

NOISES = {"Logistic": Logistic(), "Gaussian": Normal()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="a < 60 s version (make demo)", threads=1)
    p.add_argument("--part", choices=("all", "continuous", "discrete"), default="all")
    p.add_argument("--discrete", action="store_true", help="shorthand for --part discrete")
    p.add_argument("--n-seeds", type=int, default=3,
                   help="seeds of part 1 (--seed, --seed + 1, ...)")
    p.add_argument("--n-seeds-discrete", type=int, default=3, help="seeds of part 2")
    p.add_argument("--epochs", type=int, default=80, help="epochs of part 1")
    p.add_argument("--epochs-discrete", type=int, default=40, help="epochs of part 2")
    p.add_argument("--n-sources", type=int, default=5)
    p.add_argument("--n-segments", type=int, default=40)
    p.add_argument("--n-per-segment", type=int, default=250)
    p.add_argument("--n-per-segment-discrete", type=int, default=150)
    p.add_argument("--d-obs", type=int, default=25)
    p.add_argument("--n-layers", type=int, default=4, help="layers of the mixing MLP")
    p.add_argument("--slope", type=float, default=0.1, help="leaky-ReLU slope of the mixing")
    p.add_argument("--obs-noise", type=float, default=0.0, help="std of noise added to x (part 1)")
    p.add_argument("--obs-scale", type=float, default=0.1, help="std of the Gaussian likelihood")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--logit-scale", type=float, default=4.0,
                   help="part 2: f(s) is rescaled to this std before perturbing (the raw "
                        "mixing output has std ~0.3: binary data would be almost pure noise)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.3, 0.1, 0.03, 0.0])
    p.add_argument("--vae-temperatures", type=float, nargs="*", default=[1.0, 0.0],
                   help="part 2: temperatures at which a plain VAE is also trained (reference)")
    p.add_argument("--eval-every", type=int, default=2)
    args = p.parse_args(argv)
    if args.discrete:
        args.part = "discrete"
    if args.quick:
        args.n_seeds, args.n_seeds_discrete = 2, 1
        args.epochs, args.epochs_discrete = 4, 3
        args.n_per_segment, args.n_per_segment_discrete = 60, 40
        args.temperatures, args.vae_temperatures = [1.0, 0.1, 0.0], [0.0]
    return args


def train(model: IVAE, x, u, s, epochs: int, args, seed: int, bar) -> tuple[list, list]:
    """Adam on the negative ELBO; returns (epochs, MCC) at every --eval-every epochs."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    shuffle = generator(seed)
    curve_e, curve_m = [0], [float(mean_corr_coef(s, model.latents(x, u)))]
    for epoch in range(1, epochs + 1):
        for idx in minibatches(len(x), args.batch_size, shuffle, x.device):
            loss = -model(x[idx], u[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch % args.eval_every == 0 or epoch == epochs:
            curve_e.append(epoch)
            curve_m.append(float(mean_corr_coef(s, model.latents(x, u))))
        bar.update(1)
    return curve_e, curve_m


def data_for(seed: int, n_per_segment: int, args):
    return make_nonlinear_ica(args.n_sources, args.n_segments, n_per_segment, args.d_obs,
                              n_layers=args.n_layers, slope=args.slope, obs_noise=args.obs_noise,
                              generator=generator(seed))


def header(args, part: str) -> list[str]:
    return [f"Command: `{args.command}` (part: {part})", "",
            f"Data: n = {args.n_sources} sources, {args.n_segments} segments, d = {args.d_obs}, "
            f"mixing: {args.n_layers}-layer leaky-ReLU MLP (slope {args.slope}), "
            f"observation noise {args.obs_noise}. Models: encoder/decoder MLPs of width "
            f"{args.hidden}, Adam lr {args.lr}, batch {args.batch_size}. MCC: Pearson "
            "correlation of posterior means with the true sources after the optimal matching "
            "(Hungarian), mean ± std over seeds.", ""]


def run_continuous(args, device, out: pathlib.Path) -> dict:
    seeds = [args.seed + i for i in range(args.n_seeds)]
    models = (("iVAE", True), ("VAE", False))
    res: dict[str, list] = {name: [] for name, _ in models}
    t0 = time.perf_counter()
    with progress(total=len(seeds) * len(models) * args.epochs, desc="iVAE vs VAE",
                  unit="epoch", disable=args.no_progress) as bar:
        for seed in seeds:
            data = data_for(seed, args.n_per_segment, args)
            x, u, s = data.x.to(device), data.u.to(device), data.s.to(device)
            for name, cond in models:
                torch.manual_seed(seed)
                model = IVAE(args.d_obs, args.n_sources, args.n_segments, args.hidden,
                             conditional_prior=cond, obs_scale=args.obs_scale).to(device)
                res[name].append(train(model, x, u, s, args.epochs, args, seed, bar))
                bar.set_postfix_str(f"{name} seed {seed} MCC {res[name][-1][1][-1]:.3f}")
    elapsed = time.perf_counter() - t0
    lines = ["# iVAE vs VAE on nonlinear ICA", ""] + header(args, "continuous") + [
        f"{args.n_per_segment} points per segment, {args.epochs} epochs, seeds {seeds}, "
        f"total time {elapsed:.0f} s.", "",
        md_table(["model", "MCC (mean ± std)", "per seed", "MCC at init"],
                 [(name, mean_std([m[-1] for _, m in res[name]]),
                   ", ".join(f"{m[-1]:.3f}" for _, m in res[name]),
                   mean_std([m[0] for _, m in res[name]])) for name, _ in models])]
    table = "\n".join(lines) + "\n"
    write_results(out, "ivae", table)
    print(table)

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (name, _), color in zip(models, ("C3", "C0")):
            for i, (e, m) in enumerate(res[name]):
                ax.plot(e, m, color=color, alpha=0.8, label=name if i == 0 else None)
        ax.set_xlabel("epoch")
        ax.set_ylabel("MCC")
        ax.set_ylim(0, 1)
        ax.set_title(f"nonlinear ICA: iVAE vs VAE ({len(seeds)} seeds)")
        ax.legend()
        return fig

    save_plot(out / "ivae.png", draw)
    return {"seeds": seeds, **{name: {"mcc": [m[-1] for _, m in res[name]],
                                      "mcc_at_init": [m[0] for _, m in res[name]],
                                      "curves": res[name]} for name, _ in models}}


def run_discrete(args, device, out: pathlib.Path) -> dict:
    seeds = [args.seed + i for i in range(args.n_seeds_discrete)]
    temps = args.temperatures
    vae_temps = [t for t in args.vae_temperatures if t in temps]
    jobs = [(n, t, True) for n in NOISES for t in temps] + \
        [(n, t, False) for n in NOISES for t in vae_temps]
    res: dict[tuple[str, float, bool], list[float]] = {j: [] for j in jobs}
    t0 = time.perf_counter()
    with progress(total=len(seeds) * len(jobs) * args.epochs_discrete, desc="perturbed binary",
                  unit="epoch", disable=args.no_progress) as bar:
        for seed in seeds:
            data = data_for(seed, args.n_per_segment_discrete, args)
            u, s = data.u.to(device), data.s.to(device)
            f = data.mixing(data.s)
            f = f * (args.logit_scale / f.std())
            for nname, temp, cond in jobs:
                noise = NOISES[nname]
                x = perturbed_binary(f, temp, noise, generator(1000 + seed)).to(device)
                torch.manual_seed(seed)
                model = IVAE(args.d_obs, args.n_sources, args.n_segments, args.hidden,
                             conditional_prior=cond, likelihood="perturbed", noise=noise,
                             tau=temp).to(device)
                _, m = train(model, x, u, s, args.epochs_discrete, args, seed, bar)
                res[(nname, temp, cond)].append(m[-1])
                bar.set_postfix_str(f"{'iVAE' if cond else 'VAE'} {nname} T={temp} seed {seed} "
                                    f"MCC {m[-1]:.3f}")
    elapsed = time.perf_counter() - t0
    lines = ["# iVAE on perturbed binary observations x = σ((f(s) + ε)/T)", ""] + \
        header(args, "discrete") + [
        f"{args.n_per_segment_discrete} points per segment, {args.epochs_discrete} epochs, seeds "
        f"{seeds}, total time {elapsed:.0f} s. Logits f(s) rescaled to std {args.logit_scale}. "
        "Data generated and modelled with the same noise "
        "(IVAE(likelihood='perturbed', noise=..., tau=T)); T = 0 is the binary limit "
        "x = 1[f(s) + ε > 0].", "",
        md_table(["T", *(f"iVAE, {n} noise" for n in NOISES), *(f"VAE, {n} noise" for n in NOISES)],
                 [(f"{temp:g}", *(mean_std(res[(n, temp, True)]) for n in NOISES),
                   *(mean_std(res[(n, temp, False)]) if temp in vae_temps else "—"
                     for n in NOISES)) for temp in temps])]
    table = "\n".join(lines) + "\n"
    write_results(out, "ivae_discrete", table)
    print(table)
    save_plot(out / "ivae_discrete.png", lambda plt: _draw_discrete(plt, res, temps, vae_temps))
    return {"seeds": seeds, "temperatures": temps,
            "ivae": {n: {f"{t:g}": res[(n, t, True)] for t in temps} for n in NOISES},
            "vae": {n: {f"{t:g}": res[(n, t, False)] for t in vae_temps} for n in NOISES}}


def _draw_discrete(plt, res, temps, vae_temps):
    fig, ax = plt.subplots(figsize=(6, 4))
    pos = list(range(len(temps)))
    for nname, color in zip(NOISES, ("C2", "C4")):
        vals = torch.tensor([res[(nname, t, True)] for t in temps], dtype=torch.float64)
        sd = vals.std(1) if vals.shape[1] > 1 else torch.zeros(len(temps))
        ax.errorbar(pos, vals.mean(1), sd, marker="o", capsize=3, color=color,
                    label=f"iVAE, {nname} noise")
        for t in vae_temps:
            v = torch.tensor(res[(nname, t, False)], dtype=torch.float64)
            ax.plot([temps.index(t)], [float(v.mean())], marker="x", ms=9, ls="none",
                    color=color, label=f"VAE, {nname} noise" if t == vae_temps[0] else None)
    ax.set_xticks(pos, [f"{t:g}" for t in temps])
    ax.set_xlabel("observation temperature T (0 = binary)")
    ax.set_ylabel("MCC")
    ax.set_ylim(0, 1)
    ax.set_title("iVAE on x = σ((f(s) + ε)/T)")
    ax.legend()
    return fig


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.command = command_line("ivae.py", argv)
    results = {}
    with session(args) as out:
        device = torch.device(args.device)
        if args.part in ("all", "continuous"):
            results["continuous"] = run_continuous(args, device, out)
        if args.part in ("all", "discrete"):
            results["discrete"] = run_discrete(args, device, out)
        write_results(out, "ivae", results=results)
        print(f"wrote results to {out}/")
    return results


if __name__ == "__main__":
    main()
