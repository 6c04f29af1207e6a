"""The example gallery of the documentation site: tools/run_gallery.py runs every example (in the
Makefile's DEMOS order) and docs/_ext/perturb_gallery.py makes one page per example from the
outputs of its --quick run (table, plots, the quick and full commands) and an index of cards."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runner_lists_every_example_in_demo_order():
    runner = _load("run_gallery", ROOT / "tools" / "run_gallery.py")
    names = runner.examples()
    scripts = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_"))
    assert sorted(names) == scripts
    assert names[0] == "quickstart"          # the Makefile's DEMOS order


def test_pages_from_cached_outputs(tmp_path):
    pytest.importorskip("sphinx")
    gallery = _load("perturb_gallery", ROOT / "docs" / "_ext" / "perturb_gallery.py")
    docs = tmp_path / "docs"
    (docs).mkdir()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tools").symlink_to(ROOT / "tools")
    (tmp_path / "Makefile").symlink_to(ROOT / "Makefile")
    cache = tmp_path / "cache"
    out = cache / "sinkhorn_sort"
    out.mkdir(parents=True)
    (out / "sinkhorn_sort.md").write_text("# Learning to sort\n\n| N | err |\n|---|---|\n| 5 | 0 |\n")
    (out / "sinkhorn_sort.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (out / ".done").write_text("12.5\n")
    missing = gallery.write(docs, cache)
    assert "sinkhorn_sort" not in missing and "quickstart" in missing
    page = (docs / "gallery" / "sinkhorn_sort.md").read_text()
    assert "python examples/sinkhorn_sort.py --quick" in page
    assert "\npython examples/sinkhorn_sort.py\n" in page
    assert "## Learning to sort" in page and "| 5 | 0 |" in page        # heading one level down
    assert "![sinkhorn_sort](images/sinkhorn_sort__sinkhorn_sort.png)" in page
    assert (docs / "gallery" / "images" / "sinkhorn_sort__sinkhorn_sort.png").exists()
    index = (docs / "gallery" / "index.md").read_text()
    assert ":target: sinkhorn_sort.html" in index and "[quickstart](quickstart.md)" in index
