"""Tests for perturb.boxes.noise_records: the one record format of box noises."""
from __future__ import annotations

import json

import pytest

from perturb.boxes.hierarchy import HierarchyConfig
from perturb.boxes.noise_records import check_recordable, noise_from_record, noise_record
from perturb.noise import Discrete, Gumbel, Logistic, NegativeExponential, Normal, Uniform


class _MyNormal(Normal):
    """A user's noise: the expected volumes can use it, a record cannot name it."""


@pytest.mark.parametrize("noise", [Gumbel(0.01), Normal(0.3), Logistic(2.0), Uniform(-0.2, 0.1),
                                   NegativeExponential(0.2), None], ids=repr)
def test_round_trip_through_json(noise):
    record = json.loads(json.dumps(noise_record(noise)))
    assert noise_from_record(record) == noise
    assert noise_from_record(noise) == noise          # a noise passes through, checked


@pytest.mark.parametrize("bad, match", [
    ({"family": "Cauchy", "scale": 1.0}, "noise must be"), ({"scale": 1.0}, "noise must be"),
    (0.1, "noise must be"), (Normal, r"pass noise=Normal\(\)"),
    (Discrete([0.0, 1.0], [0.5, 0.5]), "lacks continuous"), (_MyNormal(0.1), "cannot record it"),
])
def test_bad_records_and_noises(bad, match):
    with pytest.raises(ValueError, match=match):
        noise_from_record(bad)


def test_every_user_of_the_records_refuses_what_they_cannot_save():
    """BoxEmbedding and HierarchyConfig (whose checkpoints hold the record) refuse alike."""
    from perturb.boxes import BoxEmbedding
    with pytest.raises(ValueError, match="cannot record it"):
        check_recordable(_MyNormal(0.1))
    with pytest.raises(ValueError, match="cannot record it"):
        BoxEmbedding(3, 2, noise=_MyNormal(0.1))
    with pytest.raises(ValueError, match="cannot record it"):
        HierarchyConfig(noise=_MyNormal(0.1))
