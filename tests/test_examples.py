"""Every example is a runnable script with --help (the demos themselves run in `make demo`)."""
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
