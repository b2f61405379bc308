"""What every objective's training loop shares: seeding, early stopping, time budgets, resumable checkpoints.

A checkpoint lives beside the output bundle (``OUT.checkpoint/``) and is replaced atomically at
each save, so a killed run resumes from its last completed save; it is deleted once the bundle is
written. Tensors go through safetensors; optimizer state through ``torch.save`` read back with
``torch.load(weights_only=True)`` (no pickled code). The checkpoint records the run's
configuration; resuming with a different one is refused rather than silently mixing two runs.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np

STATE, TENSORS, OPTIMIZER = "state.json", "tensors.safetensors", "optimizer.pt"


def seed_everything(seed: int):
    """Seed Python, numpy and torch; returns a torch.Generator for the run's own draws."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


NOISE_Z = 2.0  # standard errors a dev score must fall below the best before it counts toward patience


def standard_error(values) -> float:
    """Standard error of the mean of per-query ``values`` (e.g. reciprocal ranks): std / √n (0 for n < 2)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


class EarlyStopping:
    """Keep the best dev score; ``update`` returns True once ``patience`` evaluations fell clearly below it.

    Any gain over the best, however small, makes a new best (its checkpoint is the one kept). An
    evaluation that is no gain counts toward ``patience`` (is *stale*) only when it lies at least
    ``noise_z`` standard errors (``se``, the score's own, over its dev queries) below the best; one
    within that margin is noise a fresh sample of dev queries could reverse, so it neither resets
    nor advances the count. Why a noise margin, rather than ignoring patience before most of a time
    budget is spent: it needs no budget (the epoch-limited runs get it too), it still stops a run
    whose dev score has really fallen, at any point of the budget, and it scales with the dev sample
    (1,000 queries at MRR 0.23: SE ≈ 0.01, so a dip under 0.02 is not a decline). The margin is the
    score's standard error, not the smaller one of a paired difference (two checkpoints ranked on
    the same queries): that needs no per-query state in checkpoints and errs toward training on.
    With ``se=0`` (callers without one) every evaluation without a gain is stale: the plain rule.
    ``counted`` says whether the last update was stale, for the run's log.
    """

    def __init__(self, patience: int, *, higher_is_better: bool = True, noise_z: float = NOISE_Z):
        self.patience, self.sign, self.noise_z = patience, 1.0 if higher_is_better else -1.0, noise_z
        self.best: float | None = None
        self.best_step, self.stale = 0, 0
        self.counted = False

    def improved(self, score: float) -> bool:
        return self.best is None or self.sign * score > self.sign * self.best

    def update(self, score: float, step: int, se: float = 0.0) -> bool:
        """Record the dev ``score`` (standard error ``se``) of ``step``; True once patience has run out."""
        self.counted = False
        if self.improved(score):
            self.best, self.best_step, self.stale = score, step, 0
            return False
        if self.sign * (self.best - score) >= self.noise_z * se:
            self.stale, self.counted = self.stale + 1, True
        return self.stale >= self.patience

    def state(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "stale": self.stale}

    def restore(self, state: dict) -> None:
        self.best, self.best_step, self.stale = state["best"], state["best_step"], state["stale"]


def dev_line(entry: dict, stopper: EarlyStopping, patience: int) -> str:
    """A dev evaluation (a history entry) as the progress bar shows it, e.g. ``dev MRR 0.231 ± 0.010
    (tail 0.350, head 0.112), best 0.233, stale 1/3`` (± one standard error over the dev queries)."""
    if math.isnan(entry.get("dev_mrr", math.nan)) or stopper.best is None:
        return "no dev data"
    sides = [f"{k[8:]} {entry[k]:.3f}" for k in ("dev_mrr_tail", "dev_mrr_head") if k in entry]
    return (f"dev MRR {entry['dev_mrr']:.3f} ± {entry.get('dev_mrr_se', 0.0):.3f}"
            + (f" ({', '.join(sides)})" if sides else "") + f", best {stopper.best:.3f}, stale {stopper.stale}/{patience}")


def clock() -> float:
    """The clock time budgets read (seconds); tests replace it (``monkeypatch.setattr(loop, "clock", ...)``)."""
    return time.monotonic()


class Budget:
    """``--time-budget MINUTES``: the wall time a run may take, evaluations and checkpoints included.

    A loop asks :meth:`allows` before each unit of work (a step, or an epoch for the epoch-based
    objectives) with its estimated cost — the mean of the units so far (:meth:`unit_done`) plus,
    where the loop must evaluate afterwards, the last evaluation's time (:meth:`eval_done`) — and
    stops cleanly when it would not fit; the best dev state kept so far is what the run returns.
    ``minutes=None`` never stops anything. ``spent`` is the time earlier sessions of a resumed run
    used (saved in the checkpoint as :meth:`elapsed`): the budget covers the run, not each session.
    """

    def __init__(self, minutes: float | None = None, *, spent: float = 0.0, clock_fn=None):
        if minutes is not None and minutes <= 0:
            raise ValueError(f"the time budget must be positive, got {minutes} minutes")
        self.minutes = minutes
        self.clock = clock_fn or clock
        self.started, self.spent = self.clock(), float(spent or 0.0)
        self.unit_seconds: list[float] = []
        self.eval_seconds = 0.0
        self.stopped = False  # set once allows() said no

    def elapsed(self) -> float:
        return self.spent + self.clock() - self.started

    def remaining(self) -> float:
        return float("inf") if self.minutes is None else 60.0 * self.minutes - self.elapsed()

    def fraction(self) -> float:
        """The share of the budget used (0 without a budget): schedules may decay to zero at its end."""
        return 0.0 if self.minutes is None else min(1.0, self.elapsed() / (60.0 * self.minutes))

    def unit_done(self, seconds: float) -> None:
        self.unit_seconds.append(seconds)

    def eval_done(self, seconds: float) -> None:
        self.eval_seconds = seconds

    def estimate(self, *, with_eval: bool = False) -> float:
        """Seconds the next unit should take: the mean unit so far (+ the last evaluation)."""
        unit = sum(self.unit_seconds[-50:]) / len(self.unit_seconds[-50:]) if self.unit_seconds else 0.0
        return unit + (self.eval_seconds if with_eval else 0.0)

    def allows(self, *, with_eval: bool = False) -> bool:
        """True when the next unit (and its evaluation) fits in what is left; False ends the run."""
        if self.minutes is None:
            return True
        ok = self.estimate(with_eval=with_eval) <= self.remaining()
        self.stopped = self.stopped or not ok
        return ok

    def record(self) -> dict:
        """What the bundle and model card say about the budget."""
        return {"time_budget_minutes": self.minutes, "elapsed_seconds": round(self.elapsed(), 1),
                "stopped_by_time_budget": self.stopped}


class Checkpoint:
    """``OUT.checkpoint/``: state.json (progress + config), tensors.safetensors, optimizer.pt."""

    def __init__(self, out: str | os.PathLike, config: dict):
        self.path = Path(str(out).rstrip("/") + ".checkpoint")
        self.config = json.loads(json.dumps(config, default=str))  # normalised for comparison

    def load(self) -> dict | None:
        """The saved ``{"state", "tensors", "optimizer"}``, or None when there is nothing to resume."""
        import torch
        from safetensors.torch import load_file

        # a kill between the two renames of save() leaves only ".old": still a complete checkpoint
        folder = next((p for p in (self.path, self._old) if (p / STATE).is_file()), None)
        if folder is None:
            return None
        state = json.loads((folder / STATE).read_text())
        if state.get("config") != self.config:
            raise ValueError(f"{self.path} holds a checkpoint of a run with other settings; delete it to start "
                             "over, or rerun with the same settings to resume")
        optimizer = None
        if (folder / OPTIMIZER).is_file():  # folder, not self.path: resuming from .old keeps its optimizer
            optimizer = torch.load(folder / OPTIMIZER, weights_only=True)
        return {"state": state["progress"], "tensors": load_file(str(folder / TENSORS)), "optimizer": optimizer}

    def save(self, progress: dict, tensors: dict, optimizer=None) -> None:
        """Write aside, then swap in: a kill during save leaves the previous checkpoint intact."""
        import torch
        from safetensors.torch import save_file

        from ... import faults

        tmp = self.path.with_name(self.path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / TENSORS))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        (tmp / STATE).write_text(json.dumps({"config": self.config, "progress": progress}, indent=1))
        if (self.path / STATE).is_file():
            shutil.rmtree(self._old, ignore_errors=True)
            os.replace(self.path, self._old)
        os.replace(tmp, self.path)
        shutil.rmtree(self._old, ignore_errors=True)
        faults.point("train.checkpoint-saved")

    @property
    def _old(self) -> Path:
        return self.path.with_name(self.path.name + ".old")

    def clear(self) -> None:
        for p in (self.path, self.path.with_name(self.path.name + ".tmp"), self._old):
            shutil.rmtree(p, ignore_errors=True)


def write_bundle(bundle, out: str | os.PathLike, *, encoder=None, card: str | None = None) -> Path:
    """Write ``bundle`` (plus fine-tuned ``encoder`` weights and a model card) to ``out``, atomically.

    Everything is written to ``OUT.partial/`` first and swapped in, so a killed run never leaves a
    half-written bundle where the last good one was. With ``encoder`` (a
    :class:`~.finetune.TrainableEncoder`) its weights go to ``OUT/encoder/`` and the bundle's encoder
    identity becomes theirs — indexes built with the base encoder no longer match (re-index).
    """
    from .finetune import ENCODER_DIR, encoder_identity

    from ... import faults

    out = Path(out)
    tmp, old = out.with_name(out.name + ".partial"), out.with_name(out.name + ".old")
    if old.exists() and not out.exists():  # an earlier run died between the two renames below
        os.replace(old, out)
    shutil.rmtree(tmp, ignore_errors=True)
    if encoder is not None:
        encoder.save(tmp / ENCODER_DIR)
        bundle.encoder = encoder_identity(tmp / ENCODER_DIR, encoder)
    elif _inside_a_bundle(bundle.encoder.get("model")):  # trained on a fine-tuned base: carry its weights along
        shutil.copytree(bundle.encoder["model"], tmp / ENCODER_DIR)
        bundle.encoder = dict(bundle.encoder, model=ENCODER_DIR, path=ENCODER_DIR)
    bundle.save(tmp)
    if card is not None:
        (tmp / "MODEL_CARD.md").write_text(card)
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
        faults.point("train.bundle-set-aside")
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    bundle.path = str(out)
    if bundle.encoder.get("path"):
        bundle.encoder["model"] = str(out / ENCODER_DIR)
    return out


def _inside_a_bundle(model) -> bool:
    """True for the fine-tuned encoder folder of another bundle (``BUNDLE/encoder``)."""
    from ..bundle import is_bundle

    return bool(model) and os.path.isdir(model) and is_bundle(Path(model).parent)
