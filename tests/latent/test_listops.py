"""ListOps data, gold parses, metrics and the latent-graph model (perturb.latent.listops).

Oracles: a stack evaluator/parser over the token strings written here independently of the
recursive generator (values with statistics.median_low for MED, heads from bracket matching);
the arborescence solvers on the unpadded graphs (padding invariance); batched = looped; hand
counts for precision/recall.
"""
from __future__ import annotations

import statistics

import pytest
import torch

import perturb
from perturb.latent.listops import (
    LISTOPS_VOCAB,
    LatentListOpsModel,
    arc_precision_recall,
    gold_arborescence,
    make_listops,
)
from perturb.structured import Arborescences, arborescence_marginals, max_arborescence


@pytest.fixture(autouse=True)
def _one_thread(torch_threads):
    """Tiny models: intra-op threads only add synchronisation (60× slower on a loaded box)."""
    torch_threads(1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _stack_parse(words: list[str]) -> tuple[int, list[int], int, list[int]]:
    """Value, heads, depth and argument counts of a token string, by a bracket stack."""
    frames: list[tuple[str, int, list[int]]] = []      # (op, position, argument values)
    heads, depth, counts, value = [], 0, [], None
    for pos, w in enumerate(words):
        heads.append(frames[-1][1] if frames else -1)
        if w.startswith("["):
            frames.append((w[1:], pos, []))
            depth = max(depth, len(frames))
        elif w == "]":
            op, _, args = frames.pop()
            counts.append(len(args))
            v = {"MIN": min, "MAX": max, "MED": statistics.median_low,
                 "SM": lambda a: sum(a) % 10}[op](args)
            if frames:
                frames[-1][2].append(v)
            else:
                value = v
        else:
            frames[-1][2].append(int(w))
    assert not frames
    return value, heads, depth, counts


def test_values_and_heads_match_a_stack_parser():
    b = make_listops(400, max_depth=3, max_args=4, max_length=25, generator=_gen(0))
    for k in range(len(b.values)):
        L = int(b.lengths[k])
        words = [LISTOPS_VOCAB[t] for t in b.tokens[k, :L]]
        value, heads, depth, counts = _stack_parse(words)
        assert value == int(b.values[k])
        assert heads == b.heads[k, :L].tolist()
        assert 1 <= depth <= 3 and L <= 25
        assert all(2 <= c <= 4 for c in counts)
        assert words[0].startswith("[")
        assert (b.tokens[k, L:] == 15).all() and (b.heads[k, L:] == -1).all()


def test_the_data_covers_every_operator_and_value():
    b = make_listops(2000, generator=_gen(1))
    assert set(torch.bincount(b.values, minlength=10).nonzero().flatten().tolist()) == set(
        range(10))
    assert set(b.tokens.flatten().tolist()) == set(range(16))
    # the bounds bind: the longest expression reaches the length limit, some reach depth 3
    assert int(b.lengths.max()) == 25
    assert any(_stack_parse([LISTOPS_VOCAB[t] for t in b.tokens[k, :int(b.lengths[k])]])[2] == 3
               for k in range(50))


def test_operators_on_hand_examples():
    # [MED 7 1 4 2 ] -> sorted 1 2 4 7, lower median 2; [SM 9 8 ] -> 7; [MIN 3 [MAX 5 6 ] ] -> 3
    for words, value in (("[MED 7 1 4 2 ]", 2), ("[SM 9 8 ]", 7), ("[MIN 3 [MAX 5 6 ] ]", 3)):
        assert _stack_parse(words.split())[0] == value
    from perturb.latent.listops import _apply
    assert _apply(12, [7, 1, 4, 2]) == 2 and _apply(13, [9, 8]) == 7
    assert _apply(10, [3, 6]) == 3 and _apply(11, [5, 6]) == 6
    assert _apply(12, [5, 1, 9]) == 5


def test_same_generator_same_data_and_depth_one():
    a = make_listops(50, generator=_gen(3))
    b = make_listops(50, generator=_gen(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    flat = make_listops(100, max_depth=1, max_args=2, generator=_gen(4))
    assert (flat.lengths == 4).all()                    # [OP d d ]


def test_gold_arborescence_is_an_arborescence_of_every_expression():
    b = make_listops(60, generator=_gen(5))
    T = gold_arborescence(b.heads, torch.float64)
    assert torch.equal(T.sum((-1, -2)), (b.lengths - 1).to(torch.float64))
    for k in range(60):
        L = int(b.lengths[k])
        assert bool(Arborescences(0).check(T[k, :L, :L]))
        assert T[k, L:].sum() == 0 and T[k, :, L:].sum() == 0


def test_edge_precision_recall_counts_by_hand():
    gold = torch.zeros(1, 4, 4)
    gold[0, 0, 1] = gold[0, 0, 2] = 1                  # length 3: arcs 0→1, 0→2
    pred = torch.zeros(1, 4, 4)
    pred[0, 0, 1] = pred[0, 1, 2] = pred[0, 2, 1] = 1   # one hit, two misses
    pred[0, 0, 3] = pred[0, 3, 3] = 1                   # padding / loop: ignored
    p, r = arc_precision_recall(pred, gold, torch.tensor([3]))
    assert p == pytest.approx(1 / 3) and r == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="pred and gold"):
        arc_precision_recall(pred, gold[0], torch.tensor([3]))


def _batch(n=6, seed=6):
    return make_listops(n, max_length=16, generator=_gen(seed))


def test_arc_scores_mask_padding_loops_and_the_root():
    torch.manual_seed(0)
    model = LatentListOpsModel("arborescence", dim=8)
    b = _batch()
    s = model.arc_scores(b.tokens, b.lengths)
    n = b.tokens.shape[1]
    for k in range(len(b.values)):
        L = int(b.lengths[k])
        block = s[k, :L, :L]
        off = ~torch.eye(L, dtype=torch.bool)
        off[:, 0] = False
        assert torch.isfinite(block[off]).all() and (block[~off] == -torch.inf).all()
        assert (s[k, 0, L:] == 0).all() and (s[k, 1:, L:] == -torch.inf).all()
        assert (s[k, L:, :] == -torch.inf).all() or L == n


def test_heads_precede_forbids_backward_arcs_and_keeps_the_gold_parse_feasible():
    torch.manual_seed(0)
    model = LatentListOpsModel("arborescence", dim=8, heads_precede=True)
    b = _batch()
    s = model.arc_scores(b.tokens, b.lengths)
    lower = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    assert (s[:, lower] == -torch.inf).all()
    gold = gold_arborescence(b.heads).bool()
    assert torch.isfinite(s[gold]).all()                # every gold arc i → j has i < j
    mode = model.mode_graph(b.tokens, b.lengths)
    assert (mode[:, lower] == 0).all() and torch.equal(mode.sum((-1, -2)), (b.lengths - 1).float())


def test_padding_does_not_change_the_marginals_or_the_mode():
    torch.manual_seed(1)
    b = _batch(5, seed=7)
    for graph in ("arborescence", "independent"):
        model = LatentListOpsModel(graph, dim=8).double()
        with torch.no_grad():
            s = model.arc_scores(b.tokens, b.lengths)
        mode = model.mode_graph(b.tokens, b.lengths)
        if graph == "arborescence":
            mu = arborescence_marginals(s, root=0)
        for k in range(5):
            L = int(b.lengths[k])
            tok, lens = b.tokens[k:k + 1, :L], b.lengths[k:k + 1]
            alone = model.mode_graph(tok, lens)[0]
            assert torch.equal(mode[k, :L, :L], alone)
            assert mode[k, L:].sum() == 0 and mode[k, :, L:].sum() == 0
            if graph == "arborescence":
                assert bool(Arborescences(0).check(alone))
                assert torch.equal(alone, max_arborescence(s[k, :L, :L]))
                mu_alone = arborescence_marginals(s[k, :L, :L], root=0)
                torch.testing.assert_close(mu[k, :L, :L], mu_alone)
                torch.testing.assert_close(mu[k, 0, L:], torch.ones(s.shape[-1] - L,
                                                                    dtype=mu.dtype))
            else:
                assert torch.equal(alone, (s[k, :L, :L] > 0).double())


@pytest.mark.parametrize("hard", [False, True])
def test_latent_arborescence_is_a_point_of_the_marginal_polytope(hard):
    torch.manual_seed(2)
    model = LatentListOpsModel("arborescence", dim=8, tau=0.5, hard=hard).double()
    b = _batch()
    X = model.latent_graph(b.tokens, b.lengths, generator=_gen(0))
    real = torch.arange(X.shape[-1]) < b.lengths.unsqueeze(-1)
    col = X.sum(-2)                                     # each real non-root token: one head
    torch.testing.assert_close(col[:, 1:][real[:, 1:]], torch.ones(int(real[:, 1:].sum()),
                                                                   dtype=X.dtype))
    assert (col[:, 0] == 0).all() and (col[~real] == 0).all() and (X >= 0).all()
    if hard:
        for k in range(len(b.values)):
            L = int(b.lengths[k])
            assert bool(Arborescences(0).check(X[k, :L, :L].detach()))


@pytest.mark.parametrize("noise", [perturb.Normal(), perturb.NegativeExponential()], ids=repr)
def test_the_arborescence_takes_any_noise(noise):
    """The seed's noise families: the relaxation is relax(s, Arborescences(0), noise, tau) with
    the model's noise, and so the sample differs from the Gumbel one for one generator."""
    torch.manual_seed(2)
    model = LatentListOpsModel("arborescence", dim=8, tau=0.5, noise=noise).double()
    b = _batch()
    X = model.latent_graph(b.tokens, b.lengths, generator=_gen(0))
    s = model.arc_scores(b.tokens, b.lengths)
    real = torch.arange(X.shape[-1]) < b.lengths.unsqueeze(-1)
    want = perturb.relax(s, Arborescences(0), noise, tau=0.5, generator=_gen(0))
    mask = real.unsqueeze(-1) & real.unsqueeze(-2)
    torch.testing.assert_close(X[mask], want[mask])
    model.noise = perturb.Gumbel()
    assert not torch.allclose(model.latent_graph(b.tokens, b.lengths, generator=_gen(0)), X)
    with pytest.raises(ValueError, match="noise"):
        LatentListOpsModel("arborescence", dim=8, noise="gumbel")


def test_independent_graph_is_a_binary_concrete_sample():
    torch.manual_seed(3)
    model = LatentListOpsModel("independent", dim=8, tau=0.7).double()
    b = _batch()
    X = model.latent_graph(b.tokens, b.lengths, generator=_gen(4))
    s = model.arc_scores(b.tokens, b.lengths)
    eps = perturb.Logistic().sample(s.shape, generator=_gen(4), dtype=s.dtype)
    ok = torch.isfinite(s) & (torch.arange(s.shape[-1]) < b.lengths[:, None, None])
    torch.testing.assert_close(X, torch.where(ok, torch.sigmoid((s + eps) / 0.7),
                                              torch.zeros_like(s)))


@pytest.mark.parametrize("graph", ["arborescence", "independent"])
def test_the_value_loss_reaches_the_arc_scorer(graph):
    torch.manual_seed(4)
    model = LatentListOpsModel(graph, dim=8)
    b = _batch()
    logits, X = model(b.tokens, b.lengths, generator=_gen(1))
    assert logits.shape == (6, 10) and X.shape == (6, *b.tokens.shape[1:2] * 2)
    torch.nn.functional.cross_entropy(logits, b.values).backward()
    for p in (*model.head_mlp.parameters(), *model.encoder.parameters()):
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_gnn_messages_flow_from_dependents_to_heads():
    """On the gold graph, changing a leaf changes the root's logits only with enough rounds."""
    torch.manual_seed(5)
    toks = torch.tensor([[13, 10, 11, 3, 4, 14, 5, 14, 2, 14]])   # [SM [MIN [MAX 3 4 ] 5 ] 2 ]
    value, heads, depth, _ = _stack_parse([LISTOPS_VOCAB[t] for t in toks[0]])
    heads = torch.tensor([heads])
    lens = torch.tensor([10])
    deep = toks.clone()
    deep[0, 3] = 9                                      # the leaf at depth 3
    for rounds, moves in ((2, False), (3, True)):
        model = LatentListOpsModel("gold", dim=8, n_rounds=rounds).eval()
        a = model(toks, lens, heads)[0]
        c = model(deep, lens, heads)[0]
        assert (not torch.equal(a, c)) == moves


def test_gold_graph_model_learns_a_small_set():
    torch.manual_seed(6)
    b = make_listops(32, max_depth=1, max_args=3, generator=_gen(8))
    model = LatentListOpsModel("gold", dim=16, n_rounds=1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(80):
        loss = torch.nn.functional.cross_entropy(model(b.tokens, b.lengths, b.heads)[0],
                                                 b.values)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    acc = (model(b.tokens, b.lengths, b.heads)[0].argmax(-1) == b.values).float().mean()
    assert acc > 0.9


def test_bad_arguments():
    with pytest.raises(ValueError, match="graph"):
        LatentListOpsModel("spanning")
    with pytest.raises(ValueError, match="dim"):
        LatentListOpsModel(dim=7)
    with pytest.raises(ValueError, match="tau"):
        LatentListOpsModel(tau=0.0)
    with pytest.raises(ValueError, match="gold heads"):
        LatentListOpsModel("gold")(*_batch()[:2])
    with pytest.raises(ValueError, match="leaf_prob"):
        make_listops(3, leaf_prob=1.5)
    with pytest.raises(ValueError, match="heads"):
        gold_arborescence(torch.tensor([[-1, 5]]))
