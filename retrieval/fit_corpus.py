"""What a recipe fit ranks (retrieval/recipe_fit.py): a split's whole corpus (:class:`Corpus`),
the texts a split's relations share (:class:`Split`), and the triples files that make them: each
split's pairs per relation to fit, and what the training triples tell the fit (answers, known
pairs, graph)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..encoder.relations import normalize
from ..indexer.lexical import BM25
from .graph import MAX_EDGES, Graph


def read(files) -> list:
    """Every triple of the triples ``files``, in order."""
    from ..encoder.training.data import read_triples

    return [t for f in files for t in read_triples(f)]


@dataclass(frozen=True)
class Training:
    """What the training triples tell the fit: each relation's (and R^-1's) answers, one per
    triple (for its answer prior), its (query, answer) pairs (filtered from ranks), and the graph
    the triples draw (None without triples, or with more links than a bundle stores)."""

    answers: dict[str, list[str]]
    known: dict[str, list[tuple[str, str]]]
    graph: Graph | None

    @classmethod
    def read(cls, files, say: Callable[[str, bool], None]) -> Training:
        from ..encoder.training.data import INVERSE_SUFFIX

        training = read(files)
        answers: dict[str, list[str]] = {}
        known: dict[str, list[tuple[str, str]]] = {}
        for t in training:
            answers.setdefault(t.relation, []).append(t.tail)
            answers.setdefault(t.relation + INVERSE_SUFFIX, []).append(t.head)
            known.setdefault(t.relation, []).append((t.head, t.tail))
            known.setdefault(t.relation + INVERSE_SUFFIX, []).append((t.tail, t.head))
        graph = Graph.build((t.head, t.tail) for t in training) if training else None
        if graph is not None and len(graph.edges) > MAX_EDGES:
            say(f"warning: the training graph has {len(graph.edges)} links, more than a bundle stores "
                f"({MAX_EDGES}); no relation is offered the neighbours bonus", True)
            graph = None
        return cls(answers, known, graph)


def relation_pairs(bundle, triples: dict[str, list]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Relation to fit → split → its (head, tail) pairs (R^-1's reversed); identity, both-sided
    operators and relations with no dev or test pair are left out."""
    from ..encoder.training.data import INVERSE_SUFFIX

    pairs = {}
    for name, op in sorted(bundle.operators.items()):
        base, inverse = name.removesuffix(INVERSE_SUFFIX), name.endswith(INVERSE_SUFFIX)
        pairs[name] = {s: [(t.tail, t.head) if inverse else (t.head, t.tail) for t in rows if t.relation == base]
                       for s, rows in triples.items()}
        if not (pairs[name]["dev"] or pairs[name]["test"]) or op.kind == "identity" or op.both_sides:
            del pairs[name]
    return pairs


@dataclass(frozen=True)
class Encoded:
    """A corpus's texts encoded once — raw vectors of the bundle's encoder and their unit vectors —
    and indexed once by BM25: what :func:`tables` scores a corpus with."""

    raw: np.ndarray
    unit: np.ndarray
    bm25: BM25

    @classmethod
    def of(cls, texts: list[str], encode: Callable[[list[str]], np.ndarray]) -> Encoded:
        raw = encode(texts)
        return cls(raw, normalize(raw), BM25(texts))


@dataclass(frozen=True)
class Corpus:
    """One split's whole corpus: ``texts`` (m) the candidates and the queries, the queries
    (``heads``: positions in ``texts``), each query's gold positions, ``metadata`` field → each
    text's value, and ``candidate`` (m bools, default all): which texts an index of the split
    holds (a question is a query of qa-entailment, never one of its answers). ``known``: each
    query's answers that training already knows (a knowledge graph's other facts of the query), not
    ranked and not competing with its golds; None: none. ``prominence``: (m,) each text's prominence
    in [0, 1] (indexer/mining.py ``prominence_of``), offered to the recipe; None: none. ``mentions``:
    (m, m) float, how strongly text i's document is linked to text j's by naming (``mentions_of``); None: none. ``encoded``: the
    texts already encoded and indexed (corpora of one :class:`Split` share it); None: :func:`tables`
    encodes them."""

    texts: list[str]
    heads: list[int]
    gold: list[set[int]]
    metadata: dict[str, list] = field(default_factory=dict)
    candidate: list[bool] | None = None
    known: list[set[int]] | None = None
    prominence: np.ndarray | None = field(default=None, compare=False, repr=False)
    mentions: np.ndarray | None = field(default=None, compare=False, repr=False)
    encoded: Encoded | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_pairs(cls, pairs: list[tuple[str, str]], texts: list[str] = (), *, heads: bool = True) -> Corpus:
        """The candidates are every tail of ``pairs`` (head, tail), every text of ``texts`` (the
        rest of the split: negatives, a corpus) and, with ``heads``, every head (questions of a
        forum are its documents; questions of answer selection are not its answers: heads=False
        keeps a head only when it is among the others). Each distinct head is a query."""
        index: dict[str, int] = {t: i for i, t in enumerate(dict.fromkeys(
            [*texts, *(t for _, t in pairs), *(h for h, _ in pairs if heads)]))}
        candidates = len(index)
        for head, _ in pairs:
            index.setdefault(head, len(index))
        gold: dict[int, set[int]] = {}
        for head, tail in pairs:
            if head != tail:
                gold.setdefault(index[head], set()).add(index[tail])
        return cls(list(index), list(gold), list(gold.values()), candidate=[i < candidates for i in range(len(index))])

    def same(self) -> dict[str, np.ndarray]:
        """field → (n_queries, m) bool: the candidate holds the query's (non-null) value."""
        out = {}
        for f, values in self.metadata.items():
            column = np.asarray([str(v) if v is not None else "\0none" for v in values])
            query = column[self.heads]
            out[f] = (column[None, :] == query[:, None]) & (query[:, None] != "\0none")
        return out

    def exclude(self) -> np.ndarray:
        """(n_queries, m) bool: each query itself, and every text that is not a candidate."""
        mask = np.zeros((len(self.heads), len(self.texts)), bool)
        mask[np.arange(len(self.heads)), self.heads] = True
        if self.candidate is not None:
            mask |= ~np.asarray(self.candidate, bool)[None, :]
        return mask

    @property
    def candidates(self) -> int:
        return len(self.texts) if self.candidate is None else int(sum(self.candidate))


class Split:
    """The texts of one split that the corpora of every relation fitted on it share: the
    ``candidates`` (what an index of the split holds), then the ``queries`` that are not among them;
    encoded, normalised and indexed by BM25 once (:class:`Encoded`), so that fitting a hundred
    relations on a split does that once, not once per relation. :meth:`corpus` gives a relation's."""

    def __init__(self, candidates: list[str], queries: list[str], encode: Callable[[list[str]], np.ndarray]):
        candidates = list(dict.fromkeys(candidates))
        self.texts = list(dict.fromkeys([*candidates, *queries]))
        self.candidate = [i < len(candidates) for i in range(len(self.texts))]
        self.position = {t: i for i, t in enumerate(self.texts)}
        self.encoded = Encoded.of(self.texts, encode)

    def corpus(self, pairs: list[tuple[str, str]], known: list[tuple[str, str]] = ()) -> Corpus:
        """The corpus of ``pairs`` (head, tail): each distinct head with a tail other than itself is a
        query, every tail a gold (heads among ``queries``, tails among ``candidates``); ``known``
        (head, tail) pairs from training give each query's :attr:`Corpus.known` answers."""
        gold: dict[int, set[int]] = {}
        for head, tail in pairs:
            if head != tail:
                gold.setdefault(self.position[head], set()).add(self.position[tail])
        answers: dict[int, set[int]] = {}
        for head, tail in known:
            if head in self.position and tail in self.position:
                answers.setdefault(self.position[head], set()).add(self.position[tail])
        return Corpus(self.texts, list(gold), list(gold.values()), candidate=self.candidate, encoded=self.encoded,
                      known=[answers.get(h, set()) - gold[h] - {h} for h in gold] if known else None)


def split_corpora(triples: dict[str, list], pairs: dict, candidates: list[str] | None, encode) -> dict[str, Split]:
    """Split → what an index of it would hold (every head, tail and hard negative; with ``candidates``
    those, its tails and negatives), encoded and indexed once, shared by every relation."""
    splits = {}
    for s, rows in triples.items():
        queries = sorted({h for by_split in pairs.values() for h, _ in by_split[s]})
        if queries:
            texts = {x for t in rows for x in (t.tail, t.negative) if x} \
                | (set(candidates) if candidates else {t.head for t in rows})
            splits[s] = Split(sorted(texts), queries, encode)
    return splits
