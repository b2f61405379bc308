"""What every trainer takes and returns: its data, the shared run options, and one result type.

A trainer (:mod:`.registry`) is called as ``train(data, options, hparams)``:

- ``data`` (:class:`TrainData`): training / dev / test files plus the objective's extra inputs
  (candidate texts for the triple objectives, teachers for distillation);
- ``options`` (:class:`RunOptions`): how and where the run goes — starting encoder or bundle,
  destination, CPU threads, vector cache, progress bars, device, time budget (and whether it, with
  dev patience, replaces the epoch limit: ``until_budget``). They are not part
  of the hyperparameter record (:func:`.card.hyperparameters` leaves them out), so a run resumes
  under another budget; the budget and where it stopped the run are recorded in the training info;
- ``hparams``: the objective's config dataclass (``TrainConfig``, ``PUConfig``, ...), which is
  the hyperparameter record written to the bundle and its model card.

It returns a :class:`TrainResult`: the bundle, and the fine-tuned encoder when the objective
changed the encoder (write both with :func:`.loop.write_bundle`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# Run options that the config dataclasses also carry (so a trainer function can be called with a
# config alone); they are never part of the hyperparameter record.
CONFIG_RUN_FIELDS = ("cache_dir", "progress", "threads", "device", "time_budget", "until_budget")


@dataclass(frozen=True, kw_only=True)
class TrainData:
    """Input files of a run (JSONL; format per objective) and the objective's extra inputs."""

    train: tuple[str, ...]
    dev: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    candidates: list[str] | None = None  # triple objectives: more texts every softmax contrasts against
    teachers: tuple[str, ...] = ()  # distill: teacher bundles or models

    def __post_init__(self):
        for name in ("train", "dev", "test", "teachers"):
            object.__setattr__(self, name, tuple(str(f) for f in getattr(self, name)))


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How and where a run goes; ``None`` leaves the objective's own default."""

    base: str | None = None  # encoder or bundle to start from (None: the shipped pack's encoder)
    out: str | None = None  # bundle folder the caller writes; its resumable checkpoint lives beside it
    threads: int | None = None  # torch CPU threads while training (None: leave torch's setting)
    cache_dir: str | None = None  # frozen-vector cache (None: $RELSEARCH_CACHE or ~/.cache/relsearch/vectors)
    progress: bool | None = None  # progress bars
    device: str | None = None  # where fine-tuning runs ("auto", "cpu", "cuda", ...), for objectives that choose
    time_budget: float | None = None  # minutes of wall time for the run, evaluations included (None: no limit)
    # with time_budget: the budget and dev patience end the run, not the config's default epochs (objectives
    # whose config has the field; relsearch train sets it for --time-budget without --epochs)
    until_budget: bool | None = None

    def applied_to(self, config):
        """``config`` with the run options that were set and that its class has (others unchanged)."""
        names = {f.name for f in dataclasses.fields(config)}
        given = {k: getattr(self, k) for k in CONFIG_RUN_FIELDS if k in names and getattr(self, k) is not None}
        return dataclasses.replace(config, **given) if given else config


@dataclass(frozen=True)
class TrainResult:
    """A trained bundle, and the fine-tuned encoder (``TrainableEncoder``) when the objective changed it."""

    bundle: object
    encoder: object | None = field(default=None)
