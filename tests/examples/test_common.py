"""examples/_common.py, the harness of the example scripts: each helper against a plain
reference (statistics, torch.randperm, json)."""
import importlib.util
import json
import math
import pathlib
import statistics
import sys
import warnings

import pytest
import torch

import perturb

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common():
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location("examples_common", ROOT / "examples/_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mean_std_matches_statistics(common):
    xs = [0.31, 0.47, 0.52, 0.29]
    m, s = statistics.mean(xs), statistics.stdev(xs)
    assert common.mean_std(xs) == f"{m:.3f} ± {s:.3f}"
    assert common.mean_std(xs, 1, 100) == f"{100 * m:.1f} ± {100 * s:.1f}"
    assert common.mean_std(torch.tensor(xs), 4) == f"{m:.4f} ± {s:.4f}"     # tensors too
    assert common.mean_std([2.5], 2) == "2.50 (1 seed)"               # one value: no spread shown
    assert common.mean_std([]) == "-"


def test_md_table(common):
    text = common.md_table(["a", "b", "c"], [["x", 0.123456, 3], ("y", 1e-7, "z")])
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| x | 0.1235 | 3 |",
                                 "| y | 1e-07 | z |"]


def test_generator_is_seeded_on_its_device(common):
    g = common.generator(7)
    assert g.device == torch.device("cpu") and g.initial_seed() == 7
    assert torch.equal(torch.rand(5, generator=g),
                       torch.rand(5, generator=torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("n,batch", [(10, 3), (12, 4), (1, 5)])
def test_minibatches_are_the_same_shuffle_as_randperm(common, n, batch):
    """A CPU generator gives exactly ``torch.randperm(n, generator=g)`` cut in batches, so the
    examples' CPU results did not change when they moved to the helper."""
    got = list(common.minibatches(n, batch, torch.Generator().manual_seed(3)))
    ref = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    assert [len(b) for b in got] == [min(batch, n - i) for i in range(0, n, batch)]
    assert torch.equal(torch.cat(got), ref)
    assert torch.equal(torch.cat(list(common.minibatches(n, batch))), torch.arange(n))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_minibatches_with_a_cuda_generator(common):
    """The subset_selection bug: a CUDA generator driving a CPU randperm raised."""
    g = common.generator(0, "cuda")
    batches = list(common.minibatches(100, 30, g, "cuda"))
    assert all(b.device.type == "cuda" for b in batches)
    assert torch.equal(torch.cat(batches).sort().values.cpu(), torch.arange(100))


def test_session_restores_what_it_changes(common, tmp_path):
    class Args:
        out, seed, threads = str(tmp_path / "a" / "b"), 5, 1

    threads, validation = torch.get_num_threads(), perturb.validation_enabled()
    filters = list(warnings.filters)
    with common.session(Args()) as out:
        assert out.is_dir() and torch.get_num_threads() == 1
        assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(5)))
        perturb.set_validation(not validation)
        warnings.simplefilter("ignore", UserWarning)
    assert torch.get_num_threads() == threads
    assert perturb.validation_enabled() == validation
    assert warnings.filters == filters


def test_parser_has_the_shared_flags(common):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    args = common.parser("doc", threads=1).parse_args(["--quick", "--device", dev])
    assert (args.quick, args.device, args.seed, args.out, args.threads, args.no_progress) == \
        (True, dev, 0, "results/test_common", 1, False)    # results/<calling script>
    assert not hasattr(common.parser("doc").parse_args([]), "threads")
    assert common.parser("doc", out="elsewhere").parse_args([]).out == "elsewhere"


def test_default_out_is_results_slash_script_name():
    """``--out`` defaults to results/<name>, as the README and ``make demo`` say."""
    import subprocess
    help_text = subprocess.run([sys.executable, str(ROOT / "examples" / "sinkhorn_sort.py"),
                                "--help"], capture_output=True, text=True, check=True).stdout
    assert "(default: results/sinkhorn_sort)" in " ".join(help_text.split())


def test_plain_progress_fallback(common, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert list(common.progress(range(25), desc="loop")) == list(range(25))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "loop: 1/25"
    assert err[-1] == "loop: 25/25" and len(err) <= 11
    with common.progress(total=4, desc="bar") as bar:
        bar.set_postfix(loss="0.5")
        bar.update(4)
        bar.write("a line")
    out = capsys.readouterr()
    assert out.err == "bar: 4/4 loss=0.5\n" and out.out == "a line\n"
    with common.progress(total=4, desc="quiet", disable=True) as bar:
        bar.update(4)
    assert capsys.readouterr().err == ""


def test_save_plot_without_matplotlib_skips(common, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    drawn = []
    assert common.save_plot(tmp_path / "p.png", drawn.append) is None
    assert drawn == [] and not (tmp_path / "p.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_save_plot_writes_a_png(common, tmp_path):
    def draw(plt):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        return fig

    path = common.save_plot(tmp_path / "p.png", draw)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib
    assert matplotlib.get_backend().lower() == "agg"


def test_write_results(common, tmp_path):
    res = {"t": torch.tensor([1.0, 2.0]), ("a", 1): (float("nan"), 2), "p": tmp_path}
    paths = common.write_results(tmp_path, "x", "# title", res)
    assert [p.name for p in paths] == ["x.md", "x.json"]
    assert (tmp_path / "x.md").read_text() == "# title\n"
    back = json.loads((tmp_path / "x.json").read_text())
    assert back == {"t": [1.0, 2.0], "a / 1": ["nan", 2], "p": str(tmp_path)}
    assert math.isnan(float(back["a / 1"][0]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only machine")
def test_device_flag_without_cuda_is_a_usage_error(common, capsys):
    """``--device cuda`` on a machine without CUDA (or a device name torch does not know) is an
    argparse error naming the flag, exit status 2, not a traceback from the first allocation."""
    p = common.parser("doc")
    for bad, says in (("cuda", "CUDA is not available"), ("bogus", "not a torch device")):
        with pytest.raises(SystemExit) as exit_info:
            p.parse_args(["--device", bad])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--device" in err and says in err
    assert p.parse_args(["--device", "cpu"]).device == "cpu"
