"""``relsearch train``: one module per objective (design.md §4), sharing readers, cache and loop helpers.

- :mod:`.rse` — relational contrastive (RSE), adapter regime (frozen encoder);
- :mod:`.data` — triples / pairs / labelled-corpus readers; :mod:`.cache` — frozen-vector cache.
"""
from .cache import encode_cached
from .data import read_triples
from .rse import TrainConfig, rse_loss, train_adapter

__all__ = ["TrainConfig", "encode_cached", "read_triples", "rse_loss", "train_adapter"]
