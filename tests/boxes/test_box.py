"""Tests of perturb/boxes/box.py: the Box container, its constructors and join."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perturb._validation import set_validation
from perturb.boxes import Box, join, volume


def test_attributes_and_properties():
    lo = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.0, 0.0]])
    hi = torch.tensor([[1.0, 3.0], [2.5, 1.0], [-1.0, 0.0]])
    b = Box(lo, hi)
    assert b.shape == (3, 2) and b.batch_shape == (3,) and b.dim == 2 and len(b) == 3
    assert b.dtype == torch.float32 and b.device == lo.device
    torch.testing.assert_close(b.center, torch.tensor([[0.5, 2.0], [2.25, 0.0], [-0.5, 0.0]]))
    torch.testing.assert_close(b.width, hi - lo)
    torch.testing.assert_close(b.offset, (hi - lo) / 2)
    assert "batch_shape=(3,)" in repr(b) and "dim=2" in repr(b)


def test_broadcasting_corners():
    b = Box(torch.zeros(4, 1, 3), torch.ones(5, 3))
    assert b.shape == (4, 5, 3)
    assert b.lower.shape == b.upper.shape == (4, 5, 3)


def test_getitem_indexes_batch_dims_only():
    lo = torch.arange(24.0).reshape(2, 3, 4)
    b = Box(lo, lo + 1)
    assert b[0].shape == (3, 4)
    assert b[:, 1].shape == (2, 4)
    assert b[..., 2].shape == (2, 4)
    torch.testing.assert_close(b[1, 2].lower, lo[1, 2])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert b[mask].shape == (3, 4)
    torch.testing.assert_close(b[mask].upper, lo[mask] + 1)
    torch.testing.assert_close(b[torch.tensor([1, 0])].lower, lo[[1, 0]])
    with pytest.raises(IndexError, match="batch"):
        b[0, 0, 0]
    with pytest.raises(TypeError):
        len(b[0, 0])


def test_to_detach_expand_reshape():
    lo = torch.zeros(2, 3, requires_grad=True)
    b = Box(lo, lo + 1)
    b64 = b.to(torch.float64)
    assert b64.dtype == torch.float64 and b64.shape == (2, 3)
    assert not b.detach().lower.requires_grad
    assert b.expand(4, 2).shape == (4, 2, 3)
    assert b.reshape(2, 1).shape == (2, 1, 3)


@pytest.mark.parametrize("bad,match", [
    ((torch.zeros(2, dtype=torch.long), torch.ones(2)), "lower.*floating"),
    ((torch.zeros(2), [1.0, 1.0]), "upper must be a torch.Tensor"),
    ((torch.tensor(0.0), torch.tensor(1.0)), "lower.*at least one dim"),
    ((torch.zeros(2), torch.tensor([1.0, math.nan])), "upper contains NaN"),
    ((torch.zeros(2, 3), torch.ones(4, 3)), "broadcastable"),
    ((torch.zeros(2), torch.ones(2, dtype=torch.float64)), "same dtype"),
])
def test_bad_corners(bad, match):
    with pytest.raises(ValueError, match=match):
        Box(*bad)


def test_nan_check_follows_validation_flag_and_inf_is_allowed():
    with set_validation(False):
        Box(torch.tensor([math.nan]), torch.tensor([1.0]))
    b = Box(torch.tensor([-math.inf, 0.0]), torch.tensor([0.0, math.inf]))
    assert volume(b).item() == math.inf


def test_from_center_offset():
    c, o = torch.tensor([0.5, 1.0]), torch.tensor([0.25, 2.0])
    b = Box.from_center_offset(c, o)
    torch.testing.assert_close(b.lower, c - o)
    torch.testing.assert_close(b.upper, c + o)
    torch.testing.assert_close(b.center, c)
    torch.testing.assert_close(b.offset, o)
    with pytest.raises(ValueError, match="offset"):
        Box.from_center_offset(c, torch.tensor([math.nan, 1.0]))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=4, max_size=4))
def test_from_min_delta_nonempty(v):
    m, d = torch.tensor(v[:2], dtype=torch.float64), torch.tensor(v[2:], dtype=torch.float64)
    b = Box.from_min_delta(m, d)
    torch.testing.assert_close(b.lower, m)
    torch.testing.assert_close(b.upper, m + torch.nn.functional.softplus(d))
    assert bool((b.width >= 0).all())   # > 0 up to the rounding of m + softplus(d)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=4, max_size=4))
def test_from_sigmoid_inside_unit_cube(v):
    m, d = torch.tensor(v[:2], dtype=torch.float64), torch.tensor(v[2:], dtype=torch.float64)
    b = Box.from_sigmoid(m, d)
    assert bool((b.lower >= 0).all()) and bool((b.upper <= 1).all())
    assert bool((b.upper >= b.lower).all())
    torch.testing.assert_close(b.lower, torch.sigmoid(m))
    torch.testing.assert_close(b.width, torch.sigmoid(d) * (1 - torch.sigmoid(m)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=8, max_size=8))
def test_join_encloses_both_and_is_smallest(v):
    t = torch.tensor(v, dtype=torch.float64).reshape(4, 2)
    a = Box(torch.minimum(t[0], t[1]), torch.maximum(t[0], t[1]))
    b = Box(torch.minimum(t[2], t[3]), torch.maximum(t[2], t[3]))
    j = join(a, b)
    for box in (a, b):
        assert bool((j.lower <= box.lower).all()) and bool((j.upper >= box.upper).all())
    # every face of the join touches a or b
    assert bool(((j.lower == a.lower) | (j.lower == b.lower)).all())
    assert bool(((j.upper == a.upper) | (j.upper == b.upper)).all())
    assert volume(j).item() >= max(volume(a).item(), volume(b).item())


def test_join_broadcasts_and_validates():
    a = Box(torch.zeros(3, 2), torch.ones(3, 2))
    b = Box(torch.full((2,), -1.0), torch.full((2,), 0.5))
    assert join(a, b).shape == (3, 2)
    with pytest.raises(ValueError, match="dimension"):
        join(a, Box(torch.zeros(3), torch.ones(3)))


@pytest.mark.parametrize("module", ["box", "volumes", "intersections", "embedding", "losses"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    import perturb.boxes as pb
    mod = importlib.import_module(f"perturb.boxes.{module}")
    globs = {"torch": torch, **{k: getattr(pb, k) for k in pb.__all__}}
    result = doctest.testmod(mod, extraglobs=globs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
