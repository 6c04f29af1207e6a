"""pytest plugin of ``make gpu-check``: every test that is skipped without CUDA is a ``gpu`` test.

The suite marks its CUDA tests in two ways, ``@pytest.mark.gpu`` and
``@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")`` (or
another reason naming CUDA); with this plugin (``pytest -p gpu_check_pytest -m gpu``, the
``tools`` folder on ``sys.path``) the second kind gets the ``gpu`` marker too, so that
``-m gpu`` selects all of them.
"""
from __future__ import annotations

import pytest


def needs_cuda(item: pytest.Item) -> bool:
    """Whether ``item`` is marked ``gpu`` or skipped on machines without CUDA."""
    if item.get_closest_marker("gpu") is not None:
        return True
    return any("cuda" in str(m.kwargs.get("reason", "")).lower()
               and "cpu-only" not in str(m.kwargs.get("reason", "")).lower()
               for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs_cuda(item) and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)
