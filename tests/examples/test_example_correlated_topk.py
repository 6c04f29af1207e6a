"""Smoke test of examples/correlated_topk.py: the data and a one-epoch run of every selector."""

import torch
from _examples import load_example


def _example():
    return load_example("correlated_topk")


def test_data_has_one_contiguous_informative_span():
    ex = _example()
    x, t, span = ex.make_data(500, 12, 4, 0.5, torch.Generator().manual_seed(0))
    assert x.shape == span.shape == (500, 12) and t.shape == (500,)
    assert torch.equal(span.sum(-1), torch.full((500,), 4.0))
    assert torch.equal((span[:, 1:] - span[:, :-1]).abs().sum(-1).clamp(max=2),
                       (span[:, 1:] - span[:, :-1]).abs().sum(-1))    # one run: ≤ 2 edges
    inside = (x * span).sum(-1) / 4
    assert torch.corrcoef(torch.stack([inside, t]))[0, 1] > 0.9       # the span carries t


def test_quick_run_writes_table_and_plot(tmp_path):
    ex = _example()
    ex.main(["--n-seeds", "1", "--epochs", "1", "--n-train", "200", "--n-test", "100",
             "--d", "8", "--k", "3", "--out", str(tmp_path), "--no-progress"])
    table = (tmp_path / "correlated_topk.md").read_text()
    # one seed: cells read "0.812 (1 seed)" (no "± 0.000")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "(1 seed)" in line]
    assert len(rows) == len(ex.METHODS)
    for row in rows:
        precision = float(row.split("|")[2].split("(1 seed)")[0])
        assert 0.0 <= precision <= 1.0
    assert (tmp_path / "correlated_topk.png").stat().st_size > 0
