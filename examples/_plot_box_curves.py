"""Validation-F1 curves of examples/box_hierarchy.py's generalisation runs, one seed per model,
one panel per group of results.json (the figures of docs/box_hierarchy.md, "Random starts").

    python examples/_plot_box_curves.py OUT.png "TITLE=results.json[,more.json...]" ...
        [--seed 0] [--setting "closure-filtered) (train + 25%)"]

A panel draws the rows of every file it names (runs of one model each, say), so that curves of
separate runs share a panel; ``path#S`` takes seed S from that file instead of --seed.
"""
from __future__ import annotations

import argparse
import json

COLORS = {"gumbel": "tab:blue", "soft": "tab:orange", "hard": "tab:red", "normal": "tab:green",
          "logistic": "tab:purple", "uniform": "tab:brown", "negexp": "tab:cyan"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("panels", nargs="+", help="TITLE=path/to/results.json[,other.json...]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setting", default="", help="substring of the rows' setting")
    p.add_argument("--ymin", type=float, default=0.0)
    args = p.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.panels), figsize=(4.6 * len(args.panels), 3.4),
                             squeeze=False)
    for ax, panel in zip(axes[0], args.panels):
        title, paths = panel.split("=", 1)
        for path in paths.split(","):
            path, _, seed = path.partition("#")
            for r in _rows(path):
                if (r["seed"] == (int(seed) if seed else args.seed)
                        and args.setting in r["setting"] and r["f1_curve"]):
                    _draw(ax, r)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation F1")
        ax.set_ylim(args.ymin, 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)


def _draw(ax, r: dict) -> None:
    """One row's validation-F1 curve: solid for ours, dashed for a peer's ("method (peer)")."""
    xs, ys = zip(*r["f1_curve"])
    base = r["method"].split(" ")[0]
    ax.plot(xs, ys, color=COLORS.get(base, "k"), lw=1.2,
            ls="-" if base == r["method"] else "--", label=r["method"])


def _rows(path: str) -> list[dict]:
    """The rows of one results.json (a list of rows, or a dict with ``rows``)."""
    with open(path) as f:
        data = json.load(f)
    return data["rows"] if isinstance(data, dict) else data


if __name__ == "__main__":
    main()
