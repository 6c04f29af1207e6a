"""Tests for perturb._settings: one object for the package's process-wide switches."""
from __future__ import annotations

import pytest
import torch

import perturb
from perturb import _fused, _settings
from perturb.structured.permutations import _sinkhorn


def test_context_manager_restores_every_setting():
    before = perturb.settings.current()
    assert set(before) == {"validate", "compiled", "cuda_graphs"}
    with perturb.settings(validate=False, compiled=False, cuda_graphs=False):
        assert perturb.settings.current() == {"validate": False, "compiled": False,
                                              "cuda_graphs": False}
        assert not perturb.validation_enabled() and not _fused.compiled_enabled()
    assert perturb.settings.current() == before


def test_a_plain_call_stays_switched_and_leaves_the_others():
    before = perturb.settings.current()
    try:
        perturb.settings(validate=False)
        assert perturb.settings.current() == {**before, "validate": False}
    finally:
        perturb.settings(**before)
    assert perturb.settings.current() == before


def test_the_switches_are_the_settings_flags():
    """set_validation / set_compiled and the settings move the same flags; value checks really
    stop while validate is off."""
    with perturb.set_validation(False):
        assert perturb.settings.current()["validate"] is False
    with _fused.set_compiled(False):
        assert perturb.settings.current()["compiled"] is False
    bad = torch.tensor([0.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        perturb.softmax(bad)
    with perturb.settings(validate=False):
        perturb.softmax(bad)                       # no value check: NaN through, no error


def test_cuda_graphs_setting_and_the_old_attribute():
    k = torch.ones(2, 2, device="cpu")
    assert not _sinkhorn._graphs_usable(k)          # CPU: never
    assert _settings.CUDA_GRAPHS.value
    with perturb.settings(cuda_graphs=False):
        assert not _settings.CUDA_GRAPHS.value
    assert _sinkhorn.USE_CUDA_GRAPHS is True


@pytest.mark.parametrize("value", ["false", 0, None.__class__])
def test_values_must_be_bools(value):
    with pytest.raises(ValueError, match="validate must be a bool"):
        perturb.settings(validate=value)
    assert perturb.settings.current()["validate"] is True


def test_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError):
        perturb.settings(validation=False)
