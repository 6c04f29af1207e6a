"""Tests of perturb/_validation.py: the two-tier argument checks."""
import math

import pytest
import torch

from perturb._validation import (
    check_choice,
    check_dim,
    check_int,
    check_positive,
    check_scores,
    set_validation,
    validation_enabled,
)


@pytest.mark.parametrize("tau", [0.0, -1.0, math.inf, math.nan, "1", None, True])
def test_check_positive_rejects(tau):
    with pytest.raises(ValueError, match="tau"):
        check_positive(tau, "tau")


def test_check_positive_tensor():
    check_positive(torch.tensor([0.5, 2.0]), "tau")
    with pytest.raises(ValueError, match="tau"):
        check_positive(torch.tensor([0.5, 0.0]), "tau")


def test_check_scores_messages():
    with pytest.raises(ValueError, match="floating dtype"):
        check_scores(torch.arange(3), "w")
    with pytest.raises(ValueError, match="at least 2 dims"):
        check_scores(torch.zeros(3), "w", min_ndim=2)
    with pytest.raises(ValueError, match="square"):
        check_scores(torch.zeros(2, 3), "w", min_ndim=2, square=True)
    with pytest.raises(ValueError, match="NaN"):
        check_scores(torch.tensor([0.0, math.nan]), "w")
    with pytest.raises(ValueError, match="infinite"):
        check_scores(torch.tensor([0.0, -math.inf]), "w")
    check_scores(torch.tensor([0.0, -math.inf]), "w", allow_neg_inf=True)
    with pytest.raises(ValueError, match="infinite"):
        check_scores(torch.tensor([0.0, math.inf]), "w", allow_neg_inf=True)
    with pytest.raises(ValueError, match="torch.Tensor"):
        check_scores([1.0, 2.0], "w")


def test_switching_validation_off_skips_value_checks_only():
    assert validation_enabled()
    with set_validation(False):
        assert not validation_enabled()
        check_scores(torch.tensor([math.nan]), "w")  # value check skipped
        with pytest.raises(ValueError):  # structural check still runs
            check_scores(torch.arange(3), "w")
    assert validation_enabled()


def test_check_dim_and_choice_and_int():
    x = torch.zeros(2, 3)
    assert check_dim(x, -1) == 1
    with pytest.raises(ValueError, match="out of range"):
        check_dim(x, 2)
    with pytest.raises(ValueError, match="accepted values: 'a', 'b'"):
        check_choice("c", ("a", "b"), "mode")
    assert check_int(3, "k", low=1, high=3) == 3
    for bad in (0, 4, 2.5, True):
        with pytest.raises(ValueError, match="k"):
            check_int(bad, "k", low=1, high=3)


def test_scale_by_tau_per_problem_and_shape_errors():
    from perturb._validation import scale_by_tau

    w = torch.ones(3, 4, 5)
    assert scale_by_tau(w, 1, 2) is w
    out = scale_by_tau(w, torch.tensor([1.0, 2.0, 4.0]), 2)
    assert torch.equal(out[:, 0, 0], torch.tensor([1.0, 0.5, 0.25]))
    assert torch.equal(scale_by_tau(w, torch.tensor(2.0), 2), w / 2)
    with pytest.raises(ValueError, match="must broadcast against the batch shape"):
        scale_by_tau(torch.ones(5), torch.ones(5), 1)  # would broadcast into (5, 5)
    with pytest.raises(ValueError, match="tau of shape"):
        scale_by_tau(w, torch.ones(4), 2)


def test_relaxed_topk_rejects_tau_shaped_like_the_event():
    from perturb.structured import relaxed_topk

    with pytest.raises(ValueError, match="tau of shape"):
        relaxed_topk(torch.randn(5), 2, tau=torch.full((5,), 0.5))
