"""perturb/structured/trees/_graph_input.py: the input handling shared by every tree function."""
import math

import pytest
import torch

from perturb.structured.trees._graph_input import _detached, _prepare, _reachable


def test_complete_graph_fast_case_is_a_broadcast_pattern():
    w = torch.randn(3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    s, valid, nodes, root = _prepare(w, 0.5, None, None, 2, False)
    assert nodes is None and root == 2
    torch.testing.assert_close(s, w / 0.5)
    assert valid.shape == w.shape and valid.stride(0) == 0          # one pattern, broadcast
    assert not valid[0].diagonal().any() and not valid[0, :, 2].any()
    assert int(valid[0].sum()) == 5 * 4 - 4
    s, valid, _, root = _prepare(w, 1.0, None, None, None, True)   # undirected: root 0, sym
    assert root == 0
    torch.testing.assert_close(s, 0.5 * (w + w.mT))


def test_masks_lengths_and_connectivity():
    w = torch.zeros(2, 4, 4, dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    s, valid, nodes, _ = _prepare(w, 1.0, None, lengths, 0, False)
    assert nodes.tolist() == [[True] * 4, [True, True, True, False]]
    assert not valid[1, :, 3].any() and not valid[1, 3, :].any()  # padding has no edges
    # a -inf score forbids the edge; masked entries are zero-filled before dividing by τ
    w2 = w[0].clone()
    w2[0, 1] = -math.inf
    s, valid, _, _ = _prepare(w2, 0.1, None, None, 0, False)
    assert not bool(valid[0, 1]) and float(s[0, 1]) == 0.0
    # node 3 reachable only through a forbidden edge: refused, naming it
    cut = torch.full((4, 4), -math.inf, dtype=torch.float64)
    cut[0, 1] = cut[1, 2] = 0.0
    with pytest.raises(ValueError, match="node 3"):
        _prepare(cut, 1.0, None, None, 0, False)
    reach = _reachable(~torch.isinf(cut) & ~torch.eye(4, dtype=torch.bool), 0)
    assert reach.tolist() == [True, True, True, False]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="w must be a torch.Tensor"):
        _detached([[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="root"):
        _prepare(torch.zeros(3, 3), 1.0, None, None, 3, False)
    with pytest.raises(ValueError, match="tau"):
        _prepare(torch.zeros(3, 3), 0.0, None, None, 0, False)
