"""Shared fixtures: seeded randomness so every random test is reproducible."""
import sys
from pathlib import Path

import pytest
import torch

# --import-mode=importlib does not put tests/ on sys.path: the shared test helpers
# (tests/_specs.py: one test spec per structure) are imported by module name
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


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
