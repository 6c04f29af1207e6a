"""Tests of perturb/boxes/hierarchy/rng.py: generator= / seed= resolution and spawning."""
import pytest
import torch

from perturb.boxes.hierarchy.rng import resolve_generator, spawn_generator


def test_a_given_generator_is_returned_itself():
    g = torch.Generator().manual_seed(5)
    assert resolve_generator(g) is g


def test_a_seed_gives_the_same_stream_as_manual_seed():
    a = torch.rand(4, generator=resolve_generator(seed=7))
    b = torch.rand(4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_no_seed_gives_fresh_streams():
    a = torch.rand(8, generator=resolve_generator())
    b = torch.rand(8, generator=resolve_generator())
    assert not torch.equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    (dict(generator=torch.Generator(), seed=1), "either generator or seed"),
    (dict(seed=1.5), "seed must be an int"),
    (dict(seed=True), "seed must be an int"),
    (dict(generator=3), "generator must be a torch.Generator"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        resolve_generator(**kwargs)


def test_spawned_generator_is_fixed_by_the_parent_and_advances_it():
    p1, p2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    c1, c2 = spawn_generator(p1), spawn_generator(p2)
    assert c1.device.type == "cpu"
    assert torch.equal(torch.rand(3, generator=c1), torch.rand(3, generator=c2))
    # the parent moved on: a second child differs from the first
    c3 = spawn_generator(p1)
    assert not torch.equal(torch.rand(3, generator=c3),
                           torch.rand(3, generator=spawn_generator(
                               torch.Generator().manual_seed(0))))
