"""Hierarchies to embed as boxes: the WordNet 3.0 noun hierarchy and synthetic DAGs.

Every source here returns a :class:`networkx.DiGraph` in one convention, used by
:mod:`perturb.boxes.hierarchy` as well:

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
from typing import Hashable, NamedTuple

import networkx as nx
import torch

__all__ = [
    "DEFAULT_WORDNET_DIR",
    "WordNetSynset",
    "wordnet_dir",
    "read_wordnet_nouns",
    "read_wordnet_index",
    "wordnet_noun_hierarchy",
    "transitive_closure",
    "transitive_reduction",
    "sub_hierarchy",
    "check_hierarchy",
    "balanced_tree",
    "random_tree",
    "random_dag",
    "HierarchySplit",
    "split_hierarchy",
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
        g = _induced_subgraph(g, keep)
    if root is not None:
        g = sub_hierarchy(g, root)
    if closure:
        g = transitive_closure(g)
    return g


def check_hierarchy(graph: nx.DiGraph, name: str = "graph") -> None:
    """Raise ValueError unless ``graph`` is a networkx DiGraph without cycles or self-loops."""
    if not isinstance(graph, nx.DiGraph):
        raise ValueError(f"{name} must be a networkx.DiGraph with edges child -> parent, "
                         f"got {type(graph).__name__}")
    if nx.number_of_selfloops(graph):
        u = next(iter(nx.selfloop_edges(graph)))[0]
        raise ValueError(f"{name} has a self-loop at {u!r}; a hierarchy is a DAG without them")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise ValueError(f"{name} must be acyclic (edges child -> parent); found the cycle {cycle}")


def transitive_closure(graph: nx.DiGraph, reflexive: bool = False) -> nx.DiGraph:
    """Transitive closure of a DAG: an edge ``u -> a`` for every ancestor ``a`` of ``u``.

    Computed in one pass in reverse topological order (ancestors(u) = ∪ over parents p of
    {p} ∪ ancestors(p)); O(closure size · average in-degree) time. Node attributes are kept;
    with ``reflexive=True`` self-loops ``u -> u`` are added too. Edges come in node order
    (by child, then ancestor), independent of the hash seed, so seeded splits and training
    runs reproduce across processes.
    """
    check_hierarchy(graph)
    ancestors: dict[Hashable, set] = {}
    position = {u: i for i, u in enumerate(graph.nodes)}
    out = nx.DiGraph()
    out.add_nodes_from(graph.nodes(data=True))
    for u in reversed(list(nx.topological_sort(graph))):   # parents before children
        anc: set = set()
        for p in graph.successors(u):
            anc.add(p)
            anc |= ancestors[p]
        ancestors[u] = anc
    for u in graph.nodes:       # edges in node order, not set (hash) order: reproducible
        out.add_edges_from((u, a) for a in sorted(ancestors[u], key=position.__getitem__))
    if reflexive:
        out.add_edges_from((u, u) for u in graph.nodes)
    return out


def transitive_reduction(graph: nx.DiGraph) -> nx.DiGraph:
    """The transitive reduction (networkx), keeping node attributes; edges in node order."""
    check_hierarchy(graph)
    red = nx.transitive_reduction(graph)
    position = {u: i for i, u in enumerate(graph.nodes)}
    out = nx.DiGraph()
    out.add_nodes_from(graph.nodes(data=True))
    # edges in node order (networkx builds them from sets, whose order depends on the hash seed)
    out.add_edges_from(sorted(red.edges, key=lambda e: (position[e[0]], position[e[1]])))
    return out


def sub_hierarchy(graph: nx.DiGraph, root: Hashable) -> nx.DiGraph:
    """The sub-hierarchy below ``root``: ``root`` and every node with a path to it (its
    hyponyms, direct or not), with all edges among them (a copy).

    Closure and restriction commute here: a path between two nodes of the sub-hierarchy only
    passes through nodes of the sub-hierarchy, so ``transitive_closure(sub_hierarchy(g, r))``
    equals the closure of ``g`` restricted to those nodes.
    """
    if root not in graph:
        raise ValueError(f"root={root!r} is not a node of the graph")
    keep = nx.ancestors(graph, root) | {root}
    return _induced_subgraph(graph, keep)


def _induced_subgraph(graph: nx.DiGraph, keep: set) -> nx.DiGraph:
    """A copy of ``graph`` restricted to ``keep``, nodes and edges in ``graph``'s order
    (``graph.subgraph(keep)`` iterates the set, whose order follows the hash seed for string
    labels, and node order fixes which box each node gets)."""
    out = nx.DiGraph(**graph.graph)
    out.add_nodes_from((u, d) for u, d in graph.nodes(data=True) if u in keep)
    out.add_edges_from((u, v, d) for u, v, d in graph.edges(data=True) if u in keep and v in keep)
    return out


# ----------------------------------------------------------------------------- synthetic

def _generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator:
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if generator is not None:
        return generator
    g = torch.Generator()
    if seed is not None:
        g.manual_seed(int(seed))
    else:
        g.seed()
    return g


def _check_int(value: int, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def balanced_tree(branching: int, height: int) -> nx.DiGraph:
    """Complete ``branching``-ary tree of the given height, edges ``child -> parent``.

    Nodes are ``0 .. n-1`` in breadth-first order (root 0, parent of ``i`` is
    ``(i - 1) // branching``), n = (b^(h+1) − 1)/(b − 1); ``balanced_tree(2, 9)`` has 1,023 nodes.
    """
    _check_int(branching, "branching", 1)
    _check_int(height, "height", 0)
    n = height + 1 if branching == 1 else (branching ** (height + 1) - 1) // (branching - 1)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((i, (i - 1) // branching) for i in range(1, n))
    return g


def random_tree(n: int, *, generator: torch.Generator | None = None,
                seed: int | None = None) -> nx.DiGraph:
    """Random recursive tree on ``0 .. n-1`` rooted at 0, edges ``child -> parent``: the parent
    of node ``i >= 1`` is uniform on ``{0, ..., i-1}`` (expected depth ~ log n)."""
    _check_int(n, "n", 1)
    gen = _generator(generator, seed)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    if n > 1:
        i = torch.arange(1, n, dtype=torch.float64)
        parents = (torch.rand(n - 1, generator=gen, dtype=torch.float64) * i).long()
        g.add_edges_from(zip(range(1, n), parents.tolist()))
    return g


def random_dag(n: int, extra_edge_prob: float = 0.05, *, generator: torch.Generator | None = None,
               seed: int | None = None) -> nx.DiGraph:
    """Random hierarchy DAG on ``0 .. n-1`` with the single root 0, edges ``child -> parent``.

    Node ``i >= 1`` gets one parent uniform on ``{0..i-1}`` (so the DAG is connected and every
    node reaches 0) and, independently with probability ``extra_edge_prob``, each other
    ``j < i`` as an extra parent. Edges implied by others are kept (call
    :func:`transitive_reduction` to drop them).
    """
    _check_int(n, "n", 1)
    if not 0.0 <= float(extra_edge_prob) <= 1.0:
        raise ValueError(f"extra_edge_prob must be in [0, 1], got {extra_edge_prob!r}")
    gen = _generator(generator, seed)
    g = random_tree(n, generator=gen)
    if n > 2 and extra_edge_prob > 0:
        u = torch.rand(n, n, generator=gen, dtype=torch.float64)
        child, parent = torch.nonzero(torch.tril(u < extra_edge_prob, diagonal=-1), as_tuple=True)
        g.add_edges_from(zip(child.tolist(), parent.tolist()))
    return g


# ----------------------------------------------------------------------------- splits

class HierarchySplit(NamedTuple):
    """Node order and edge splits of a hierarchy, as ``(m, 2)`` LongTensors of
    ``(child, parent)`` node indices into ``nodes``.

    ``train`` holds the transitive reduction plus a fraction of the remaining closure edges;
    ``val``/``test`` the other closure edges (positives only: draw negatives with
    :func:`perturb.boxes.sample_negatives`). ``closure`` is every closure edge.
    """

    nodes: list
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    closure: torch.Tensor


def _edge_tensor(edges, index: dict) -> torch.Tensor:
    t = torch.tensor([(index[u], index[v]) for u, v in edges], dtype=torch.long)
    return t.reshape(-1, 2)


def split_hierarchy(graph: nx.DiGraph, train_fraction: float = 0.0, val_fraction: float = 0.5,
                    *, generator: torch.Generator | None = None,
                    seed: int | None = None) -> HierarchySplit:
    """Split a hierarchy for the generalisation setting (Ganea et al. 2018; Dasgupta et al. 2020).

    The transitive reduction always goes to ``train`` (the minimal set from which the closure
    can be inferred); of the *non-basic* closure edges (closure minus reduction), a random
    ``train_fraction`` joins ``train``, and the rest is split into ``val`` (a ``val_fraction`` of
    it) and ``test``.
    """
    for name, v in (("train_fraction", train_fraction), ("val_fraction", val_fraction)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v!r}")
    gen = _generator(generator, seed)
    nodes = list(graph.nodes)
    index = {u: i for i, u in enumerate(nodes)}
    red = transitive_reduction(graph)
    clo = transitive_closure(graph)
    red_t = _edge_tensor(red.edges, index)
    red_set = set(red.edges)
    rest = _edge_tensor([e for e in clo.edges if e not in red_set], index)
    perm = torch.randperm(rest.shape[0], generator=gen)
    n_train = int(round(train_fraction * rest.shape[0]))
    n_val = int(round(val_fraction * (rest.shape[0] - n_train)))
    train = torch.cat([red_t, rest[perm[:n_train]]])
    val = rest[perm[n_train:n_train + n_val]]
    test = rest[perm[n_train + n_val:]]
    return HierarchySplit(nodes, train, val, test, _edge_tensor(clo.edges, index))
