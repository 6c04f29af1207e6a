"""Every example script, run in-process: ``main([..., "--quick", "--out", tmp])`` returns its
results, and each test checks the claim the script's table makes (a metric that is finite and
beats the baseline the script states), plus the files it writes. ``--help`` must work without
matplotlib, tqdm or scikit-learn; a CUDA variant runs where CUDA is available.
"""
from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys

import pytest
import torch
from _examples import EXAMPLES_DIR, load_example

EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if not p.name.startswith("_"))
OPTIONAL = ("matplotlib", "tqdm", "sklearn", "mlxtend")
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAVE_SKLEARN = importlib.util.find_spec("sklearn") is not None


load = load_example


def finite(*xs: float) -> bool:
    return all(math.isfinite(x) for x in xs)


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


# --------------------------------------------------------------------------------------------
# what each example claims, checked on its --quick results
# --------------------------------------------------------------------------------------------

def check_quickstart(r, out):
    grads = r["gradients"]
    # Monte-Carlo argmax frequencies agree with the exact probabilities (n = 4000: sd < 0.008)
    assert grads["check"]["Gumbel"] < 0.04 and grads["check"]["Gaussian"] < 0.04
    assert grads["check"]["Gaussian quad"] < 1e-6      # two quadratures of the probit probs
    for est in ("Gumbel-softmax", "Gaussian-softmax"):
        rows = {row["tau"]: row for row in grads["rows"] if row["estimator"] == est}
        assert finite(*(v for row in rows.values() for v in (row["bias"], row["variance"])))
        # the claim of the table: smaller τ, less bias and more variance
        assert rows[0.1]["bias"] < rows[2.0]["bias"]
        assert rows[0.1]["variance"] > rows[2.0]["variance"]
    for name, errors in r["structures"].items():
        if name == "taus":
            continue
        assert errors[0] > errors[-1] or errors[-1] < 1e-6, name    # X_τ → X as τ → 0
        if not name.startswith("Permutations"):                      # Sinkhorn stops short
            assert errors[-1] < 1e-2, name
    hard, coarse, fine = (r["boxes"][k] for k in ("hard", "Gumbel β=0.1", "Gumbel β=0.01"))
    assert hard[:3] == [1.0, 1.0, 0.16] and hard[3] == -math.inf  # child ⊆ parent; disjoint
    assert math.isfinite(coarse[3]) and math.isfinite(fine[3])    # Gumbel: log P stays finite
    for i in range(3):                                  # Gumbel boxes → hard boxes as β → 0
        assert abs(fine[i] - hard[i]) < abs(coarse[i] - hard[i])
    assert r["relaxations"]["sparsemax τ=0.1"]["support"] < 5     # sparsemax has exact zeros
    return ["quickstart.md", "quickstart.json", "quickstart_relaxations.png",
            "quickstart_gradients.png"]


def check_sinkhorn_sort(r, out):
    for row in r["rows"]:
        assert finite(row["final_loss"])
        # a random permutation misplaces a fraction 1 − 1/N of the numbers
        assert row["prop_wrong"] < 0.25 * r["chance_prop_wrong"][row["n"]], row
    return ["sinkhorn_sort.md", "sinkhorn_sort.json", "sinkhorn_sort.png"]


def check_subset_selection(r, out):
    chance = r["chance_precision"]
    assert len(r["runs"]) == 8
    for run in r["runs"]:
        assert run["precision"] > chance + 0.2, run["regularizer"]
        assert run["accuracy"] > 0.6                        # labels are balanced: chance 0.5
    assert max(run["precision"] for run in r["runs"]) > 0.8
    return ["subset_selection.md", "subset_selection.json", "subset_selection.png"]


def check_correlated_topk(r, out):
    chance = 5 / 24                                         # k / d of --quick
    precision = {m: mean(v["precision"]) for m, v in r.items()}
    for m, v in r.items():
        assert precision[m] > chance + 0.1, m
        assert finite(*v["mse"]) and mean(v["mse"]) < 1.0, m      # Var t = 1
    best = max(precision, key=precision.get)
    assert best.startswith("correlated top-k")              # the example's point
    assert json.loads((out / "correlated_topk.json").read_text()).keys() == r.keys()
    return ["correlated_topk.md", "correlated_topk.json", "correlated_topk.png"]


def check_latent_tree(r, out):
    for name in ("Chow-Liu", "Gumbel", "Gaussian"):
        assert r[name]["precision"] > r["chance_precision"] + 0.3, name
        assert r[name]["precision"] == r[name]["recall"]          # trees have n − 1 edges
    # Chow-Liu is the maximum-likelihood tree here: the relaxed fits do not beat it
    assert r["Chow-Liu"]["precision"] >= max(r["Gumbel"]["precision"],
                                             r["Gaussian"]["precision"]) - 1e-9
    return ["latent_tree.md", "latent_tree.json", "latent_tree.png"]


def check_compare_perturbations(r, out):
    for target, fits in r["fits"].items():
        for noise, f in fits.items():
            assert finite(*f["train"], *f["qmc"]) and min(f["qmc"]) >= 0, (target, noise)
        if target != "Discrete (K=10)":   # the paper's claim: Normal-Softmax fits these better
            assert mean(fits["Normal-Softmax"]["qmc"]) < mean(fits["Gumbel-Softmax"]["qmc"])
    for target, by_noise in r["identify"].items():
        for noise, kinds in by_noise.items():
            assert kinds["argmax"]["converged"] and kinds["argmax"]["residual"] < 1e-8
    return ["compare_perturbations.md", "compare_perturbations.json",
            "compare_perturbations.png"]


def check_box_hierarchy(r, out):
    f1 = {(row["dim"], row["method"]): row["f1"] for row in r["rows"]}
    assert set(f1) == {(d, m) for d in (4, 2) for m in ("gumbel", "soft", "hard")}
    for d in (4, 2):
        assert f1[(d, "gumbel")] > 0.9
        assert f1[(d, "gumbel")] > f1[(d, "hard")]      # hard boxes stall (zero gradients)
    assert (out / "results.md").read_text().count("| reconstruction/tree63 |") == 6
    return ["results.md", "results.json", "f1_curves.png", "zero_grad.png", "stalled.png",
            "boxes_2d.png"]


def check_categorical_vae(r, out):
    for name, runs in r["runs"].items():
        for run in runs:
            f = run["final"]
            assert finite(f["train_elbo"], f["test_elbo"], f["test_iw"])
            # 64 independent fair coins: 64 log 2 = 44.4 nats per image
            assert f["test_elbo"] > -64 * math.log(2) + 10, name
            assert f["test_iw"] > f["test_elbo"] - 0.5, name   # IW bound ≥ ELBO (MC error)
    return ["categorical_vae.md", "categorical_vae.json", "categorical_vae.png"]


def check_ivae(r, out):
    for name in ("iVAE", "VAE"):
        mcc = r["continuous"][name]["mcc"]
        assert all(0 < m <= 1 for m in mcc)
    # training moves the identifiable model's sources towards the true ones
    assert mean(r["continuous"]["iVAE"]["mcc"]) > mean(r["continuous"]["iVAE"]["mcc_at_init"])
    for noise, by_t in r["discrete"]["ivae"].items():
        assert all(0 < m <= 1 for ms in by_t.values() for m in ms), noise
    return ["ivae.md", "ivae_discrete.md", "ivae.json", "ivae.png", "ivae_discrete.png"]


def check_structured_latent(r, out):
    acc = {name: mean(by_k["8"]) for name, by_k in r["accuracy"].items()}
    assert all(0.1 < a <= 1 for a in acc.values())          # 10 classes
    for pe in ("Gumbel selector, per-example", "Gaussian selector, per-example"):
        assert acc[pe] > acc["random k pixels"] + 0.2, pe
    assert mean(r["accuracy_all_pixels"]) > max(acc.values())
    return ["structured_latent.md", "structured_latent.json", "structured_latent.png"]


def check_graph_layout(r, out):
    runs = {key.split(" ", 1)[1]: rs[0] for key, rs in r["runs"].items()}
    assert set(runs) == {"tree", "independent", "topk"}
    for latent, run in runs.items():
        assert finite(run["elbo"], run["prec"], run["rec"]), latent
    # the tree posterior's mode beats a random tree and the independent-edges model
    assert runs["tree"]["prec"] > r["chance_precision"] + 30
    assert runs["tree"]["prec"] > runs["independent"]["prec"]
    table = (out / "graph_layout.md").read_text()
    for name in ("Spanning tree", "Indep. undirected edges", "E.F. top-(n−1)"):
        assert f"| 10 | {name} |" in table
    return ["graph_layout.md", "graph_layout.json", "graph_layout.png"]


def check_listops(r, out):
    for m in ("arborescence", "independent"):
        assert r[m]["accuracy"][0] > r["chance_accuracy"] + 0.1, m
    # the arborescence's mode graph is closer to the parse than independent arcs
    assert r["arborescence"]["precision"][0] > r["independent"]["precision"][0]
    return ["listops.md", "listops.json", "listops.png"]


def check_latent_permutations(r, out):
    (chance,) = r["jigsaw_chance"].values()                 # --quick: digits, p = 2
    rows = {row["method"]: row for row in r["jigsaw"]}
    assert set(rows) == {"Gumbel-Sinkhorn", "Sinkhorn (no noise)"}
    for method, row in rows.items():
        assert row["pieces"] > chance + 0.4, method          # chance 0.25; quick reaches ~0.8
        assert 0 < row["solved"] <= row["pieces"], method    # a solved puzzle has all pieces
    acc = {row["method"]: row["accuracy"] for row in r["connectome"]}
    assert set(acc) == {"Gumbel-Sinkhorn", "Gumbel-Sinkhorn, no regularization",
                        "Sinkhorn (no noise)", "MCMC"}
    (cands,) = {row["candidates"] for row in r["connectome"]}
    # a random labelling within the candidates gets about 1 / (mean candidates) right
    assert acc["Gumbel-Sinkhorn"] > 3 / cands and acc["Gumbel-Sinkhorn"] > 0.6
    assert acc["Gumbel-Sinkhorn"] >= acc["MCMC"]
    assert "| Gumbel-Sinkhorn | 0.97 | 0.96 |" in (out / "latent_permutations.md").read_text()
    return ["latent_permutations.md", "latent_permutations.json", "latent_permutations.png"]


CHECKS = {name[len("check_"):]: f for name, f in dict(globals()).items()
          if name.startswith("check_")}
NEEDS_SKLEARN = {"categorical_vae", "structured_latent",     # the bundled digits
                 "latent_permutations"}


def test_every_example_is_checked():
    assert sorted(CHECKS) == sorted(p.stem for p in EXAMPLES)


def _run_quick(name: str, tmp_path: pathlib.Path, *extra: str):
    if name in NEEDS_SKLEARN and not HAVE_SKLEARN:
        pytest.skip("scikit-learn is not installed (the digits data)")
    out = tmp_path / name
    results = load(name).main(["--quick", "--out", str(out), "--no-progress", *extra])
    assert isinstance(results, dict) and results
    files = CHECKS[name](results, out)
    for f in files:
        if f.endswith(".png") and not HAVE_MATPLOTLIB:
            continue
        assert (out / f).stat().st_size > 0, f
    return results


# the slowest --quick runs in-process on one thread (4-10 s each; the others 0.3-3.5 s)
SLOW = {"categorical_vae", "correlated_topk", "box_hierarchy", "latent_permutations"}


@pytest.mark.parametrize("name", [pytest.param(p.stem, marks=[pytest.mark.slow]
                                               if p.stem in SLOW else []) for p in EXAMPLES])
def test_quick_run(name, tmp_path, torch_threads):
    torch_threads(1)        # small ops: one thread is faster, and much faster under load
    _run_quick(name, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("name", [p.stem for p in EXAMPLES])
def test_quick_run_cuda(name, tmp_path, torch_threads):
    torch_threads(1)
    _run_quick(name, tmp_path, "--device", "cuda")


# --------------------------------------------------------------------------------------------
# --help without the optional packages
# --------------------------------------------------------------------------------------------

def _block_optional(monkeypatch):
    """Make ``import matplotlib`` (tqdm, sklearn, and their submodules) fail."""
    for mod in list(sys.modules):
        if mod.split(".")[0] in OPTIONAL:
            monkeypatch.setitem(sys.modules, mod, None)
    for mod in OPTIONAL:
        monkeypatch.setitem(sys.modules, mod, None)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_help_without_optional_packages(script, monkeypatch, capsys):
    _block_optional(monkeypatch)
    module = load(script.stem)                          # no optional import at module level
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--seed", "--out", "--quick", "--device", "--no-progress"):
        assert flag in text, f"{script.name} lacks {flag}"


def test_quick_run_without_matplotlib_or_tqdm(monkeypatch, capsys, tmp_path):
    """Plots are skipped with a note, the tables and JSON are written, and the progress bar falls
    back to plain text."""
    _block_optional(monkeypatch)
    r = load("graph_layout").main(["--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "graph layout: " in err                                  # the plain progress lines
    assert "matplotlib is not installed" in err
    assert not (tmp_path / "graph_layout.png").exists()
    assert json.loads((tmp_path / "graph_layout.json").read_text())["seeds"] == r["seeds"]
    check_graph_layout(r, tmp_path)


@pytest.mark.slow
def test_box_hierarchy_nested_start_and_denormal_mode(tmp_path, torch_threads):
    """--initializer nested reaches the trainer (the tree starts nested: Gumbel F1 ~1), and the
    example leaves the process's denormal mode as it found it."""
    from perturb._math import denormals_flushed as flushed
    before = flushed()
    torch_threads(1)
    r = load("box_hierarchy").main(["--quick", "--out", str(tmp_path), "--no-progress",
                                    "--initializer", "nested", "--methods", "gumbel",
                                    "--dims", "2", "--epochs", "5"])
    assert flushed() == before
    (row,) = r["rows"]
    assert row["method"] == "gumbel" and row["f1"] > 0.95, row["f1"]


@pytest.mark.slow
def test_box_hierarchy_noise_boxes(tmp_path):
    """--noise normal logistic (the same as --methods normal logistic): boxes perturbed by
    Normal / Logistic noise (expected volumes by quadrature) train through the example and
    score the small tree."""
    r = load("box_hierarchy").main(["--quick", "--out", str(tmp_path), "--no-progress",
                                    "--noise", "normal", "logistic", "--dims", "2",
                                    "--height", "3", "--epochs", "20", "--negatives", "4",
                                    "--noise-scale", "0.05", "--no-wordnet", "--seeds", "1"])
    rows = {row["method"]: row for row in r["rows"]}
    assert set(rows) == {"normal", "logistic"}
    for method, row in rows.items():
        assert 0.5 < row["f1"] <= 1.0, (method, row["f1"])


def test_listops_noise_families(tmp_path, torch_threads):
    """The seed's comparison of noises on the latent arborescence: model names with a noise
    suffix run and get the seed's numbers beside them; an unknown one is refused."""
    torch_threads(1)
    r = load("listops").main(["--quick", "--models", "arborescence:negexp,arborescence:normal",
                              "--out", str(tmp_path), "--no-progress", "--n-train", "300",
                              "--epochs", "1"])
    assert set(r) >= {"arborescence:negexp", "arborescence:normal"}
    text = (tmp_path / "listops.md").read_text()
    assert "71.5 ± 1.4" in text and "65.3 ± 3.7" in text
    with pytest.raises(SystemExit):
        load("listops").main(["--quick", "--models", "arborescence:cauchy", "--no-progress",
                              "--out", str(tmp_path)])
