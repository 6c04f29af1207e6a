"""Tests for perturb.boxes.hierarchy.config: one validated object for every trainer."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from perturb.boxes.hierarchy import HierarchyConfig


def test_defaults_round_trip_and_replace():
    cfg = HierarchyConfig()
    assert HierarchyConfig.from_dict(cfg.to_dict()) == cfg
    c2 = cfg.replace(dim=4, dtype=torch.float64, init=0.2, seed=3)
    assert (c2.dim, c2.dtype, c2.torch_dtype, c2.init, c2.seed) == (
        4, "float64", torch.float64, (0.2, 0.2), 3)
    assert c2.differences(cfg) == {"dim": (4, 10), "dtype": ("float64", "float32"),
                                   "init": ([0.2, 0.2], [0.1, 0.5]), "seed": (3, None)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 3
    with pytest.raises(TypeError, match="unknown HierarchyConfig field"):
        cfg.replace(dimension=3)
    kw = c2.model_kwargs()
    assert kw["dtype"] is torch.float64 and kw["dim"] == 4


@pytest.mark.parametrize("field,value", [
    ("dim", 0), ("dim", 2.5), ("method", "fuzzy"), ("beta", 0.0), ("beta", math.nan),
    ("volume_beta", -1.0), ("temperature", math.inf), ("parameterisation", "polar"),
    ("init", (0.5, 0.2)), ("init", 1.0), ("init", "wide"), ("dtype", "int64"), ("epochs", -1),
    ("lr", 0.0), ("batch_size", 0), ("negatives_per_positive", -1),
    ("negative_weight", math.nan), ("negative_weight", -1.0), ("negative_max_tries", 0),
    ("sampler", "lazy"), ("volume_reg", math.nan), ("volume_threshold", -0.1),
    ("closure", 1), ("seed", -1), ("seed", 1.5), ("diagnostics_every", -1),
    ("grad_tol", -1.0), ("accuracy_threshold", 2.0), ("accuracy_threshold", 0.0),
    ("accuracy_threshold", math.nan), ("eval_every", -1), ("checkpoint_every", 0),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HierarchyConfig(**{field: value})
