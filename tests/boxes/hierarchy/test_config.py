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
    lazy = cfg.replace(optimizer="sparse_adam")
    assert HierarchyConfig.from_dict(lazy.to_dict()) == lazy
    assert lazy.differences(cfg) == {"optimizer": ("sparse_adam", "adam")}
    old = cfg.to_dict()
    del old["optimizer"]                      # a config saved before the field: dense Adam
    assert HierarchyConfig.from_dict(old).optimizer == "adam"


@pytest.mark.parametrize("field,value", [
    ("dim", 0), ("dim", 2.5), ("method", "fuzzy"), ("beta", 0.0), ("beta", math.nan),
    ("noise", "fuzzy"), ("noise", 0.1),
    ("volume_beta", -1.0), ("temperature", math.inf), ("parameterisation", "polar"),
    ("init", (0.5, 0.2)), ("init", 1.0), ("init", "wide"), ("dtype", "int64"), ("epochs", -1),
    ("lr", 0.0), ("batch_size", 0), ("negatives_per_positive", -1),
    ("negative_weight", math.nan), ("negative_weight", -1.0), ("negative_max_tries", 0),
    ("sampler", "lazy"), ("volume_reg", math.nan), ("volume_threshold", -0.1),
    ("closure", 1), ("seed", -1), ("seed", 1.5), ("diagnostics_every", -1),
    ("grad_tol", -1.0), ("accuracy_threshold", 2.0), ("accuracy_threshold", 0.0),
    ("accuracy_threshold", math.nan), ("eval_every", -1), ("checkpoint_every", 0),
    ("optimizer", "sgd"), ("optimizer", "SparseAdam"), ("optimizer", None),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HierarchyConfig(**{field: value})


# ----------------------------------------------------------------------------- box models
from perturb.noise import Gumbel, Logistic, Normal  # noqa: E402


@pytest.mark.parametrize("old,new", [
    (dict(method="gumbel", beta=0.2), dict(noise=Gumbel(0.2))),
    (dict(method="gumbel"), dict(noise=Gumbel(0.01))),
    (dict(method="normal", beta=0.05), dict(noise=Normal(0.05))),
    (dict(method="logistic", beta=0.05), dict(noise=Logistic(0.05))),
    (dict(method="soft", temperature=0.3), dict(noise=None, temperature=0.3)),
    (dict(method="soft"), dict(noise=None, temperature=0.1)),
    (dict(method="hard"), dict(noise=None)),
    (dict(beta=0.3), dict(noise=Gumbel(0.3))),
])
def test_method_and_beta_warn_and_mean_the_noise(old, new):
    """The strings of the old API are noise objects (or no noise) now: they still work for one
    release, with a FutureWarning saying what to write."""
    with pytest.warns(FutureWarning, match="HierarchyConfig.*(method|beta)"):
        cfg = HierarchyConfig(dim=3, **old)
    assert cfg == HierarchyConfig(dim=3, **new)
    with pytest.warns(FutureWarning):
        assert HierarchyConfig(dim=3).replace(**old) == cfg


def test_box_model_names_and_replace():
    cfg = HierarchyConfig()
    assert (cfg.noise, cfg.temperature, cfg.box_model) == (Gumbel(0.01), None, "gumbel")
    soft = cfg.replace(noise=None, temperature=0.2)
    assert soft.box_model == "soft" and cfg.replace(noise=None).box_model == "hard"
    assert soft.replace(noise=Normal(0.1)).box_model == "normal"      # temperature dropped
    with pytest.raises(ValueError, match="temperature"):
        HierarchyConfig(noise=Normal(0.1), temperature=0.2)
    with pytest.raises(ValueError, match="noise must be"):
        HierarchyConfig(noise="gaussian")
    with pytest.raises(ValueError, match="not both"):
        HierarchyConfig(noise=Normal(0.1), method="gumbel")


def test_old_format_dicts_load_without_a_warning():
    """A checkpoint or saved config written with method/beta loads as the same model."""
    new = HierarchyConfig(noise=Logistic(0.05), dim=4).to_dict()
    assert new["noise"] == {"family": "Logistic", "scale": 0.05}
    old = {k: v for k, v in new.items() if k != "noise"}
    old.update(method="logistic", beta=0.05, temperature=0.1)
    assert HierarchyConfig.from_dict(old) == HierarchyConfig.from_dict(new)
    old.update(method="soft")
    assert HierarchyConfig.from_dict(old).box_model == "soft"


def test_positional_fields_stop_after_the_noise():
    """The old third positional field was beta: a call in the old order fails loudly instead
    of setting volume_beta; (dim, deprecated method name) still works."""
    with pytest.warns(FutureWarning, match="method='gumbel'"):
        assert HierarchyConfig(4, "gumbel").noise == Gumbel(0.01)
    with pytest.raises(TypeError, match="positional"):
        HierarchyConfig(4, "gumbel", 0.05)
    assert "_" not in HierarchyConfig().to_dict()
