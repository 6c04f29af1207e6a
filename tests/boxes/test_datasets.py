"""Tests for perturb.boxes.datasets: WordNet parser (on a hand-written fixture in the real
wndb(5WN) format, and on the installed database when present), closures, synthetic DAGs."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import networkx as nx
import pytest
import torch

from perturb.boxes.datasets import (
    balanced_tree,
    check_hierarchy,
    random_dag,
    random_tree,
    read_wordnet_index,
    read_wordnet_nouns,
    split_hierarchy,
    sub_hierarchy,
    transitive_closure,
    transitive_reduction,
    wordnet_dir,
    wordnet_noun_hierarchy,
)

# ----------------------------------------------------------------------------- fixture files

# (key, lex_filenum, lemmas, pointers [(symbol, target key or raw offset, pos, src/tgt)], gloss)
_SYNSETS = [
    ("entity", 3, ["entity"], [("~", "animal", "n"), ("~", "pet", "n")],
     "that which is perceived"),
    ("animal", 5, ["animal", "animate_being", "beast"],
     [("@", "entity", "n"), ("~", "mammal", "n"), ("~", "bird", "n"),
      ("+", "00692347", "v")], "a living organism"),
    ("pet", 3, ["pet"], [("@", "entity", "n"), ("~", "dog", "n")], "a domesticated animal"),
    ("mammal", 5, ["mammal", "mammalian"], [("@", "animal", "n"), ("~", "dog", "n"),
                                           ("~", "cat", "n")], "warm-blooded vertebrate"),
    ("bird", 5, ["bird"], [("@", "animal", "n")], "warm-blooded egg-laying vertebrate"),
    ("dog", 5, ["dog", "domestic_dog", "Canis_familiaris"],
     [("@", "mammal", "n"), ("@", "pet", "n"), ("~i", "lassie", "n")], "a member of the genus Canis"),
    ("cat", 5, ["cat", "true_cat"], [("@", "mammal", "n")], "feline mammal"),
    ("lassie", 18, ["Lassie"], [("@i", "dog", "n")], "a fictional collie"),
    ("frump", 18, ["frump", "dog"], [("@", "entity", "n")], "a dull unattractive woman"),
]
# index.noun senses: 'dog' has two senses, the animal first
_INDEX = {"animal": ["animal"], "animate_being": ["animal"], "beast": ["animal"],
          "bird": ["bird"], "canis_familiaris": ["dog"], "cat": ["cat"], "dog": ["dog", "frump"],
          "domestic_dog": ["dog"], "entity": ["entity"], "frump": ["frump"],
          "lassie": ["lassie"], "mammal": ["mammal"], "mammalian": ["mammal"], "pet": ["pet"],
          "true_cat": ["cat"]}
_HEADER = ["  1 This software and database is being provided to you, the LICENSEE, by  ",
           "  2 Princeton University under the following license.  "]


def _line(rec, offsets) -> str:
    key, lex, lemmas, ptrs, gloss = rec
    words = " ".join(f"{w} 0" for w in lemmas)
    p = " ".join(f"{sym} {offsets[t] if t in offsets else t} {pos} 0000" for sym, t, pos in ptrs)
    return (f"{offsets[key]} {lex:02d} n {len(lemmas):02x} {words} {len(ptrs):03d} {p} "
            f"| {gloss}  \n")


def write_wordnet_fixture(directory: Path) -> dict[str, int]:
    """Write data.noun and index.noun in the real format (offsets = byte positions)."""
    placeholder = {rec[0]: "00000000" for rec in _SYNSETS}
    pos = sum(len(h) + 1 for h in _HEADER)
    offsets = {}
    for rec in _SYNSETS:                      # line lengths do not depend on 8-digit offsets
        offsets[rec[0]] = pos
        pos += len(_line(rec, placeholder).encode())
    off8 = {k: f"{v:08d}" for k, v in offsets.items()}
    text = "".join(h + "\n" for h in _HEADER) + "".join(_line(r, off8) for r in _SYNSETS)
    (directory / "data.noun").write_text(text, encoding="utf-8")
    lines = [f"{lemma} n {len(keys)} 1 @ {len(keys)} 0 " + " ".join(off8[k] for k in keys) + "  "
             for lemma, keys in sorted(_INDEX.items())]
    (directory / "index.noun").write_text("".join(h + "\n" for h in _HEADER)
                                          + "\n".join(lines) + "\n", encoding="utf-8")
    return offsets


@pytest.fixture
def wn_dir(tmp_path: Path) -> Path:
    write_wordnet_fixture(tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------- parser

def test_parse_fixture_synsets(wn_dir):
    offsets = write_wordnet_fixture(wn_dir)
    syn = read_wordnet_nouns(wn_dir / "data.noun")
    assert list(syn) == [offsets[r[0]] for r in _SYNSETS]
    dog = syn[offsets["dog"]]
    assert dog.lemmas == ("dog", "domestic_dog", "Canis_familiaris")
    assert dog.hypernyms == (offsets["mammal"], offsets["pet"])
    assert dog.instance_hypernyms == ()
    assert dog.gloss == "a member of the genus Canis"
    assert syn[offsets["lassie"]].instance_hypernyms == (offsets["dog"],)
    assert syn[offsets["animal"]].hypernyms == (offsets["entity"],)   # the verb pointer ignored
    assert syn[offsets["lassie"]].lexname_id == 18


def test_index_sense_order(wn_dir):
    offsets = write_wordnet_fixture(wn_dir)
    idx = read_wordnet_index(wn_dir)
    assert idx["dog"] == (offsets["dog"], offsets["frump"])


def test_hierarchy_from_fixture(wn_dir):
    g = wordnet_noun_hierarchy(wn_dir)
    expected = {("animal.n.01", "entity.n.01"), ("pet.n.01", "entity.n.01"),
                ("mammal.n.01", "animal.n.01"), ("bird.n.01", "animal.n.01"),
                ("dog.n.01", "mammal.n.01"), ("dog.n.01", "pet.n.01"),
                ("cat.n.01", "mammal.n.01"), ("lassie.n.01", "dog.n.01"),
                ("frump.n.01", "entity.n.01")}
    assert set(g.edges) == expected
    assert g.edges["lassie.n.01", "dog.n.01"]["kind"] == "instance_hypernym"
    assert g.edges["dog.n.01", "pet.n.01"]["kind"] == "hypernym"
    assert g.nodes["dog.n.01"]["lemmas"][2] == "Canis_familiaris"
    # 'frump' is the second sense of 'dog' but its first lemma is 'frump'
    assert "frump.n.01" in g and "dog.n.02" not in g
    check_hierarchy(g)


def test_hierarchy_options_on_fixture(wn_dir):
    no_inst = wordnet_noun_hierarchy(wn_dir, instance_hypernyms=False)
    assert "lassie.n.01" not in no_inst and no_inst.number_of_nodes() == 8
    sub = wordnet_noun_hierarchy(wn_dir, root="mammal.n.01")
    assert set(sub.nodes) == {"mammal.n.01", "dog.n.01", "cat.n.01", "lassie.n.01"}
    clo = wordnet_noun_hierarchy(wn_dir, root="mammal.n.01", closure=True)
    assert set(clo.edges) == {("dog.n.01", "mammal.n.01"), ("cat.n.01", "mammal.n.01"),
                              ("lassie.n.01", "dog.n.01"), ("lassie.n.01", "mammal.n.01")}


def test_missing_index_falls_back_to_offsets(wn_dir):
    offsets = write_wordnet_fixture(wn_dir)
    (wn_dir / "index.noun").unlink()
    with pytest.warns(UserWarning, match="index.noun"):
        g = wordnet_noun_hierarchy(wn_dir)
    assert f"dog.n.{offsets['dog']:08d}" in g
    assert f"dog.n.{offsets['frump']:08d}" not in g and f"frump.n.{offsets['frump']:08d}" in g


def test_parser_rejects_bad_files(wn_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        read_wordnet_nouns(tmp_path / "nope" / "data.noun")
    text = (wn_dir / "data.noun").read_text()
    (wn_dir / "data.noun").write_text(" " + text)     # every offset is now off by one byte
    with pytest.raises(ValueError, match="byte position"):
        read_wordnet_nouns(wn_dir)
    assert len(read_wordnet_nouns(wn_dir, check_offsets=False)) == len(_SYNSETS)
    (wn_dir / "data.noun").write_text(text + "00099999 05 n zz dog 0 000 | broken\n")
    with pytest.raises(ValueError, match="data.noun synset line"):
        read_wordnet_nouns(wn_dir, check_offsets=False)


# ----------------------------------------------------------------------------- graph tools

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closure_matches_networkx(seed):
    g = random_dag(40, 0.1, seed=seed)
    ours = transitive_closure(g)
    ref = nx.transitive_closure_dag(g)
    assert set(ours.edges) == set(ref.edges)
    assert set(transitive_closure(g, reflexive=True).edges) == set(ref.edges) | {
        (u, u) for u in g}
    red = transitive_reduction(g)
    assert set(transitive_closure(red).edges) == set(ref.edges)
    assert red.number_of_edges() <= g.number_of_edges()


def test_sub_hierarchy_commutes_with_closure():
    g = random_dag(60, 0.08, seed=3)
    root = 5
    sub = sub_hierarchy(g, root)
    full = transitive_closure(g)
    restricted = {(u, v) for u, v in full.edges if u in sub and v in sub}
    assert set(transitive_closure(sub).edges) == restricted
    assert all(nx.has_path(g, u, root) for u in sub)
    with pytest.raises(ValueError, match="root"):
        sub_hierarchy(g, "missing")


def test_check_hierarchy_errors():
    with pytest.raises(ValueError, match="acyclic"):
        check_hierarchy(nx.DiGraph([(0, 1), (1, 2), (2, 0)]))
    with pytest.raises(ValueError, match="self-loop"):
        check_hierarchy(nx.DiGraph([(0, 0)]))
    with pytest.raises(ValueError, match="DiGraph"):
        check_hierarchy(nx.Graph([(0, 1)]))


def test_balanced_tree():
    g = balanced_tree(2, 9)
    assert g.number_of_nodes() == 1023 and g.number_of_edges() == 1022
    ref = nx.balanced_tree(2, 9)          # same breadth-first labels, undirected
    assert {frozenset(e) for e in g.edges} == {frozenset(e) for e in ref.edges}
    assert all(g.out_degree(u) == (0 if u == 0 else 1) for u in g)
    # closure of a complete binary tree: sum of depths = sum_k k 2^k = (h-1) 2^(h+1) + 2
    assert transitive_closure(g).number_of_edges() == 8 * 2 ** 10 + 2
    assert balanced_tree(3, 2).number_of_nodes() == 13 and balanced_tree(1, 4).number_of_nodes() == 5
    with pytest.raises(ValueError, match="branching"):
        balanced_tree(0, 3)


def test_random_tree_and_dag_reproducible():
    t1, t2 = random_tree(50, seed=7), random_tree(50, seed=7)
    assert set(t1.edges) == set(t2.edges) and set(t1.edges) != set(random_tree(50, seed=8).edges)
    assert nx.is_tree(t1.to_undirected()) and all(v < u for u, v in t1.edges)
    d1 = random_dag(50, 0.2, generator=torch.Generator().manual_seed(1))
    d2 = random_dag(50, 0.2, generator=torch.Generator().manual_seed(1))
    assert set(d1.edges) == set(d2.edges)
    check_hierarchy(d1)
    assert [u for u in d1 if d1.out_degree(u) == 0] == [0]
    with pytest.raises(ValueError, match="either generator or seed"):
        random_tree(5, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="extra_edge_prob"):
        random_dag(5, 1.5)


def test_random_dag_edge_count_matches_expectation():
    # extra edges: each pair j < i, besides the tree edge, independently with prob p
    n, p, reps = 40, 0.1, 20
    counts = torch.tensor([random_dag(n, p, seed=s).number_of_edges() - (n - 1)
                           for s in range(reps)], dtype=torch.float64)
    m = (n - 1) * (n - 2) / 2                  # pairs that are not the tree edge
    mean, sd = m * p, math.sqrt(m * p * (1 - p))
    assert abs(counts.mean().item() - mean) < 4 * sd / math.sqrt(reps)


def test_random_tree_parent_distribution():
    # the parent of node 3 is uniform on {0, 1, 2}: chi-square-free check with 5 sigma bounds
    reps = 600
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([next(random_tree(4, generator=gen).successors(3)) for _ in range(reps)])
    freq = torch.bincount(parents, minlength=3).double() / reps
    sd = math.sqrt((1 / 3) * (2 / 3) / reps)
    assert torch.all((freq - 1 / 3).abs() < 5 * sd)


def test_split_hierarchy():
    g = random_dag(30, 0.1, seed=0)
    split = split_hierarchy(g, train_fraction=0.3, val_fraction=0.5, seed=0)
    index = {u: i for i, u in enumerate(split.nodes)}
    red = {(index[u], index[v]) for u, v in transitive_reduction(g).edges}
    clo = {(index[u], index[v]) for u, v in transitive_closure(g).edges}
    as_set = lambda t: {tuple(r) for r in t.tolist()}     # noqa: E731
    train, val, test = as_set(split.train), as_set(split.val), as_set(split.test)
    assert red <= train
    assert train | val | test == clo == as_set(split.closure)
    assert len(train) + len(val) + len(test) == len(clo)
    rest = len(clo) - len(red)
    assert len(train) - len(red) == round(0.3 * rest)
    assert len(val) == round(0.5 * (rest - round(0.3 * rest)))
    again = split_hierarchy(g, train_fraction=0.3, val_fraction=0.5, seed=0)
    assert torch.equal(again.val, split.val)



_SPLIT_DIGEST = """
import hashlib, sys
import networkx as nx
from perturb.boxes.datasets import (random_dag, split_hierarchy, sub_hierarchy,
                                    transitive_closure)
g = random_dag(60, 0.08, seed=1)
g = nx.relabel_nodes(g, {u: f"node{u}" for u in g.nodes})     # str labels: hash-seeded sets
sp = split_hierarchy(g, 0.25, 0.5, seed=3)
parts = [t.numpy().tobytes() for t in (sp.train, sp.val, sp.test)]
parts.append(repr(list(transitive_closure(g).edges)).encode())
sub = sub_hierarchy(g, "node0")                                  # node order: graph order
parts.append(repr((list(sub.nodes), list(sub.edges))).encode())
print(hashlib.md5(b"".join(parts)).hexdigest())
"""


def test_split_and_closure_reproduce_across_hash_seeds():
    """Seeded splits and sub-hierarchies of string-labelled graphs are the same in every
    process (node and edge order must not follow set iteration order, which depends on
    PYTHONHASHSEED)."""
    import os
    import subprocess
    import sys
    root = str(Path(__file__).resolve().parents[2])
    digests = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", _SPLIT_DIGEST], env=env, check=True,
                             capture_output=True, text=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


# ----------------------------------------------------------------------------- real WordNet

_HAVE_WN = (wordnet_dir() / "data.noun").is_file() and (wordnet_dir() / "index.noun").is_file()
needs_wordnet = pytest.mark.skipif(
    not _HAVE_WN, reason=f"WordNet 3.0 database not found in {wordnet_dir()} "
                         f"(apt-get install wordnet-base, or set $WORDNET_DIR)")


@pytest.fixture(scope="module")
def wordnet_graph():
    return wordnet_noun_hierarchy()


@needs_wordnet
def test_wordnet_counts(wordnet_graph):
    g = wordnet_graph
    assert g.number_of_nodes() == 82115 and g.number_of_edges() == 84427
    assert [u for u in g if g.out_degree(u) == 0] == ["entity.n.01"]
    assert set(g.successors("dog.n.01")) == {"canine.n.02", "domestic_animal.n.01"}
    assert set(g.successors("einstein.n.01")) == {"physicist.n.01"}
    mammal = transitive_closure(sub_hierarchy(g, "mammal.n.01"))
    assert mammal.number_of_nodes() == 1182 and mammal.number_of_edges() == 6542


@needs_wordnet
@pytest.mark.slow
def test_wordnet_full_closure(wordnet_graph):
    clo = transitive_closure(wordnet_graph)
    assert clo.number_of_edges() == 743241
    assert clo.has_edge("dog.n.01", "entity.n.01")
