"""On-disk cache of frozen-encoder vectors, so adapter-regime training encodes each text once."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ...files import replaced_atomically

def default_cache_dir() -> Path:
    if os.environ.get("RELSEARCH_CACHE"):
        return Path(os.environ["RELSEARCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "relsearch" / "vectors"


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def encode_cached(encoder, texts: list[str], *, cache_dir: str | os.PathLike | None = None,
                  progress: bool = True) -> np.ndarray:
    """Raw vectors (n, d) float32 for ``texts``, encoding only those not already in the cache.

    The cache folder is keyed by the encoder identity (weights fingerprint, pooling, max length,
    dim) and dtype; each shard ``*.npz`` holds text hashes and vectors (no pickles).
    """
    ident = dict(encoder.identity, dtype=str(getattr(encoder, "dtype", "")))
    folder = Path(cache_dir or default_cache_dir()) / hashlib.sha256(
        json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    keys = np.array([_text_key(t) for t in texts], dtype="<U32")
    out = np.empty((len(texts), int(encoder.dim)), dtype=np.float32)
    found = np.zeros(len(texts), dtype=bool)
    for shard in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
        try:
            with np.load(shard, allow_pickle=False) as z:
                skeys, svecs = z["keys"], z["vectors"]
        except Exception:  # an unreadable shard is only a cache miss
            continue
        if len(skeys) == 0 or svecs.shape != (len(skeys), out.shape[1]):
            continue
        order = np.argsort(skeys)
        pos = np.searchsorted(skeys[order], keys).clip(max=len(skeys) - 1)
        hit = ~found & (skeys[order][pos] == keys)
        out[hit] = svecs[order[pos[hit]]]
        found |= hit
    missing = np.flatnonzero(~found)
    if len(missing):
        uniq, inverse = np.unique(keys[missing], return_inverse=True)
        first = missing[np.unique(inverse, return_index=True)[1]]
        bar = _tqdm(total=len(first), desc="encoding", unit="text", disable=not progress)
        vecs = encoder.encode([texts[i] for i in first], progress=bar.update).vectors
        bar.close()
        out[missing] = vecs[inverse]
        folder.mkdir(parents=True, exist_ok=True)
        name = folder / f"{hashlib.sha256(uniq.tobytes()).hexdigest()[:16]}.npz"
        with replaced_atomically(name) as tmp, open(tmp, "wb") as fh:  # not matched by *.npz until renamed
            np.savez(fh, keys=uniq, vectors=vecs)
    return out


def _tqdm(**kw):
    from tqdm.auto import tqdm

    return tqdm(**kw)


