"""The package ships py.typed: `mypy perturb` must report no errors (config in pyproject.toml)."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_is_clean():
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "perturb"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
