"""Every example is a runnable script with --help (the demos themselves run in `make demo`)."""
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_has_help(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--seed", "--out", "--quick"):
        assert flag in out.stdout, f"{script.name} lacks {flag}"


def test_graph_layout_quick_runs(tmp_path):
    script = EXAMPLES[0].parent / "graph_layout.py"
    out = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr
    table = (tmp_path / "graph_layout.md").read_text()
    for name in ("Spanning tree", "Indep. undirected edges", "E.F. top-(n−1)"):
        assert f"| 10 | {name} |" in table
    assert (tmp_path / "graph_layout.png").stat().st_size > 0
