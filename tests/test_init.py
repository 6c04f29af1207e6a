"""The package namespace (perturb/__init__.py)."""
import torch

import perturb


def test_star_import_keeps_torch_nn():
    """`from perturb import *` after `from torch import nn` leaves nn as torch.nn; the
    subpackages stay reachable as attributes."""
    ns: dict = {}
    exec("from torch import nn\nfrom perturb import *", ns)
    assert ns["nn"] is torch.nn and callable(ns["relax"]) and "structured" not in ns
    assert perturb.nn.GumbelSoftmax and perturb.structured.KSubset and perturb.boxes.Box
    assert perturb.distributions.KSubsetDistribution


def test_all_names_exist():
    assert set(perturb.__all__) <= set(dir(perturb))


def test_modules_are_not_shadowed_by_functions():
    import types

    import perturb

    # the functions keep their names; the modules holding them have their own
    assert callable(perturb.relax) and callable(perturb.perturbed)
    assert isinstance(perturb.core, types.ModuleType)
    assert isinstance(perturb.perturbed_optimizers, types.ModuleType)
    assert perturb.relax is perturb.core.relax
    assert perturb.perturbed is perturb.perturbed_optimizers.perturbed
    assert perturb.relax.__module__ == "perturb.core"


def test_old_module_paths_still_import():
    from perturb.perturbed import fenchel_young_loss
    from perturb.relax import regularized_argmax, relax

    import perturb
    assert relax is perturb.relax and regularized_argmax is perturb.regularized_argmax
    assert fenchel_young_loss is perturb.fenchel_young_loss
