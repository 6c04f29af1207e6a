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
