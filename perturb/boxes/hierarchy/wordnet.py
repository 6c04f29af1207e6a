"""Hierarchies to embed as boxes: the WordNet 3.0 noun hierarchy and synthetic DAGs.

Every source here returns a :class:`networkx.DiGraph` in one convention, used by the
whole of :mod:`perturb.boxes.hierarchy`:

    an edge ``child -> parent`` means "child IS-A parent", i.e. the child's box should lie
    inside the parent's box (``containment_prob(parent_box, child_box)`` close to 1).

So roots (e.g. ``entity.n.01``) have out-degree 0 and leaves have in-degree 0, and the
ancestors of ``u`` in the hierarchy are ``networkx.descendants(graph, u)``. A *transitive
closure* adds ``u -> a`` for every ancestor ``a`` of ``u`` (no self-loops unless asked); a
*transitive reduction* keeps only the edges not implied by others.

WordNet is read from the database files of WordNet 3.0 (``data.noun`` and ``index.noun``,
format ``wndb(5WN)``) as installed by Debian's ``wordnet-base`` package in
``/usr/share/wordnet``; nothing is downloaded. A synset is named like NLTK names it,
``<first lemma, lower case>.n.<sense number, 2 digits>`` (e.g. ``mammal.n.01``), where the sense
number is the position of the synset's offset in the ``index.noun`` line of that lemma. Without
``index.noun`` the names fall back to ``<first lemma>.n.<8-digit offset>`` (unique, but not
NLTK's).

Counts measured on Debian's ``wordnet-base 1:3.0-37`` (``tests/boxes/test_datasets.py`` pins
them when the files are installed):

- nouns, hypernyms + instance hypernyms (default): 82,115 synsets, 84,427 ``@``/``@i`` edges,
  transitive reduction 84,366, closure 743,241;
- nouns, hypernyms only (``@``): 74,374 synsets, 75,834 edges, reduction 75,798, closure 663,492;
- ``mammal.n.01`` subtree, ``@`` + ``@i``: 1,182 synsets, 1,182 edges (= reduction), closure
  6,542;
- ``mammal.n.01`` subtree, ``@`` only: 1,170 synsets, 1,170 edges, closure 6,448.

The 82,115 / 743,241 of the first item are the numbers of Nickel & Kiela (2017) for the noun
closure, and 1,182 / 6,542 the mammal counts usually quoted: both include the instance
hypernyms (``@i``; 7,730 synsets are instances, e.g. ``einstein.n.01``), which is the default
here. (A few edges are implied by others, hence reduction < edges; ``@i`` edges that are
implied are kept in the raw graph.) The hypernym-only hierarchy drops the 7,741 synsets that
no longer reach ``entity.n.01`` without ``@i`` edges (instances, and the few hyponyms of
instances such as the islands under ``west_indies.n.01``).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import NamedTuple

import networkx as nx

from perturb.boxes.hierarchy.graphs import induced_subgraph, sub_hierarchy, transitive_closure

__all__ = [
    "DEFAULT_WORDNET_DIR",
    "WordNetSynset",
    "wordnet_dir",
    "read_wordnet_nouns",
    "read_wordnet_index",
    "wordnet_noun_hierarchy",
]

#: Where Debian's ``wordnet-base`` installs the database (override with ``$WORDNET_DIR``).
DEFAULT_WORDNET_DIR = "/usr/share/wordnet"

_HYPERNYM = "@"
_INSTANCE_HYPERNYM = "@i"


class WordNetSynset(NamedTuple):
    """One noun synset parsed from ``data.noun``.

    ``offset`` is the synset's byte offset in ``data.noun`` (its identifier), ``lemmas`` its words
    (underscores for spaces, original case), ``hypernyms``/``instance_hypernyms`` the offsets of
    the ``@``/``@i`` pointer targets, ``lexname_id`` the lexicographer file number, ``gloss`` the
    definition text.
    """

    offset: int
    lexname_id: int
    lemmas: tuple[str, ...]
    hypernyms: tuple[int, ...]
    instance_hypernyms: tuple[int, ...]
    gloss: str


def wordnet_dir() -> Path:
    """The WordNet database directory: ``$WORDNET_DIR`` if set, else :data:`DEFAULT_WORDNET_DIR`."""
    return Path(os.environ.get("WORDNET_DIR", DEFAULT_WORDNET_DIR))


def _parse_data_line(line: str, lineno: int, path: Path) -> WordNetSynset:
    """Parse one synset line of ``data.noun`` (``wndb(5WN)``):

    ``offset lex_filenum ss_type w_cnt(2 hex) [word lex_id(1 hex)]* p_cnt(3 dec)
    [ptr_symbol offset pos source/target(4 hex)]* | gloss``.
    """
    data, _, gloss = line.partition(" | ")
    tok = data.split()
    try:
        offset = int(tok[0])
        lexname_id = int(tok[1])
        ss_type = tok[2]
        w_cnt = int(tok[3], 16)
        pos = 4
        lemmas = tuple(tok[pos + 2 * i] for i in range(w_cnt))
        pos += 2 * w_cnt
        p_cnt = int(tok[pos])
        pos += 1
        hyper: list[int] = []
        inst: list[int] = []
        for i in range(p_cnt):
            sym, target, target_pos = tok[pos + 4 * i], tok[pos + 4 * i + 1], tok[pos + 4 * i + 2]
            if target_pos != "n":
                continue
            if sym == _HYPERNYM:
                hyper.append(int(target))
            elif sym == _INSTANCE_HYPERNYM:
                inst.append(int(target))
        if len(lemmas) != w_cnt or pos + 4 * p_cnt > len(tok):
            raise IndexError
    except (IndexError, ValueError) as exc:
        raise ValueError(f"{path}:{lineno}: not a WordNet data.noun synset line "
                         f"(wndb(5WN) format): {line[:80]!r}") from exc
    if ss_type != "n":
        raise ValueError(f"{path}:{lineno}: expected a noun synset (ss_type 'n'), got {ss_type!r}")
    return WordNetSynset(offset, lexname_id, lemmas, tuple(hyper), tuple(inst), gloss.strip())


def read_wordnet_nouns(path: str | os.PathLike | None = None, *,
                       check_offsets: bool = True) -> dict[int, WordNetSynset]:
    """Parse WordNet's ``data.noun`` into ``{offset: WordNetSynset}``.

    Args:
        path: the ``data.noun`` file, or a directory holding it. Default: ``wordnet_dir()``.
        check_offsets: verify that every synset's offset equals the byte position of its line,
            as the format promises (catches a truncated, re-encoded or wrong file).

    Returns:
        dict from synset offset to :class:`WordNetSynset`, in file order.

    Raises:
        FileNotFoundError: when the file does not exist (install Debian's ``wordnet-base``).
        ValueError: a malformed line, or an offset that does not match its byte position.
    """
    path = Path(path) if path is not None else wordnet_dir()
    if path.is_dir():
        path = path / "data.noun"
    if not path.is_file():
        raise FileNotFoundError(f"WordNet noun database not found at {path}; install Debian's "
                                f"'wordnet-base' package or pass path=/dir/with/data.noun")
    synsets: dict[int, WordNetSynset] = {}
    position = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            start, position = position, position + len(raw)
            if raw.startswith(b"  ") or not raw.strip():   # licence header / blank
                continue
            s = _parse_data_line(raw.decode("utf-8"), lineno, path)
            if check_offsets and s.offset != start:
                raise ValueError(f"{path}:{lineno}: synset offset {s.offset:08d} does not match "
                                 f"the line's byte position {start}; not an unmodified data.noun")
            synsets[s.offset] = s
    return synsets


def read_wordnet_index(path: str | os.PathLike | None = None) -> dict[str, tuple[int, ...]]:
    """Parse WordNet's ``index.noun`` into ``{lemma: (synset offsets in sense order)}``.

    Line format (``wndb(5WN)``): ``lemma pos synset_cnt p_cnt [ptr_symbol]* sense_cnt
    tagsense_cnt [synset_offset]*``; the offsets are listed by decreasing tagged frequency, which
    is WordNet's sense numbering (``dog.n.01`` is the first).
    """
    path = Path(path) if path is not None else wordnet_dir()
    if path.is_dir():
        path = path / "index.noun"
    if not path.is_file():
        raise FileNotFoundError(f"WordNet index not found at {path}")
    index: dict[str, tuple[int, ...]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.startswith("  ") or not line.strip():
                continue
            tok = line.split()
            try:
                synset_cnt, p_cnt = int(tok[2]), int(tok[3])
                offsets = tuple(int(t) for t in tok[4 + p_cnt + 2:])
            except (IndexError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not an index.noun line: {line[:80]!r}") from exc
            if len(offsets) != synset_cnt:
                raise ValueError(f"{path}:{lineno}: expected {synset_cnt} offsets, "
                                 f"got {len(offsets)}")
            index[tok[0]] = offsets
    return index


def _synset_names(synsets: dict[int, WordNetSynset],
                  index: dict[str, tuple[int, ...]] | None) -> dict[int, str]:
    """NLTK-style names ``lemma.n.NN`` (sense number from ``index.noun``), or the fallback
    ``lemma.n.<offset>`` when no index is given."""
    names: dict[int, str] = {}
    for off, s in synsets.items():
        lemma = s.lemmas[0].lower()
        if index is None:
            names[off] = f"{lemma}.n.{off:08d}"
            continue
        try:
            sense = index[lemma].index(off) + 1
        except (KeyError, ValueError) as exc:
            raise ValueError(f"index.noun has no sense of {lemma!r} pointing at synset "
                             f"{off:08d}; data.noun and index.noun do not match") from exc
        names[off] = f"{lemma}.n.{sense:02d}"
    return names


def wordnet_noun_hierarchy(path: str | os.PathLike | None = None, *,
                           instance_hypernyms: bool = True,
                           index_path: str | os.PathLike | None = None,
                           root: str | None = None,
                           closure: bool = False) -> nx.DiGraph:
    """The WordNet 3.0 noun hierarchy as a DiGraph with edges ``child -> parent``.

    Nodes are synset names (``"mammal.n.01"``) with attributes ``offset``, ``lemmas``, ``gloss``;
    edges carry ``kind`` = ``"hypernym"`` (``@`` pointers) or ``"instance_hypernym"`` (``@i``,
    e.g. ``einstein.n.01 -> physicist.n.01``).

    Args:
        path: ``data.noun`` or its directory (default: :func:`wordnet_dir`).
        instance_hypernyms: include ``@i`` edges (default True, 82,115 synsets). With False,
            only ``@`` edges are used and the synsets that then no longer reach the top
            (``entity.n.01``) are dropped, leaving 74,374 synsets.
        index_path: ``index.noun`` or its directory, used for sense numbers (default: next to
            ``data.noun``; if missing, names fall back to ``lemma.n.<offset>`` with a warning).
        root: keep only this synset and its descendants (see :func:`sub_hierarchy`).
        closure: return the transitive closure instead of the hypernym edges.

    Returns:
        ``networkx.DiGraph``, edges ``child -> parent`` (a DAG: nouns may have several parents).

    Example:
        >>> g = wordnet_noun_hierarchy(root="mammal.n.01", closure=True)  # doctest: +SKIP
        >>> g.number_of_nodes(), g.number_of_edges()                       # doctest: +SKIP
        (1182, 6542)
    """
    data_path = Path(path) if path is not None else wordnet_dir()
    if data_path.is_dir():
        data_path = data_path / "data.noun"
    synsets = read_wordnet_nouns(data_path)
    idx = Path(index_path) if index_path is not None else data_path.parent / "index.noun"
    if idx.is_dir():
        idx = idx / "index.noun"
    if idx.is_file():
        index = read_wordnet_index(idx)
    else:
        warnings.warn(f"{idx} not found: synsets are named 'lemma.n.<offset>' instead of "
                      f"'lemma.n.<sense>'", stacklevel=2)
        index = None
    names = _synset_names(synsets, index)
    g = nx.DiGraph()
    for off, s in synsets.items():
        g.add_node(names[off], offset=off, lemmas=s.lemmas, gloss=s.gloss)
    for off, s in synsets.items():
        child = names[off]
        for h in s.hypernyms:
            g.add_edge(child, names[h], kind="hypernym")
        if instance_hypernyms:
            for h in s.instance_hypernyms:
                g.add_edge(child, names[h], kind="instance_hypernym")
    if not instance_hypernyms:
        # instances now have no parent; keep what still reaches the top synset(s)
        tops = [u for u in g if g.out_degree(u) == 0 and g.in_degree(u) > 0
                and not synsets[g.nodes[u]["offset"]].instance_hypernyms]
        keep = set(tops).union(*(nx.ancestors(g, t) for t in tops))
        g = induced_subgraph(g, keep)
    if root is not None:
        g = sub_hierarchy(g, root)
    if closure:
        g = transitive_closure(g)
    return g

