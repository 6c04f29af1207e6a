"""examples/_plot_box_curves.py: the validation-F1 figure of docs/box_hierarchy.md draws, per
panel, the curves of the chosen seed and setting from every results.json the panel names."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plot():
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("plot_box_curves",
                                                  ROOT / "examples/_plot_box_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(method, seed, setting, curve):
    return dict(method=method, seed=seed, setting=setting, f1_curve=curve)


def test_panels_merge_files_and_filter_rows(plot, tmp_path, monkeypatch):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([_row("gumbel", 0, "mammal (train + 25%)", [[1, 0.5], [2, 0.7]]),
                             _row("gumbel", 1, "mammal (train + 25%)", [[1, 0.4]])]))
    b.write_text(json.dumps({"rows": [_row("normal", 0, "mammal (train + 25%)", [[1, 0.3]]),
                                      _row("soft", 0, "mammal (train + 0%)", [[1, 0.2]])]}))
    import matplotlib.axes
    drawn = []
    real = matplotlib.axes.Axes.plot

    def spy(self, xs, ys, **kw):
        drawn.append((kw["label"], list(xs), list(ys)))
        return real(self, xs, ys, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    out = tmp_path / "curves.png"
    plot.main([str(out), f"both={a},{b}", f"one={a}#1", "--setting", "25%"])
    assert out.stat().st_size > 0
    # seed 0 and the 25 % setting only: gumbel from a and normal from b in the first panel;
    # in the second, seed 1 of a (its "#1")
    assert drawn == [("gumbel", [1, 2], [0.5, 0.7]), ("normal", [1], [0.3]),
                     ("gumbel", [1], [0.4])]
