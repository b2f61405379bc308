"""``relsearch train``: one module per objective (design.md §4), sharing readers, cache and loop helpers.

- :mod:`.rse` — relational contrastive (RSE), adapter regime; :mod:`.rse_joint` — joint regime;
- :mod:`.aspect` — AspectCSE; :mod:`.transition` — transition matrix; :mod:`.pu` — PAUSE;
  :mod:`.distill` — ensemble distillation;
- :mod:`.data` readers, :mod:`.cache` frozen-vector cache, :mod:`.loop` seeding / early stopping /
  checkpoints / atomic bundle writes, :mod:`.finetune` trainable encoder + gradient caching,
  :mod:`.card` model cards.
"""
from .cache import encode_cached
from .data import read_triples
from .rse import TrainConfig, rse_loss, train_adapter

__all__ = ["TrainConfig", "encode_cached", "read_triples", "rse_loss", "train_adapter"]
