"""Answer relational queries against a published index.

Plan per query: raw vector h (encode the text, or t̂·‖h‖ for an indexed document) → relation
mixture q (encoder/relations.py) → FAISS search, or an exact search over the filtered subset →
drop the query document → attach docstore fields → optional per-operator explanation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..encoder.bundle import Bundle, load_bundle
from ..encoder.model import Encoder, EncoderConfig, resolve_model_path, weights_fingerprint
from ..encoder.relations import lookup, mixture_query
from ..indexer.store import IndexFiles, open_index


class QueryError(ValueError):
    """A query that cannot be answered as asked (unknown relation, field or document id)."""


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    text: str
    metadata: dict
    explain: dict | None = None  # operator name → cos(op(h), t)

    def to_json(self, rank: int | None = None) -> dict:
        out = {} if rank is None else {"rank": rank}
        out.update({"id": self.id, "score": round(float(self.score), 6), "text": self.text, **self.metadata})
        if self.explain is not None:
            out["explain"] = {k: round(float(v), 6) for k, v in self.explain.items()}
        return out


@dataclass(frozen=True, kw_only=True)
class Query:
    """One query: ``text`` or ``doc_id`` (an indexed document), relation weights, optional id."""

    text: str | None = None
    doc_id: str | None = None
    relations: dict[str, float] = field(default_factory=lambda: {"identity": 1.0})
    query_id: str | None = None


def _encoder_key(encoder: dict) -> tuple:
    sha = encoder.get("weights_sha256") or weights_fingerprint(resolve_model_path(encoder["model"]))
    return sha, encoder.get("pooling") or "mean"


class Searcher:
    """Opens one index generation and a bundle whose encoder matches the index's."""

    def __init__(self, index_dir: str, model: str | None = None, *, precision: str = "auto"):
        self.files: IndexFiles = open_index(index_dir)
        manifest = self.files.manifest
        recorded = manifest.get("bundle", {}).get("path")
        import os

        if model is None and recorded and os.path.isdir(recorded):
            model = recorded
        self.bundle: Bundle = load_bundle(model, dim=manifest["dim"])
        index_encoder = manifest["encoder"]
        if model is not None and not self.bundle.encoder.get("dim"):  # a bare model id: describe it like the index does
            self.bundle.encoder.update({"dim": manifest["dim"]})
        if _encoder_key(self.bundle.encoder) != _encoder_key(index_encoder):
            raise QueryError(
                f"index {index_dir} was built with encoder {index_encoder['model']!r} "
                f"(weights {index_encoder.get('weights_sha256')}, {index_encoder.get('pooling')} pooling) but the "
                f"model {self.bundle.path or self.bundle.encoder['model']!r} uses another encoder; re-index the corpus "
                f"with this model or query with a bundle built on the index's encoder"
            )
        self.precision = precision
        self._encoder: Encoder | None = None
        self.metadata_fields: list[str] = manifest["fields"]["metadata"]

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:  # only text queries need the transformer
            enc = self.files.manifest["encoder"]
            self._encoder = Encoder(EncoderConfig(model=self.bundle.encoder["model"], pooling=enc.get("pooling"),
                                                  max_length=enc.get("max_length"), precision=self.precision))
        return self._encoder

    @property
    def operators(self):
        return self.bundle.operators

    def check(self, relations: dict[str, float], filters: dict[str, str]) -> None:
        for name in relations:
            lookup(self.operators, name)  # raises KeyError naming the available ones
        for f in filters:
            if f not in self.metadata_fields:
                raise QueryError(f"unknown filter field {f!r}; metadata fields: {', '.join(self.metadata_fields) or '(none)'}")

    def unknown_ids(self, queries: list[Query]) -> set[str]:
        """doc_ids among ``queries`` that are not in the index."""
        wanted = [q.doc_id for q in queries if q.doc_id is not None]
        return set(wanted) - set(self.files.docstore.positions(wanted))

    def raw_vectors(self, queries: list[Query]) -> np.ndarray:
        """(n, d) raw query vectors: encoded text, or stored t̂·‖h‖ for doc_id queries."""
        out = np.zeros((len(queries), self.files.manifest["dim"]), dtype=np.float32)
        by_id = [i for i, q in enumerate(queries) if q.doc_id is not None]
        if by_id:
            positions = self.files.docstore.positions([queries[i].doc_id for i in by_id])
            missing = [queries[i].doc_id for i in by_id if queries[i].doc_id not in positions]
            if missing:
                raise QueryError(f"document id(s) not in the index: {', '.join(map(str, missing[:5]))}")
            docs = self.files.docstore.get(list(positions.values()))
            for i in by_id:
                pos = positions[queries[i].doc_id]
                out[i] = self.files.vectors[pos] * docs[pos]["norm"]
        by_text = [i for i, q in enumerate(queries) if q.doc_id is None]
        if by_text:
            out[by_text] = self.encoder.encode([queries[i].text for i in by_text]).vectors
        return out

    def search(self, queries: list[Query], *, k: int = 10, filters: dict[str, str] | None = None,
               explain: bool = False) -> list[list[Hit]]:
        """Top-k hits per query; queries sharing a relation mixture are searched as one batch."""
        filters = filters or {}
        for q in queries:
            if (q.text is None) == (q.doc_id is None):
                raise QueryError("each query needs exactly one of text or doc_id")
            self.check(q.relations, filters)
        h = self.raw_vectors(queries)
        qv = np.zeros_like(h)
        groups: dict[tuple, list[int]] = {}
        for i, q in enumerate(queries):
            groups.setdefault(tuple(sorted(q.relations.items())), []).append(i)
        for key, rows in groups.items():
            qv[rows] = mixture_query(self.operators, h[rows], dict(key))
        subset = np.asarray(self.files.docstore.matching(filters), dtype=np.int64) if filters else None
        # one extra candidate per query so that dropping the query document still leaves k
        positions, scores = self._ann(qv, k + 1, subset)
        docs = self.files.docstore.get(sorted({int(p) for p in positions.ravel() if p >= 0}))  # one fetch per batch
        results = []
        for i, q in enumerate(queries):
            kept = [(p, s) for p, s in zip(positions[i], scores[i]) if p >= 0 and docs[p]["id"] != q.doc_id][:k]
            hits = [Hit(docs[p]["id"], s, docs[p]["text"], docs[p]["metadata"]) for p, s in kept]
            if explain:
                hits = self._explain(h[i], hits, [p for p, _ in kept])
            results.append(hits)
        return results

    def _ann(self, qv: np.ndarray, k: int, subset: np.ndarray | None):
        """(positions, scores), each (n, k); -1 positions pad when fewer than k documents qualify."""
        if subset is None:
            scores, positions = self.files.faiss.search(np.ascontiguousarray(qv, dtype=np.float32), k)
            return positions, scores
        # Filtered: exact scores over the matching subset, so k hits come back whenever k match.
        n = len(qv)
        positions = np.full((n, k), -1, dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        if len(subset):
            sims = qv @ np.asarray(self.files.vectors[subset]).T  # (n, m)
            top = min(k, len(subset))
            idx = np.argpartition(-sims, top - 1, axis=1)[:, :top]
            order = np.take_along_axis(sims, idx, 1).argsort(axis=1)[:, ::-1]
            idx = np.take_along_axis(idx, order, 1)
            positions[:, :top] = subset[idx]
            scores[:, :top] = np.take_along_axis(sims, idx, 1)
        return positions, scores

    def _explain(self, h: np.ndarray, hits: list[Hit], positions: list[int]) -> list[Hit]:
        t = np.asarray(self.files.vectors[positions]) if positions else np.zeros((0, len(h)), np.float32)
        per_op = {name: (op.apply(h[None])[0] @ t.T) for name, op in sorted(self.operators.items())}
        return [Hit(hit.id, hit.score, hit.text, hit.metadata, {name: s[j] for name, s in per_op.items()})
                for j, hit in enumerate(hits)]


def score_pair(bundle: Bundle, encoder: Encoder, text_a: str, text_b: str) -> dict[str, float]:
    """cos(op(h_a), t̂_b) for every operator in the bundle (the RSE case-study view)."""
    h = encoder.encode([text_a, text_b]).vectors
    t = h[1] / max(np.linalg.norm(h[1]), 1e-12)
    return {name: float(op.apply(h[:1])[0] @ t) for name, op in sorted(bundle.operators.items())}
