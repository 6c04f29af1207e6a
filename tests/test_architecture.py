"""The import rules of ARCHITECTURE.md, package-wide, and the paths it names.

Every ``import``/``from ... import`` of a ``perturb`` module anywhere in a module (functions
included) is checked: layers point downward (a package's ``__init__`` may re-export its own
subpackages), and names with a leading underscore are not imported across a family boundary
except the exceptions listed in ARCHITECTURE.md (this list must match it and can only shrink:
a stale entry fails too).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "perturb"
ARCHITECTURE = REPO / "ARCHITECTURE.md"

TOOLKIT = {"perturb._settings", "perturb._validation", "perturb._math", "perturb._precision",
           "perturb._vmap", "perturb._autograd", "perturb._linalg", "perturb._deprecation"}
CORE = {"perturb.regularizers", "perturb.structures", "perturb.core", "perturb._engine",
        "perturb.categorical", "perturb.backward", "perturb._fused", "perturb._identify"}

#: (importer, module, name): the exceptions to rule 2 named in ARCHITECTURE.md (none left).
EXCEPTIONS: set[tuple[str, str, str]] = set()


def layer(module: str) -> int:
    """The layer of ARCHITECTURE.md's table (the top-level ``perturb`` above them all)."""
    if module == "perturb":
        return 6
    if module in TOOLKIT:
        return 0
    if module.startswith("perturb.noise"):
        return 1
    if module in CORE:
        return 2
    if module.startswith("perturb.boxes.hierarchy") or module in ("perturb.boxes.datasets",
                                                                 "perturb.boxes.distributed"):
        return 4
    if module.startswith(("perturb.structured", "perturb.boxes")) or module in (
            "perturb.perturbed_optimizers", "perturb.checks"):
        return 3
    if module.startswith("perturb.distributions") or module == "perturb.nn":
        return 4
    if module.startswith("perturb.latent"):
        return 5
    raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md: add it to the table")


def family(module: str) -> str:
    if module in TOOLKIT:
        return "toolkit"
    if module in CORE:
        return "core"
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "structured" and parts[2] in ("trees", "subsets",
                                                                      "permutations"):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> list[tuple[str, str | None]]:
    """``(target module, imported name or None)`` for every perturb import in ``module``; a
    name that is itself a module is returned as the module."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("perturb")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("perturb"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (target, alias.name))
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_downward(module):
    for target, _ in imports(module):
        if MODULES[module].name == "__init__.py" and target.startswith(module + "."):
            continue                              # a package re-exports its subpackages
        assert layer(target) <= layer(module), (
            f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)}): "
            f"dependencies point downward (ARCHITECTURE.md)")


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for module in MODULES:
        for target, name in imports(module):
            if name is not None and name.startswith("_") and not name.startswith("__") \
                    and family(target) != family(module):
                found.add((module, target, name))
    return found


def test_private_names_stay_in_their_family():
    new = _private_imports() - EXCEPTIONS
    assert not new, (f"private names imported across a family boundary: {sorted(new)}; use or "
                     f"add a name without the underscore in a private module of that family "
                     f"(ARCHITECTURE.md, rule 2)")


def test_the_exceptions_are_current_and_documented():
    stale = EXCEPTIONS - _private_imports()
    assert not stale, f"fixed, so remove them from EXCEPTIONS and ARCHITECTURE.md: {stale}"
    text = ARCHITECTURE.read_text()
    for importer, _, name in EXCEPTIONS:
        assert f"`{name}`" in text and importer.replace(".", "/") in text, (importer, name)


def test_the_rule_catches_a_violation(tmp_path, monkeypatch):
    """The checker is not vacuous: a family module importing another family's private name
    is reported."""
    fake = tmp_path / "perturb" / "latent" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from perturb.core import _relax\nfrom perturb.noise._args import draw\n")
    monkeypatch.setitem(MODULES, "perturb.latent.fake", fake)
    found = {(m, t, n) for m, t, n in _private_imports() if m == "perturb.latent.fake"}
    assert found == {("perturb.latent.fake", "perturb.core", "_relax")}


def test_every_path_in_the_architecture_exists():
    text = ARCHITECTURE.read_text()
    paths = set(re.findall(r"`((?:perturb|tests|examples|bench|docs|tools)/[^`\s]*)`", text))
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


# -- no internal flipping of the process-wide switches (issue 27) -----------------------------

#: where the switches are defined (their own spellings)
_SWITCH_HOMES = {"perturb._settings", "perturb._validation", "perturb._fused"}
_SWITCHES = {"set_validation", "settings", "set_compiled"}


def _switch_calls(tree: ast.AST) -> list[int]:
    """Lines of calls to ``set_validation``/``settings``/``set_compiled`` (any spelling)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else None
            if name in _SWITCHES:
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("module", sorted(set(MODULES) - _SWITCH_HOMES))
def test_library_code_never_flips_a_switch(module):
    """Per-call arguments instead of switching process-wide state as plumbing."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    assert _switch_calls(tree) == [], f"{module} calls a process-wide switch"


def test_the_switch_rule_catches_a_violation():
    tree = ast.parse("import perturb\nwith perturb.set_validation(False):\n    pass\n")
    assert _switch_calls(tree) == [2]


def test_gibbs_and_training_run_without_switching(monkeypatch):
    """Patched setters: the Gibbs sampler and one training epoch never enter them."""
    import networkx as nx
    import torch

    import perturb._settings as settings_module
    from perturb.boxes.hierarchy import HierarchyConfig, train_hierarchy
    from perturb.distributions import ArborescenceDistribution, SpanningTreeDistribution

    def refuse(*args, **kwargs):
        raise AssertionError("library code switched a process-wide setting")

    monkeypatch.setattr(settings_module.Switch, "__init__", refuse)
    monkeypatch.setattr(settings_module.settings, "__init__", refuse)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 5, 5, generator=g)
    for validate in (True, False):
        SpanningTreeDistribution(w, validate_args=validate).sample((2,), generator=g)
        ArborescenceDistribution(w, validate_args=validate).sample((2,), generator=g)
    tree = nx.balanced_tree(2, 3, create_using=nx.DiGraph)
    tree = nx.DiGraph([(v, u) for u, v in tree.edges()])
    train_hierarchy(tree, HierarchyConfig(dim=4, epochs=1, batch_size=4), progress=False,
                    generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------
# tests mirror modules: perturb/a/b.py is tested in tests/a/test_b.py (perturb/a/_c.py in
# tests/a/test__c.py). A module tested elsewhere is named here with the file that tests it, or
# with what is still missing, so that a new module without tests fails this rule.
# ------------------------------------------------------------------------------------------

MIRROR_ELSEWHERE = {
    "perturb/_precision.py": "tests/test_precision.py",     # the package-wide precision contract
    "perturb/_validation.py": "tests/test_validation.py",   # the package-wide argument checks
    "perturb/boxes/datasets.py": "tests/boxes/hierarchy/test_graphs.py",      # re-exports only
    "perturb/boxes/distributed.py": "tests/boxes/hierarchy/test_distributed.py",  # re-exports
    "perturb/structured/correlated_topk.py": "tests/structured/subsets/test_correlated.py",
    "perturb/distributions/relaxed.py": "tests/distributions/test_perturbed.py",
    "perturb/structured/subsets/_blocks.py": "tests/structured/subsets/test_correlated.py",
}
# modules whose own test file is still to be written: none (a new entry needs a reason)
MIRROR_MISSING: set[str] = set()


def _mirror(path: Path) -> Path:
    rel = path.relative_to(PACKAGE)
    return REPO / "tests" / rel.parent / f"test_{rel.name}"


def test_every_module_has_its_mirror_test_file():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(REPO))
        if path.name == "__init__.py" or name in MIRROR_MISSING:
            continue
        if not _mirror(path).exists():
            elsewhere = MIRROR_ELSEWHERE.get(name)
            if elsewhere is None or not (REPO / elsewhere).exists():
                missing.append(name)
    assert not missing, f"modules without their test file (tests/<path>/test_<module>.py): {missing}"


def test_the_mirror_exceptions_are_current():
    for name in list(MIRROR_ELSEWHERE) + sorted(MIRROR_MISSING):
        assert (REPO / name).exists(), f"{name} no longer exists: drop it from the table"
        assert not _mirror(REPO / name).exists(), f"{name} has its mirror now: drop the entry"
