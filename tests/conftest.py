"""Shared fixtures: seeded randomness so every random test is reproducible."""
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# --import-mode=importlib does not put tests/ on sys.path: the shared test helpers
# (tests/_specs.py: one test spec per structure) are imported by module name
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw the same examples on every run and machine (a seed derived from each
# test), so a landing never hinges on a new random draw. `make fuzz` (this file's "fuzz"
# profile: random seeds, twice the examples where a test does not set its own) explores new
# draws; a failure there prints the --hypothesis-seed that reproduces it.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("fuzz", derandomize=False, max_examples=200)
settings.load_profile("deterministic")


@pytest.fixture(autouse=True)
def _seed_global_rng() -> None:
    """Every test starts from the same global RNG state, whatever ran before it: a test that
    draws from torch's global generator is reproducible on its own and in any order."""
    torch.manual_seed(0)


@pytest.fixture
def seed() -> int:
    torch.manual_seed(0)
    return 0


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def torch_threads():
    """``torch_threads(n)``: torch runs on n threads for the rest of the test; the count it
    had is restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
