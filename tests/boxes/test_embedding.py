"""Tests of perturb/boxes/embedding.py: BoxEmbedding."""
import pytest
import torch

from perturb._validation import set_validation
from perturb.boxes import (Box, BoxEmbedding, containment_loss, containment_prob, overlap,
                           volume)
from perturb.noise import Discrete, Gumbel, Logistic, Normal, Uniform

PARAMS = ["center_offset", "min_delta", "sigmoid"]


@pytest.mark.parametrize("param", PARAMS)
def test_init_small_boxes_in_unit_cube(param):
    emb = BoxEmbedding(50, 8, parameterisation=param, init=(0.05, 0.2),
                       generator=torch.Generator().manual_seed(0))
    b = emb.all_boxes()
    assert b.shape == (50, 8)
    assert bool((b.lower >= 0).all()) and bool((b.upper <= 1).all())
    w = b.width
    assert bool((w >= 0.05 - 1e-5).all()) and bool((w <= 0.2 + 1e-5).all())


@pytest.mark.parametrize("param", PARAMS)
def test_forward_shapes_and_gradients(param):
    emb = BoxEmbedding(10, 3, beta=0.1, parameterisation=param,
                       generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[0, 3], [9, 3]])
    b = emb(ids)
    assert isinstance(b, Box) and b.shape == (2, 2, 3)
    torch.testing.assert_close(b[1, 0].lower, emb.all_boxes()[9].lower)
    volume(b, beta=0.1, log=True).sum().backward()
    assert emb.param1.grad is not None and emb.param2.grad is not None
    # the volume depends on the width parameter (param2) in every parameterisation
    touched = (emb.param2.grad.abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert touched == [0, 3, 9]


def test_generator_reproducible_and_dtype():
    a = BoxEmbedding(5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    b = BoxEmbedding(5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert a.param1.dtype == torch.float64
    torch.testing.assert_close(a.param1, b.param1)
    torch.testing.assert_close(a.param2, b.param2)


def test_convenience_methods_match_functions():
    emb = BoxEmbedding(6, 4, beta=0.2, generator=torch.Generator().manual_seed(0))
    p, c = torch.tensor([0, 1]), torch.tensor([2, 3])
    torch.testing.assert_close(emb.containment_prob(p, c),
                               containment_prob(emb(p), emb(c), beta=0.2))
    torch.testing.assert_close(emb.log_containment_prob(p, c),
                               emb.containment_prob(p, c, log=True))
    torch.testing.assert_close(emb.volume(p), volume(emb(p), beta=0.2))
    assert emb.overlap(p, c).shape == (2,)
    hard = BoxEmbedding(6, 4, beta=None, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(hard.volume(p), volume(hard(p)))
    assert "num_entities=6" in repr(emb)


def test_training_makes_child_contained():
    torch.manual_seed(0)
    emb = BoxEmbedding(2, 4, beta=0.05, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(emb.parameters(), lr=0.05)
    parent, child = torch.tensor([0]), torch.tensor([1])
    p0 = emb.containment_prob(parent, child).item()
    for _ in range(150):
        opt.zero_grad()
        containment_loss(emb(parent), emb(child), beta=0.05).backward()
        opt.step()
    p1 = emb.containment_prob(parent, child).item()
    assert p0 < 0.1 and p1 > 0.9


@pytest.mark.parametrize("ids,match", [
    (torch.tensor([0, 10]), r"\[0, 10\).*10"),
    (torch.tensor([-1]), "-1"),
    (torch.tensor([0.0]), "integer"),
    ([0, 1], "torch.Tensor"),
])
def test_bad_ids(ids, match):
    emb = BoxEmbedding(10, 2)
    with pytest.raises(ValueError, match=match):
        emb(ids)


def test_range_check_is_a_value_check():
    emb = BoxEmbedding(10, 2)
    with set_validation(False):
        assert emb(torch.tensor([3])).shape == (1, 2)


@pytest.mark.parametrize("kw,match", [
    ({"num_entities": 0}, "num_entities"), ({"dim": 0}, "dim"), ({"beta": 0.0}, "beta"),
    ({"parameterisation": "polar"}, "parameterisation"), ({"init": (0.2, 0.1)}, "init"),
    ({"init": 1.5}, "init"), ({"noise": Normal(0.1), "beta": 0.2}, "not both"),
    ({"noise": Normal(0.1), "beta": None}, "not both"), ({"noise": Discrete([0.0, 1.0], [0.5, 0.5])}, "lacks continuous"),
])
def test_bad_constructor_arguments(kw, match):
    args = {"num_entities": 3, "dim": 2, **kw}
    with pytest.raises(ValueError, match=match):
        BoxEmbedding(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_module():
    emb = BoxEmbedding(10, 3, beta=0.1, generator=torch.Generator().manual_seed(0)).to("cuda")
    b = emb(torch.tensor([1, 2], device="cuda"))
    assert b.device.type == "cuda"
    emb.containment_prob(torch.tensor([1]), torch.tensor([2])).sum().backward()
    assert emb.param1.grad.device.type == "cuda"


# ---------------------------------------------------------------------- state_dict format
NAMES = {"center_offset": ("center", "offset"), "min_delta": ("min", "delta"),
         "sigmoid": ("min_logit", "delta_logit")}


@pytest.mark.parametrize("param", PARAMS)
def test_state_dict_is_self_describing_and_round_trips(param, tmp_path):
    emb = BoxEmbedding(6, 3, beta=0.07, parameterisation=param, init=(0.1, 0.3),
                       generator=torch.Generator().manual_seed(0))
    sd = emb.state_dict()
    first, second = NAMES[param]
    assert list(sd) == [first, second, "_extra_state"]
    assert sd["_extra_state"] == {"format": 2, "parameterisation": param, "num_entities": 6,
                                  "dim": 3, "beta": 0.07, "noise": None, "init": (0.1, 0.3)}
    assert emb.param1 is getattr(emb, first) and emb.param2 is getattr(emb, second)
    # through a file, loading with weights_only (plain values only), into another module
    torch.save(sd, tmp_path / "emb.pt")
    loaded = torch.load(tmp_path / "emb.pt", weights_only=True)
    other = BoxEmbedding(6, 3, beta=0.5, parameterisation=param,
                         generator=torch.Generator().manual_seed(1))
    other.load_state_dict(loaded)
    torch.testing.assert_close(other.all_boxes().lower, emb.all_boxes().lower, rtol=0, atol=0)
    torch.testing.assert_close(other.all_boxes().upper, emb.all_boxes().upper, rtol=0, atol=0)
    assert other.beta == 0.07 and other.init == (0.1, 0.3)     # taken from the state


@pytest.mark.parametrize("param", PARAMS)
def test_old_param1_param2_state_dict_still_loads(param):
    emb = BoxEmbedding(5, 2, parameterisation=param, generator=torch.Generator().manual_seed(2))
    # the format before the parameters were named: param1, param2 and no extra state
    old = {"param1": emb.param1.detach().clone(), "param2": emb.param2.detach().clone()}
    fresh = BoxEmbedding(5, 2, parameterisation=param,
                         generator=torch.Generator().manual_seed(3))
    result = fresh.load_state_dict(old)              # strict
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(fresh.param1, emb.param1, rtol=0, atol=0)
    torch.testing.assert_close(fresh.param2, emb.param2, rtol=0, atol=0)


def test_old_state_dict_loads_inside_a_parent_module():
    from perturb.boxes.hierarchy import BoxHierarchyModel
    a = BoxHierarchyModel(4, 2, generator=torch.Generator().manual_seed(0))
    old = {"embedding.param1": a.embedding.param1.detach().clone(),
           "embedding.param2": a.embedding.param2.detach().clone()}
    b = BoxHierarchyModel(4, 2, generator=torch.Generator().manual_seed(1))
    b.load_state_dict(old)
    torch.testing.assert_close(b.embedding.all_boxes().lower, a.embedding.all_boxes().lower)
    assert set(b.state_dict()) == {"embedding.center", "embedding.offset",
                                   "embedding._extra_state"}


def test_loading_another_parameterisation_or_size_is_a_clear_error():
    src = BoxEmbedding(5, 2, parameterisation="min_delta")
    dst = BoxEmbedding(5, 2, parameterisation="center_offset")
    with pytest.raises(ValueError, match="parameterisation='min_delta' into one with "
                                         "parameterisation='center_offset'"):
        dst.load_state_dict(src.state_dict())
    with pytest.raises(ValueError, match="num_entities=5 into one with num_entities=6"):
        BoxEmbedding(6, 2, parameterisation="min_delta").load_state_dict(src.state_dict())
    with pytest.raises(ValueError, match="dim=2 into one with dim=3"):
        BoxEmbedding(5, 3, parameterisation="min_delta").load_state_dict(src.state_dict())
    bad = dict(src.state_dict(), _extra_state={"format": 1})
    with pytest.raises(ValueError, match="not a BoxEmbedding state"):
        BoxEmbedding(5, 2, parameterisation="min_delta").load_state_dict(bad)
    future = dict(src.state_dict(), _extra_state=dict(src.get_extra_state(), format=99))
    with pytest.raises(ValueError, match="format 99"):
        BoxEmbedding(5, 2, parameterisation="min_delta").load_state_dict(future)


@pytest.mark.parametrize("param", PARAMS)
def test_set_boxes_is_the_inverse_of_the_parameterisation(param):
    emb = BoxEmbedding(6, 3, parameterisation=param, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    lower = 0.1 + 0.4 * torch.rand(6, 3, generator=gen, dtype=torch.float64)
    upper = lower + 0.05 + 0.4 * torch.rand(6, 3, generator=gen, dtype=torch.float64)
    p1 = emb.param1
    emb.set_boxes(Box(lower, upper))
    assert emb.param1 is p1                                      # same Parameter, in place
    got = emb.all_boxes()
    torch.testing.assert_close(got.lower, lower, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.upper, upper, rtol=1e-12, atol=1e-12)


def test_set_boxes_rejects_bad_boxes():
    emb = BoxEmbedding(2, 2)
    ok = torch.tensor([[0.1, 0.1], [0.2, 0.2]])
    with pytest.raises(ValueError, match="shape"):
        emb.set_boxes(Box(torch.zeros(3, 2), torch.ones(3, 2)))
    with pytest.raises(ValueError, match="> 0"):
        emb.set_boxes(Box(ok, ok))
    with pytest.raises(ValueError, match="finite"):
        emb.set_boxes(Box(ok, torch.full((2, 2), float("inf"))))
    sig = BoxEmbedding(2, 2, parameterisation="sigmoid")
    with pytest.raises(ValueError, match="unit cube|\\(0, 1\\)"):
        sig.set_boxes(Box(ok, ok + 1.0))


# ---------------------------------------------------------------------- noise boxes
class _MyNormal(Normal):
    """A user's noise: usable by the expected volumes, but the state_dict cannot name it."""


@pytest.mark.parametrize("noise", [Normal(0.1), Logistic(0.05)], ids=repr)
def test_noise_boxes_use_the_noise_everywhere(noise):
    emb = BoxEmbedding(6, 3, noise=noise, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64)
    assert emb.noise == noise and emb.beta is None
    p, c = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])
    torch.testing.assert_close(emb.volume(p), volume(emb(p), noise=noise))
    torch.testing.assert_close(emb.containment_prob(p, c),
                               containment_prob(emb(p), emb(c), noise=noise))
    torch.testing.assert_close(emb.log_containment_prob(p, c),
                               containment_prob(emb(p), emb(c), noise=noise, log=True))
    torch.testing.assert_close(emb.overlap(p, c), overlap(emb(p), emb(c), noise=noise))
    emb.containment_prob(p, c).sum().backward()
    assert torch.isfinite(emb.param1.grad).all() and emb.param1.grad.abs().sum() > 0


def test_beta_is_gumbel_noise_and_setting_it_switches_the_model():
    emb = BoxEmbedding(4, 2, beta=0.3)
    assert emb.noise == Gumbel(scale=0.3) and emb.beta == 0.3
    emb.beta = None
    assert emb.noise is None
    emb.noise = Normal(0.2)
    assert emb.beta is None
    with pytest.raises(ValueError, match="beta"):
        emb.beta = -1.0


def test_noise_state_round_trips_with_weights_only(tmp_path):
    emb = BoxEmbedding(5, 2, noise=Logistic(0.07), generator=torch.Generator().manual_seed(0))
    sd = emb.state_dict()
    assert sd["_extra_state"]["noise"] == {"family": "Logistic", "scale": 0.07}
    torch.save(sd, tmp_path / "emb.pt")
    other = BoxEmbedding(5, 2, beta=0.5)
    other.load_state_dict(torch.load(tmp_path / "emb.pt", weights_only=True))
    assert other.noise == Logistic(0.07) and other.beta is None
    # and back to Gumbel boxes from a Gumbel state
    other.load_state_dict(BoxEmbedding(5, 2, beta=0.2).state_dict())
    assert other.noise == Gumbel(0.2)


def test_format_1_state_still_loads():
    emb = BoxEmbedding(5, 2, beta=0.07, generator=torch.Generator().manual_seed(0))
    sd = emb.state_dict()
    sd["_extra_state"] = {k: v for k, v in sd["_extra_state"].items() if k != "noise"}
    sd["_extra_state"]["format"] = 1
    other = BoxEmbedding(5, 2, noise=Normal(0.3))
    other.load_state_dict(sd)
    assert other.noise == Gumbel(0.07)


def test_a_noise_the_state_dict_cannot_record_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match="expected_volume"):
        BoxEmbedding(3, 2, noise=_MyNormal(0.1))


@pytest.mark.parametrize("noise", [Uniform(-0.1, 0.1), Normal(0.1)], ids=repr)
def test_any_box_noise_round_trips_and_scores(noise):
    """A bounded-support noise works like the others: its record survives the state_dict
    (weights_only) and the convenience methods are the core functions on the gathered boxes."""
    import io

    from perturb.boxes import containment_prob
    emb = BoxEmbedding(4, 2, noise=noise)
    buf = io.BytesIO()
    torch.save(emb.state_dict(), buf)
    buf.seek(0)
    other = BoxEmbedding(4, 2)
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert other.noise == noise
    parent, child = torch.tensor([0, 1]), torch.tensor([2, 3])
    torch.testing.assert_close(emb.containment_prob(parent, child),
                               containment_prob(emb(parent), emb(child), noise=noise))
