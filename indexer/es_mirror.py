"""Mirror a generation into Elasticsearch: a new timestamped index, bulk-loaded, then the alias.

``relsearch index|delete|compact … --es-url URL --es-index NAME`` passes an :class:`EsMirror` to
``store.commit``: ``load(gen)`` creates ``NAME-<utc stamp>-<rand>`` and bulk-indexes every live
document of the new generation (unit vector t̂, raw norm, text, metadata), writing Elasticsearch's
rejections to ``rejected-es.jsonl`` in the generation; the counts go to the manifest's
``backends.elasticsearch`` and must reconcile (read = documents = indexed + rejected). After the
FAISS generation is published, ``publish()`` swaps the alias ``NAME`` to the new index in one
``_aliases`` call and deletes the ``NAME-…`` indices the alias left (unless ``keep_old``).

Every mutation re-mirrors the whole corpus (O(N) documents sent): simple and atomic for readers
of the alias. Credentials come only from the environment or ``credentials_file`` (indexer/elastic.py).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import elastic, reader, store
from .manifest import Manifest
from .segments import Documents

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EsTarget:
    """Where and how to mirror: ``alias`` is the name queries use (``--es-index``)."""

    url: str
    alias: str
    credentials_file: str | None = None
    ca_certs: str | None = None
    index_type: str = "int8_hnsw"
    keep_old: bool = False

    def __post_init__(self):
        elastic.check_index_name(self.alias)


def _metadata_sample(docstore: Documents) -> dict:
    """First non-null value of every metadata field (types the mapping)."""
    sample: dict = {}
    for rows in docstore.rows():
        for _, _, _, meta, _ in rows:
            for key, value in meta.items():
                if key not in sample and value is not None:
                    sample[key] = value
    return sample


class EsMirror:
    name = "elasticsearch"

    def __init__(self, target: EsTarget, *, client=None, clock: Callable[[], _dt.datetime] | None = None):
        self.target = target
        self.client = client if client is not None else elastic.connect(
            target.url, credentials_file=target.credentials_file, ca_certs=target.ca_certs)
        self.clock = clock or (lambda: _dt.datetime.now(_dt.timezone.utc))
        self.index_name: str | None = None

    def load(self, gen: Path, manifest: Manifest) -> dict:
        """Create a new index and bulk-load ``gen``'s live documents; returns reconciled counts."""
        files = reader.open_generation(gen, manifest)
        vectors, docstore = files.vectors, files.docstore
        stamp = self.clock().strftime("%Y%m%dt%H%M%S")
        self.index_name = elastic.check_index_name(f"{self.target.alias}-{stamp}-{uuid.uuid4().hex[:6]}")
        meta = {"bundle": manifest.bundle.get("fingerprint"), "encoder": manifest.encoder.get("weights_sha256"),
                "generation": gen.name}
        config = elastic.EsIndexConfig(dims=int(vectors.shape[1]), index_type=self.target.index_type)
        try:
            with elastic.reported(f"load {self.index_name} at {elastic.display_url(self.target.url)}"):
                elastic.create_index(self.client, self.index_name, config, _metadata_sample(docstore), meta=meta)
                documents = docstore.count()
                with open(gen / store.ES_REJECTED_FILE, "w", encoding="utf-8") as out:
                    def sink(doc_id, reason):
                        out.write(json.dumps({"id": doc_id, "reason": reason}, ensure_ascii=False) + "\n")

                    counts = elastic.bulk_index(self.client, self.index_name, self._docs(docstore, vectors),
                                                rejected_sink=sink, dims=config.dims)
        except BaseException:
            self._drop_quietly()  # never leave a half-loaded index behind
            raise
        finally:
            docstore.close()
            files.close_faiss_fd()
        if not counts.reconciles or counts.read != documents:
            self._drop_quietly()
            raise RuntimeError(f"Elasticsearch counts do not reconcile: {documents} documents, read {counts.read}, "
                               f"indexed {counts.indexed}, rejected {counts.failed}")
        return {"alias": self.target.alias, "index": self.index_name, "read": counts.read,
                "indexed": counts.indexed, "rejected": counts.failed, "rejected_file": store.ES_REJECTED_FILE,
                "index_type": self.target.index_type}

    def _drop_quietly(self) -> None:
        """Delete the half-loaded index; if that fails too, the first error is the one to report."""
        try:
            elastic.delete_index(self.client, self.index_name)
        except Exception as e:  # noqa: BLE001
            log.warning("could not delete the partial Elasticsearch index %s: %s", self.index_name,
                        type(e).__name__)

    @staticmethod
    def _docs(docstore: Documents, vectors: np.ndarray):
        for rows in docstore.rows(batch=2_000):
            block = np.asarray(vectors[[r[0] for r in rows]], dtype=np.float32)
            for (_, doc_id, text, meta, norm), vec in zip(rows, block):
                yield {"id": doc_id, "text": text, "vector": vec, "norm": norm, "metadata": meta}

    def publish(self) -> list[str]:
        """Point the alias at the new index; delete the previous ``alias-…`` indices it left."""
        where = elastic.display_url(self.target.url)
        with elastic.reported(f"point alias {self.target.alias} at {self.index_name} ({where}); the local index "
                              "is published: run the command again to bring the alias up to date"):
            old = elastic.swap_alias(self.client, self.target.alias, self.index_name)
            if not self.target.keep_old:
                for name in old:
                    if name.startswith(f"{self.target.alias}-"):
                        elastic.delete_index(self.client, name)
        return old


def mirrors_for(target: EsTarget | None, **kw) -> tuple:
    """``(EsMirror(target),)`` or ``()``: what ``store.commit`` and the mutations take."""
    return () if target is None else (EsMirror(target, **kw),)
