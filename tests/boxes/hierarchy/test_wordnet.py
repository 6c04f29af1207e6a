"""Tests for perturb.boxes.hierarchy.wordnet: the parser on a hand-written fixture in the real
wndb(5WN) format, and on the installed database when present."""
from __future__ import annotations

from pathlib import Path

import pytest

from perturb.boxes.hierarchy import (
    check_hierarchy,
    read_wordnet_index,
    read_wordnet_nouns,
    sub_hierarchy,
    transitive_closure,
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
