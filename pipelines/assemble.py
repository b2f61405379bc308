"""From finished encoding shards to document blocks: duplicate ids, rejections, counts.

Two passes over the shards, so that memory holds one shard at a time, never the corpus:
:func:`plan_shards` reads only each shard's JSONL rows (and the truncation count) to decide which
records are kept (a later line with an already-seen id is a duplicate) and to collect the
rejections; :func:`shard_blocks` then yields the kept documents with their vectors, shard by shard,
for indexer/build.py or indexer/mutations.py to write. The set of seen ids is the one structure
that grows with the corpus (about 100 bytes per id). Also here: the input error type, the
encoder check for ``--append`` and the ``--strict`` rejections file.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..indexer import records as rec
from ..indexer import store
from ..indexer.build import Block
from . import shardfs


class IndexInputError(ValueError):
    """The input cannot be indexed at all (missing, unreadable, empty, nothing valid)."""


@dataclass
class ShardPlan:
    keep: list[np.ndarray] = field(default_factory=list)  # per chunk: kept flag per valid record row
    rejected: list[dict] = field(default_factory=list)  # Rejection.to_json(), by line
    read: int = 0
    kept: int = 0
    truncated: int = 0
    dim: int | None = None


def _rows(build: str, number: int) -> list[dict]:
    # split on "\n" only: str.splitlines also breaks at U+2028, U+0085, ... which JSON leaves unescaped;
    # the rows decoded as one JSON array: 2.5x faster than a json.loads per row
    text = shardfs.read(shardfs.join(build, f"{number:06d}.jsonl")).decode("utf-8")
    return json.loads("[" + ",".join(line for line in text.split("\n") if line) + "]")


def _vectors_npz(build: str, number: int):
    """The chunk's ``.npz`` (vectors, truncated, lines), read through FileSystems."""
    return np.load(io.BytesIO(shardfs.read(shardfs.join(build, f"{number:06d}.npz"))), allow_pickle=False)


def plan_shards(build: str, chunks) -> ShardPlan:
    """Pass 1: which records are kept, which lines are rejected and why, and the counts."""
    plan, seen = ShardPlan(), {}
    for chunk in chunks:
        with _vectors_npz(build, chunk.number) as data:
            plan.truncated += int(data["truncated"])
            if plan.dim is None and data["vectors"].ndim == 2 and len(data["vectors"]):
                plan.dim = int(data["vectors"].shape[1])
        rows = _rows(build, chunk.number)
        keep = []
        for row in (r for r in rows if "rejected" not in r):
            first = seen.setdefault(row["id"], row["line"])
            if first != row["line"]:
                plan.rejected.append(rec.Rejection(row["line"], rec.DUPLICATE_ID, f"id {row['id']!r} first seen on "
                                                   f"line {first}", row["text"][:200]).to_json())
            if "duplicate" not in row:  # a repeat within its chunk has no vector (index.encode_chunk)
                keep.append(first == row["line"])
        plan.rejected += [r["rejected"] for r in rows if "rejected" in r]
        plan.keep.append(np.asarray(keep, dtype=bool))
        plan.kept += int(sum(keep))
        plan.read += chunk.lines
    plan.rejected.sort(key=lambda r: r["line"])
    return plan


def kept_vectors(build: str, number: int, keep: np.ndarray) -> np.ndarray:
    """The raw vectors of chunk ``number``'s kept records (``keep``: its :class:`ShardPlan` mask)."""
    with _vectors_npz(build, number) as data:
        return data["vectors"][keep]


def kept_field_vectors(build: str, number: int, keep: np.ndarray) -> tuple[np.ndarray, ...]:
    """The raw vectors of text fields 1… of chunk ``number``'s kept records (``vectors_1``, … of a
    build of several named texts: pipelines/index.py ``encode_fields``); () for one text field."""
    with _vectors_npz(build, number) as data:
        extra = sorted((k for k in data.files if k.startswith("vectors_")), key=lambda k: int(k.split("_")[1]))
        return tuple(data[k][keep] for k in extra)


def shard_blocks(build: str, chunks, plan: ShardPlan):
    """Pass 2: one :class:`~relsearch.indexer.build.Block` of kept documents per shard, in input order."""
    for chunk, keep in zip(chunks, plan.keep):
        if not keep.any():
            continue
        vectors = kept_vectors(build, chunk.number, keep)
        fields = kept_field_vectors(build, chunk.number, keep)
        docs = [{"id": r["id"], "text": r["text"], "metadata": r["metadata"]}
                for r, k in zip((r for r in _rows(build, chunk.number) if "rejected" not in r and "duplicate" not in r),
                                keep) if k]
        yield Block(docs, vectors, fields)


def check_same_encoder(index: str, encoder: dict) -> None:
    """Refuse to append vectors from another encoder than the one ``index`` was built with (the
    append checks again under the writer lock, indexer/mutations.py; this gives the CLI's wording)."""
    from ..indexer.mutations import EncoderMismatchError, check_encoder

    try:
        check_encoder(index, store.read_manifest(store.current_generation(index)).encoder, encoder)
    except EncoderMismatchError as e:
        raise IndexInputError(f"--append: {e}") from None


def check_same_text_fields(index: str, names: tuple[str, ...]) -> None:
    """Refuse to append documents of other named text fields than the index's (indexer/text_fields.py):
    each field's vectors live in its own files, so the fields and their order are the index's."""
    from ..indexer import text_fields as tf

    have = tf.names_of(store.read_manifest(store.current_generation(index)))
    if (len(have) > 1 or len(names) > 1) and tuple(names) != have:
        raise IndexInputError(f"--append: {index} has the text fields {', '.join(have)}; these documents were read "
                              f"with {', '.join(names)}: give the same --text-field options, in that order")


def keep_rejections(rejected: list[dict], target: str) -> str:
    """Write a refused run's rejections beside the index so the user can read them."""
    dest = f"{os.path.abspath(target)}.rejected.jsonl"
    with open(dest, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected)
    return dest
