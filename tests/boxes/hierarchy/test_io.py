"""Tests for perturb.boxes.hierarchy.io: saving and loading trained models."""
from __future__ import annotations

import networkx as nx
import pytest
import torch

from perturb.noise import Gumbel, Logistic
from perturb.boxes.hierarchy import (BoxHierarchyModel, HierarchyConfig, balanced_tree,
                                     load_model, save_model, train_hierarchy)


@pytest.mark.parametrize("method", ["gumbel", "soft", "hard", "logistic"])
def test_save_load_round_trip(tmp_path, method):
    g = nx.relabel_nodes(balanced_tree(2, 3), {i: f"n{i}" for i in range(15)})
    box_model = {"gumbel": dict(noise=Gumbel(0.05)), "soft": dict(noise=None, temperature=0.1),
                 "hard": dict(noise=None), "logistic": dict(noise=Logistic(0.05))}[method]
    cfg = HierarchyConfig(dim=3, **box_model, epochs=2, batch_size=8, seed=0,
                          dtype="float64", parameterisation="min_delta")
    assert cfg.box_model == method
    res = train_hierarchy(g, config=cfg, progress=False)
    path = tmp_path / "model.pt"
    save_model(res.model, path, cfg)
    model, config = load_model(path)
    assert config == cfg and model.nodes == list(g.nodes)
    assert model.hparams() == res.model.hparams() and not model.training
    saved, loaded = res.model.state_dict(), model.state_dict()
    assert saved.keys() == loaded.keys()
    for k, v in saved.items():   # the parameters, and the embedding's extra state (a dict)
        assert torch.equal(loaded[k], v) if isinstance(v, torch.Tensor) else loaded[k] == v
    assert loaded["embedding._extra_state"]["parameterisation"] == "min_delta"
    assert {"embedding.min", "embedding.delta"} <= loaded.keys()
    child, parent = model.ids(["n7", "n7"]), model.ids(["n3", "n0"])
    torch.testing.assert_close(model.log_containment(child, parent),
                               res.model.log_containment(child, parent), rtol=0, atol=0)
    # loads with weights_only (no code runs), and without a config
    save_model(res.model, path)
    assert load_model(path).config is None


def test_save_load_errors(tmp_path):
    model = BoxHierarchyModel(2, 2, nodes=[object(), object()])
    with pytest.raises(ValueError, match="node labels"):
        save_model(model, tmp_path / "m.pt")
    with pytest.raises(ValueError, match="BoxHierarchyModel"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "m.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a hierarchy model"):
        load_model(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="not a node"):
        BoxHierarchyModel(2, 2, nodes=["a", "b"]).ids(["c"])


def test_a_model_saved_before_noise_objects_loads_without_a_warning(tmp_path):
    """Files written with hparams {"method", "beta", "temperature"} load as the same model."""
    import warnings
    res = train_hierarchy(balanced_tree(2, 2), 2, Logistic(0.05), epochs=1, seed=0,
                          progress=False)
    path = tmp_path / "new.pt"
    save_model(res.model, path)
    data = torch.load(path, weights_only=True)
    hp = data["hparams"]
    assert hp.pop("noise") == {"family": "Logistic", "scale": 0.05}
    hp.update(method="logistic", beta=0.05, temperature=0.1)
    torch.save(data, tmp_path / "old.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, _ = load_model(tmp_path / "old.pt")
    assert model.noise == Logistic(0.05) and model.hparams() == res.model.hparams()
