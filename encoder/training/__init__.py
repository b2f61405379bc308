"""``relsearch train``: one trainer per objective (design.md §4) behind one contract.

:mod:`.registry` — ``TRAINERS[name].train(data, options, hparams) -> TrainResult`` for every
objective (:mod:`.options`: ``TrainData``, ``RunOptions``, ``TrainResult``); the CLI dispatches
through it. The objectives:

- :mod:`.rse` — relational contrastive (RSE), adapter regime; :mod:`.rse_joint` — joint regime;
  :mod:`.tower` — relation-conditioned LoRA query encoder;
- :mod:`.aspect` — AspectCSE (:mod:`.aspect_data` data and metrics, :mod:`.aspect_joint` joint regime);
- :mod:`.transition` — transition matrix;
- :mod:`.pu` — PAUSE (:mod:`.pu_risk` the PU maths, :mod:`.pu_model` model and metrics);
- :mod:`.distill` — ensemble distillation (:mod:`.distill_data` readers, :mod:`.sts_teacher` teachers).

Shared parts: :mod:`.data` readers, :mod:`.splits` triples as text-id arrays, :mod:`.linkpred`
operator forms and the link-prediction protocol, :mod:`.cache` frozen-vector cache, :mod:`.loop`
seeding / early stopping / checkpoints / atomic bundle writes, :mod:`.finetune` trainable encoder +
gradient caching, :mod:`.card` the hyperparameter record and model cards.
"""
from .cache import encode_cached
from .data import read_triples
from .rse import TrainConfig, rse_loss, train_adapter

__all__ = ["TrainConfig", "encode_cached", "read_triples", "rse_loss", "train_adapter"]
