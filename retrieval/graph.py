"""The training graph: which texts a knowledge graph's training triples link, whatever the relation.

An entity's answers are often linked to it by other facts: a person's place of death is linked to
them as a residence, a film's country by its director's citizenship. A query operator encodes what
the query's text says, not what the graph already knows of it, so a recipe may add a bonus to each
pooled candidate that a training triple links to the query (SimKGC's neighbour re-ranking):

    w · [d is linked to q by a training triple]          (either direction, any relation)

``w`` is chosen on dev like the recipe's other weights (retrieval/recipe.py), 0 when dev shows no
gain; the graph is then not stored. One graph serves every relation of a bundle: it is stored once,
in ``bundle.info["graph"] = {"key": KEY, "nodes": [text key...], "edges": base64 int32 pairs}``,
each text by :func:`~.prior.key` (as the answer prior keys them) and each link once, as a pair of
node numbers (i < j). A document and a query match by their text, so an index of the entity texts
the triples name (a knowledge graph's entity file) gets the bonus; a text the graph does not hold
gets none.
"""
from __future__ import annotations

import base64
from collections.abc import Iterable

import numpy as np

from .prior import KEY, key

MAX_EDGES = 1_000_000  # 10.7 MB in base64: more would crowd bundle.json's 16 MB limit, so larger graphs are not offered


class Graph:
    """Undirected links between text keys, with each key's neighbours."""

    def __init__(self, nodes: list[str], edges: np.ndarray):
        self.nodes, self.edges = nodes, edges
        self.number = {k: i for i, k in enumerate(nodes)}
        both = np.concatenate([edges, edges[:, ::-1]]) if len(edges) else np.zeros((0, 2), np.int64)
        both = both[np.argsort(both[:, 0], kind="stable")]
        self._starts = np.searchsorted(both[:, 0], np.arange(len(nodes) + 1))
        self._ends = both[:, 1]

    @classmethod
    def build(cls, pairs: Iterable[tuple[str, str]]) -> Graph:
        """The graph of ``pairs`` (head text, tail text); a text linked to itself adds nothing."""
        number: dict[str, int] = {}
        links = set()
        for head, tail in pairs:
            a, b = (number.setdefault(key(t), len(number)) for t in (head, tail))
            if a != b:
                links.add((min(a, b), max(a, b)))
        return cls(list(number), np.array(sorted(links), np.int64).reshape(-1, 2))

    def to_json(self) -> dict:
        pairs = np.ascontiguousarray(self.edges, dtype="<i4").tobytes()
        return {"key": KEY, "nodes": self.nodes, "edges": base64.b64encode(pairs).decode("ascii")}

    @classmethod
    def from_json(cls, entry) -> Graph:
        """The stored graph; ValueError when the entry is malformed (checked when a bundle is opened)."""
        try:
            if not (isinstance(entry, dict) and entry.get("key") == KEY and isinstance(entry.get("nodes"), list)
                    and all(isinstance(n, str) for n in entry["nodes"]) and isinstance(entry.get("edges"), str)):
                raise ValueError("not an object with key, nodes and edges")
            edges = np.frombuffer(base64.b64decode(entry["edges"], validate=True), dtype="<i4")
            if len(edges) % 2 or (len(edges) and not 0 <= edges.min() <= edges.max() < len(entry["nodes"])):
                raise ValueError("edges are not pairs of node numbers")
        except (ValueError, TypeError) as e:
            raise ValueError(f"malformed graph ({e}; expected {{'key': {KEY!r}, 'nodes': [text key...], "
                             "'edges': base64 int32 pairs}})") from None
        return cls(list(entry["nodes"]), edges.astype(np.int64).reshape(-1, 2))

    def neighbours(self, text: str) -> set[str]:
        """The keys of the texts linked to ``text`` (empty when the graph does not hold it)."""
        i = self.number.get(key(text))
        if i is None:
            return set()
        return {self.nodes[j] for j in self._ends[self._starts[i]:self._starts[i + 1]]}

    def linked(self, queries: list[str], texts: list[str]) -> np.ndarray:
        """(len(queries), len(texts)) bool: whether a training triple links each query to each text
        (every copy of a text given twice)."""
        node = np.array([self.number.get(key(t), -1) for t in texts], np.int64)
        out = np.zeros((len(queries), len(texts)), bool)
        for row, q in enumerate(queries):
            i = self.number.get(key(q))
            if i is not None:
                out[row] = np.isin(node, self._ends[self._starts[i]:self._starts[i + 1]])
        return out


def of_bundle(bundle) -> Graph | None:
    """The bundle's training graph, None when it stores none (ValueError when malformed)."""
    entry = bundle.info.get("graph")
    return None if entry is None else Graph.from_json(entry)
