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


def test_star_import_keeps_the_package_name():
    """`import perturb; from perturb import *` leaves `perturb` the package (the function is
    perturb.perturb, outside __all__)."""
    ns: dict = {}
    exec("import perturb\nfrom perturb import *", ns)
    assert ns["perturb"] is perturb and callable(ns["relax"])
    assert callable(perturb.perturb) and "perturb" not in perturb.__all__


def test_import_perturb_loads_every_subpackage():
    import subprocess
    import sys
    code = ("import sys, perturb; print(all(f'perturb.{m}' in sys.modules for m in "
            "('structured', 'boxes', 'distributions', 'checks', 'nn', 'latent')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"


def test_every_module_path_gives_the_module():
    """`import perturb.boxes.volumes as V` binds the module: no package attribute (a function
    re-exported from a submodule) has the name of a submodule of the same package."""
    import importlib
    import pkgutil
    import types

    def walk(pkg: types.ModuleType) -> list[str]:
        bad = []
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            if getattr(pkg, info.name, mod) is not mod:
                bad.append(mod.__name__)
            if info.ispkg:
                bad += walk(mod)
        return bad

    assert walk(perturb) == []


def test_install_hints_name_the_distribution():
    """Every `pip install` hint names the distribution, torch-perturb: `perturb[...]` on the
    package index installs an unrelated project."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    files = [*root.glob("perturb/**/*.py"), *root.glob("examples/*.py"), *root.glob("docs/*.md"),
             root / "README.md"]
    bad = [f"{f.relative_to(root)}: {m.group(0)}" for f in files
           for m in re.finditer(r"(?<![\w.-])perturb\[\w+\]", f.read_text(encoding="utf-8"))]
    assert bad == []
