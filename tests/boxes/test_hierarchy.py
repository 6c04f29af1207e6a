"""The kept import paths of the hierarchy application (now perturb/boxes/hierarchy/):
``perturb.boxes.{train_hierarchy, ...}``, ``perturb.boxes.hierarchy.*``,
``perturb.boxes.datasets.*`` and ``perturb.boxes.distributed.*`` name the same objects, and
no module of the application imports a private name from another one of its modules."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import perturb.boxes
import perturb.boxes.hierarchy as hierarchy


def test_old_import_paths_name_the_new_objects():
    datasets = importlib.import_module("perturb.boxes.datasets")
    distributed = importlib.import_module("perturb.boxes.distributed")
    for name in datasets.__all__:
        assert getattr(datasets, name) is getattr(hierarchy, name), name
    for name in distributed.__all__:
        assert getattr(distributed, name) is getattr(hierarchy, name), name
    for name in ("BoxHierarchyModel", "train_hierarchy", "evaluate", "all_pairs_f1"):
        assert getattr(perturb.boxes, name) is getattr(hierarchy, name)
    for name in ("TrainHistory", "TrainResult", "EvalResult", "best_f1_threshold",
                 "score_all_pairs", "edge_index", "VOLUME_QUANTILES"):
        assert hasattr(hierarchy, name)
    assert set(hierarchy.__all__) <= set(dir(hierarchy))


def test_no_private_names_imported_across_modules():
    root = Path(hierarchy.__file__).parent
    files = list(root.glob("*.py")) + [root.parent / "datasets.py",
                                        root.parent / "distributed.py"]
    allowed = {("perturb.boxes.intersections", "_log1m_containment")}   # see model.py
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("perturb"):
                for alias in node.names:
                    if alias.name.startswith("_") and (node.module, alias.name) not in allowed:
                        raise AssertionError(f"{path.name} imports {node.module}.{alias.name}")
