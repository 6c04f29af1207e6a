"""The code in docs/distributions.md runs, and the docstring examples of perturb.distributions
give what they show."""
from __future__ import annotations

import doctest
import importlib
import pathlib
import re

import pytest
import torch

import perturb

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["perturb.distributions.constraints", "perturb.distributions.gibbs",
           "perturb.distributions.relaxed", "perturb.distributions.kl",
           "perturb.distributions.perturbed", "perturb.distributions.subsets",
           "perturb.distributions.trees"]


def test_guide_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/distributions.md").read_text(),
                        re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/distributions.md", "exec"), {})


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    torch.manual_seed(0)
    result = doctest.testmod(mod, extraglobs={"torch": torch, "perturb": perturb},
                             optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.failed == 0
