"""Sentence transition matrix on frozen vectors (design.md §4, seed: "Sentence transition matrix").

One ``linear`` operator per relation of paraphrase / same-meaning pairs (triples JSONL
``{"head", "relation", "tail"[, "group"]}``): ``q = normalize(W h + b)``, W a d×d matrix
initialised to the identity and b = 0, so epoch 0 *is* plain cosine and a relation whose dev MRR
never improves keeps it.

Loss of a batch of B pairs (h_i, t_i): with N the B×B cosine matrix between mapped heads and the
tails, ``loss = λ·mean_i(1 − N_ii) + (1 − λ)·mean_{i≠j} N_ij`` (λ = 0.7 default).

Which side W applies to. design.md writes N for ``(IW)(PW)ᵀ`` — W on both sides. But the operator
is served on the query side only: documents are indexed with the frozen encoder unchanged (that is
the point of the adapter regime: existing indexes stay valid), so at query time the score is
``cos(W h + b, t)``. We therefore train what is served: ``N_ij = cos(W h_i + b, t_j)`` with raw
tails (``both_sides=False``, default). ``both_sides=True`` trains the paper's symmetric form
``cos(W h_i + b, W t_j + b)`` for comparison; the operator it yields is still applied to queries
only, so its training objective and its use differ (and dev early stopping measures the use).

Batches hold at most one pair per meaning group (the ``group`` field, or ``group_field``; a pair
without one is its own head text's group): two captions of the same image in one batch would be
pushed apart as if they were unrelated (false negatives in the off-diagonal term).

Evaluation is :func:`.linkpred.link_prediction` (the protocol ``linkpred.PROTOCOL``): dev MRR each
epoch for early stopping (best epoch kept), test MRR of the trained operator and of identity in
``op.info["metrics"]``, in the format :mod:`.rse` writes. Deterministic for a given ``seed`` (the
batch order of epoch e is drawn from ``(seed, relation, e)``; nothing else is random), and
resumable: with ``out``, a :class:`.loop.Checkpoint` beside it is saved at every epoch end and a
rerun with the same settings continues from it (the caller clears it once the bundle is written).
"""
from __future__ import annotations

import dataclasses
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, is_bundle, load_bundle
from ..relations import Operator, normalize
from .cache import _tqdm, encode_cached
from .card import hyperparameters as _record
from .data import Triple, iter_jsonl, read_triples, relations_to_train
from .linkpred import link_prediction, trained_vs_identity
from .loop import Budget, Checkpoint, EarlyStopping
from .splits import RelationSplit, relation_splits, sample_queries, subsample, text_ids, true_tails

_Split = RelationSplit  # the earlier name, still used by this module's tests

TRAINER = "relsearch transition (frozen encoder, sentence transition matrix)"


@dataclass(frozen=True, kw_only=True)
class TransitionConfig:
    """Hyperparameters of :func:`train_transition` (CLI flag in each comment)."""

    lam: float = 0.7  # --lambda: weight of the diagonal term λ·mean(1 − N_ii)
    both_sides: bool = False  # --both-sides: train cos(W h + b, W t + b) instead of cos(W h + b, t)
    symmetric: bool = False  # --symmetric: also train every pair reversed (tail → head)
    bias: bool = True  # --no-bias: keep b = 0 (train W only)
    # --off-temperature: a soft-max over each row's off-diagonal cosines (None: their plain mean, the paper's term).
    # The default 0.02 because with the plain mean the flickr8k operator never left identity (docs/training.md).
    off_temperature: float | None = 0.02
    epochs: int = 20  # --epochs: maximum; early stopping on dev MRR
    patience: int = 3  # --patience
    batch_size: int = 256  # --batch-size
    lr: float = 1e-3  # --lr (Adam)
    seed: int = 13  # --seed
    relations: tuple[str, ...] | None = None  # --relation (repeatable): train only these
    group_field: str = "group"  # --group-field: JSONL field naming a pair's meaning group (e.g. "image")
    max_train_pairs: int | None = None  # --max-train: seeded subsample of each relation's training pairs
    max_dev_queries: int | None = 2000  # --max-dev-queries: dev triples scored per epoch (seeded sample)
    threads: int | None = None  # --threads: torch CPU threads while training
    cache_dir: str | None = None  # --cache-dir: frozen-vector cache
    progress: bool = True  # --quiet turns it off
    time_budget: float | None = None  # --time-budget minutes for the whole run (not in the hyperparameter record)

    def __post_init__(self):
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lambda must be in [0, 1], got {self.lam}")
        if self.epochs < 0 or self.batch_size < 2 or self.patience < 1 or self.lr <= 0:
            raise ValueError("epochs must be ≥ 0, batch_size ≥ 2, patience ≥ 1, lr > 0")
        if self.off_temperature is not None and self.off_temperature <= 0:
            raise ValueError("off_temperature must be > 0 (or None for the plain mean)")
        if self.max_train_pairs is not None and self.max_train_pairs < 1:
            raise ValueError("max_train_pairs must be ≥ 1")


def hyperparameters(config: TransitionConfig) -> dict:
    """What a bundle records (and a checkpoint compares): the config without run-time knobs."""
    return _record(config)


# ---------------------------------------------------------------------------------------- loss
def transition_loss(queries, tails, lam: float, off_temperature: float | None = None):
    """λ·mean_i(1 − N_ii) + (1 − λ)·mean_{i≠j} N_ij, N = cosine matrix of ``queries`` (B, d) × ``tails`` (B, d).

    ``off_temperature`` τ (default None = the seed's formula above) replaces each row's plain mean of
    its off-diagonal cosines by their soft maximum ``τ·log mean_{j≠i} exp(N_ij / τ)`` (τ → ∞ gives the
    mean back, τ → 0 the hardest negative), so the negatives that outrank the positive dominate.
    """
    import torch
    import torch.nn.functional as F

    n = F.normalize(queries, dim=-1) @ F.normalize(tails, dim=-1).T
    b = n.shape[0]
    diag = n.diagonal()
    if b < 2:
        off = n.new_zeros(())
    elif off_temperature is None:
        off = (n.sum() - diag.sum()) / (b * (b - 1))
    else:
        eye = torch.eye(b, dtype=torch.bool, device=n.device)
        rows = torch.logsumexp((n / off_temperature).masked_fill(eye, float("-inf")), dim=1) - np.log(b - 1)
        off = (off_temperature * rows).mean()
    return lam * (1.0 - diag).mean() + (1.0 - lam) * off


def group_batches(keys: np.ndarray, order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Split ``order`` (row indices) into batches of ≤ ``batch_size`` with no two rows of one ``keys`` value.

    Greedy, in ``order``: each row goes into the first batch after the last one holding its key
    that still has room, so batches stay full except where one group has more pairs than there
    are batches (its surplus ends up in the final, smaller batches).
    """
    batches: list[list[int]] = []
    next_allowed: dict[int, int] = {}
    first_open = 0
    for i in order.tolist():
        k = int(keys[i])
        b = max(next_allowed.get(k, 0), first_open)
        while b < len(batches) and len(batches[b]) >= batch_size:
            b += 1
        if b == len(batches):
            batches.append([])
        batches[b].append(i)
        next_allowed[k] = b + 1
        while first_open < len(batches) and len(batches[first_open]) >= batch_size:
            first_open += 1
    return [np.array(b, dtype=np.int64) for b in batches]


# ------------------------------------------------------------------------------------- training
def _forward(W, b, h):
    return h @ W.T + b


def _numpy_apply(W, b):
    import torch

    def apply(h: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return normalize(_forward(W, b, torch.from_numpy(np.ascontiguousarray(h))).numpy())

    return apply


def _batch_keys(split: RelationSplit) -> np.ndarray:
    """Meaning-group key per pair: its group id, else (offset past all groups) its head text id."""
    offset = int(split.group.max(initial=-1)) + 1
    return np.where(split.group >= 0, split.group, offset + split.head)


class _Run:
    """One relation's training state (parameters, optimizer, early stopping, history)."""

    def __init__(self, name: str, d: int, config: TransitionConfig):
        import torch

        self.name, self.config = name, config
        self.W = torch.eye(d).requires_grad_()
        self.b = torch.zeros(d).requires_grad_(config.bias)
        self.opt = torch.optim.Adam([self.W, self.b] if config.bias else [self.W], lr=config.lr)
        self.stopper = EarlyStopping(config.patience)
        self.best = (self.W.detach().clone(), self.b.detach().clone())
        self.history: list[dict] = []
        self.epoch, self.done, self.seconds = 0, False, 0.0
        self.budget, self.stopped_by = Budget(None), "epochs"

    def tensors(self, prefix: str = "") -> dict:
        return {f"{prefix}W": self.W.detach(), f"{prefix}b": self.b.detach(),
                f"{prefix}best_W": self.best[0], f"{prefix}best_b": self.best[1]}

    def progress(self) -> dict:
        return {"relation": self.name, "epoch": self.epoch, "done": self.done, "stopper": self.stopper.state(),
                "history": self.history, "seconds": self.seconds, "stopped_by": self.stopped_by}

    def restore(self, progress: dict, tensors: dict, optimizer: dict | None, prefix: str = "") -> None:
        import torch

        with torch.no_grad():
            self.W.copy_(tensors[f"{prefix}W"])
            self.b.copy_(tensors[f"{prefix}b"])
        self.best = (tensors[f"{prefix}best_W"].clone(), tensors[f"{prefix}best_b"].clone())
        if optimizer is not None:
            self.opt.load_state_dict(optimizer)
        self.stopper.restore(progress["stopper"])
        self.history, self.epoch, self.done = list(progress["history"]), progress["epoch"], progress["done"]
        self.seconds = progress.get("seconds", 0.0)
        self.stopped_by = progress.get("stopped_by", "epochs")

    def end_epoch(self, epoch: int, loss: float, mrr: float | None) -> None:
        """Record ``epoch`` (its mean ``loss``, its dev ``mrr``; None: no dev, the last epoch is kept),
        keep its parameters when it is the best, and end the run at patience or the last epoch."""
        self.epoch = epoch
        self.history.append({"epoch": epoch, "loss": round(loss, 5),
                             **({"dev_mrr": round(mrr, 5)} if mrr is not None else {})})
        if mrr is None:
            self.stopper.update(float(epoch), epoch)
            stop = False
        else:
            stop = self.stopper.update(mrr, epoch)
        if self.stopper.best_step == epoch:
            self.best = (self.W.detach().clone(), self.b.detach().clone())
        self.done = stop or epoch >= self.config.epochs
        if stop:
            self.stopped_by = "patience"

    def info(self, dev) -> dict:
        return {"epochs_run": len(self.history), "best_epoch": self.stopper.best_step,
                "seconds": round(self.seconds, 1), "dev_mrr": None if dev is None else round(self.stopper.best, 5),
                "stopped_by": self.stopped_by, **(self.budget.record() if self.config.time_budget else {}),
                "history": self.history}


def _train_relation(run: _Run, vectors: np.ndarray, train: RelationSplit, dev: RelationSplit | None,
                    known: dict[int, set[int]], save) -> None:
    """Train ``run`` to the end (early stopping or ``epochs``), calling ``save()`` after every epoch."""
    import torch

    config, name = run.config, run.name
    raw = torch.from_numpy(vectors)
    heads, tails, keys = _pairs(train, config.symmetric)
    seed = [config.seed, zlib.crc32(name.encode())]
    if dev is not None:
        dev = sample_queries(dev, config.max_dev_queries, np.random.default_rng(seed + [0]))

    def dev_mrr() -> float:
        return link_prediction(_numpy_apply(run.W.detach(), run.b.detach()), vectors, dev, known)[0]["mrr"] \
            if dev is not None else float("nan")

    if run.epoch == 0 and not run.history:  # epoch 0 = the identity start (unless resumed past it)
        run.stopper.update(dev_mrr() if dev is not None else float("-inf"), 0)
    bar = _tqdm(total=config.epochs, initial=run.epoch, desc=f"{name} (transition)", unit="epoch",
                disable=not config.progress)
    if dev is not None and run.stopper.best is not None:
        bar.set_postfix(dev_mrr=f"{run.stopper.best:.3f}")
    while not run.done and run.epoch < config.epochs:
        if not run.budget.allows():  # an epoch and its dev evaluation must fit
            run.stopped_by = "time budget"
            break
        t0, b0 = time.time(), run.budget.clock()
        epoch = run.epoch + 1
        order = np.random.default_rng(seed + [epoch]).permutation(len(heads))
        loss_value = _epoch(run, raw, heads, tails, group_batches(keys, order, config.batch_size))
        mrr = dev_mrr()
        run.end_epoch(epoch, loss_value, mrr if dev is not None else None)
        run.seconds += time.time() - t0
        run.budget.unit_done(run.budget.clock() - b0)
        run.history[-1]["seconds"] = round(run.budget.elapsed(), 1)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}", **({"dev_mrr": f"{mrr:.3f}"} if dev is not None else {}))
        save()
    run.done = True
    bar.close()


def _pairs(train: RelationSplit, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (head, tail) text ids trained on and each pair's meaning-group key; ``symmetric`` adds
    every pair reversed, in its pair's group, so that it never meets its pair in a batch."""
    heads, tails, keys = train.head, train.tail, _batch_keys(train)
    if symmetric:
        heads, tails = np.concatenate([train.head, train.tail]), np.concatenate([train.tail, train.head])
        keys = np.concatenate([keys, keys])
    return heads, tails, keys


def _epoch(run: _Run, raw, heads: np.ndarray, tails: np.ndarray, batches: list[np.ndarray]) -> float:
    """One epoch of optimiser steps, a batch each; returns the mean loss (nan: no batch of two pairs)."""
    config = run.config
    losses = []
    for batch in batches:
        if len(batch) < 2:  # no off-diagonal term (a lone surplus pair of one big group)
            continue
        q = _forward(run.W, run.b, raw[heads[batch]])
        t = raw[tails[batch]]
        if config.both_sides:
            t = _forward(run.W, run.b, t)
        loss = transition_loss(q, t, config.lam, config.off_temperature)
        run.opt.zero_grad()
        loss.backward()
        run.opt.step()
        losses.append(loss.item())
    return float(np.mean(losses)) if losses else float("nan")


# ------------------------------------------------------------------------------------------ data
def _load(files, group_field: str) -> list[Triple]:
    out = []
    for f in files:
        triples = read_triples(f)
        if group_field != "group":  # the reader knows "group"; take the group from another field
            records = [rec for _, rec in iter_jsonl(f, "triples")]
            triples = [dataclasses.replace(t, group=None if rec.get(group_field) is None else str(rec[group_field]))
                       for t, rec in zip(triples, records)]
        out.extend(triples)
    return out


def _encoder_from(base):
    """An inference Encoder for ``base``: a bundle folder (its encoder), a model id/path, or None (default)."""
    from ..model import Encoder, EncoderConfig

    if base is None:
        return Encoder(EncoderConfig()), None
    if is_bundle(base):
        bundle = load_bundle(base)
        enc = bundle.encoder
        return Encoder(EncoderConfig(model=enc["model"], pooling=enc.get("pooling"),
                                     max_length=enc.get("max_length"))), bundle
    return Encoder(EncoderConfig(model=str(base))), None


def train_transition(train_files, *, dev_files=(), test_files=(), config: TransitionConfig = TransitionConfig(),
                     base=None, out=None, encoder=None, descriptions: dict[str, str] | None = None) -> Bundle:
    """Train one transition-matrix (``linear``) operator per relation of ``train_files``; return the bundle.

    ``base``: a bundle folder (its encoder is used; its other operators and re-ranking heads are
    kept) or a model id/path; default the default encoder. ``encoder``: an already built inference Encoder (wins
    over ``base``'s model). ``out``: the bundle folder the caller will write — only used to place
    the resumable checkpoint ``OUT.checkpoint/`` (clear it with ``Checkpoint.clear`` after writing).
    """
    if isinstance(train_files, (str, os.PathLike)):
        train_files = [train_files]
    if not train_files:
        raise ValueError("no training files given")
    budget = Budget(config.time_budget)  # shared by the relations, trained one after another
    loaded = {"train": _load(train_files, config.group_field), "dev": _load(dev_files, config.group_field),
              "test": _load(test_files, config.group_field)}
    wanted = relations_to_train(loaded, config.relations)
    if encoder is None:
        encoder, base_bundle = _encoder_from(base)
    else:
        base_bundle = load_bundle(base) if base is not None and is_bundle(base) else None
    texts = text_ids(loaded, wanted, negatives=False)
    vectors = encode_cached(encoder, list(texts), cache_dir=config.cache_dir, progress=config.progress)

    import torch

    ckpt = None
    if out is not None:
        ckpt = Checkpoint(out, {"objective": "transition", "hyperparameters": hyperparameters(config),
                                "encoder": encoder.identity,
                                "files": {k: [str(f) for f in v] for k, v in
                                          (("train", train_files), ("dev", dev_files), ("test", test_files))}})
    saved = ckpt.load() if ckpt is not None else None
    if saved is not None:
        budget.spent = saved["state"].get("elapsed", 0.0)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    runs: dict[str, _Run] = {}
    operators = dict(base_bundle.operators) if base_bundle is not None else {}
    try:
        for name in wanted:
            run = runs[name] = _Run(name, vectors.shape[1], config)
            run.budget = budget
            operators[name] = _train_one(run, loaded, texts, vectors, saved, _saver(ckpt, runs, run, budget),
                                         descriptions)
    finally:
        torch.set_num_threads(threads)
    heads = dict(base_bundle.heads) if base_bundle is not None else {}  # kept with the operators they serve
    return Bundle(encoder=dict(encoder.identity), operators=operators, heads=heads,
                  info={"trainer": TRAINER, "config": hyperparameters(config)})


def _saver(ckpt: Checkpoint | None, runs: dict[str, _Run], run: _Run, budget: Budget):
    """What saves the checkpoint at the end of each of ``run``'s epochs: every relation's progress
    and tensors so far, ``run``'s optimiser (nothing without ``ckpt``)."""
    def save():
        if ckpt is not None:
            ckpt.save({"runs": {n: r.progress() for n, r in runs.items()}, "current": run.name,
                       "elapsed": budget.elapsed()},
                      {k: v for n, r in runs.items() for k, v in r.tensors(f"{n}/").items()}, run.opt)

    return save


def _train_one(run: _Run, loaded: dict, texts, vectors: np.ndarray, saved: dict | None, save,
               descriptions: dict[str, str] | None) -> Operator:
    """Train ``run``'s relation on its splits of ``loaded`` (resumed from ``saved`` when it holds
    it) and return its operator, measured on test."""
    name, config = run.name, run.config
    splits = relation_splits(loaded, name, texts)
    if len(splits["train"]) == 0:
        raise ValueError(f"relation {name!r}: no usable training pairs (all have head == tail)")
    known = true_tails(*splits.values())  # filter with all pairs, before subsampling
    full_train = len(splits["train"])
    splits["train"] = subsample(splits["train"], config.max_train_pairs, [config.seed, zlib.crc32(name.encode()), 1])
    if saved is not None and name in saved["state"]["runs"]:
        current = saved["state"]["current"] == name
        run.restore(saved["state"]["runs"][name], saved["tensors"], saved["optimizer"] if current else None,
                    prefix=f"{name}/")
    dev = splits["dev"] if len(splits["dev"]) else None
    _train_relation(run, vectors, splits["train"], dev, known, save)
    return _operator(name, run, splits, full_train, known, vectors, config, dev, descriptions)


def _operator(name, run: _Run, splits, full_train, known, vectors, config, dev, descriptions) -> Operator:
    W, b = run.best
    op = Operator(name=name, kind="linear", description=(descriptions or {}).get(name, ""),
                  params={"W": W.numpy().astype(np.float32), "b": b.numpy().astype(np.float32)})
    metrics = trained_vs_identity(op.apply, vectors, splits["test"], known)
    data = {s: {"files": v.files, "triples": len(v), "dropped_head_equals_tail": v.dropped_self}
            for s, v in splits.items()}
    data["train"]["available"] = full_train
    data["train"]["groups"] = int(len(np.unique(_batch_keys(splits["train"]))))
    op.info = {"data": data, "hyperparameters": hyperparameters(config), "training": run.info(dev),
               "metrics": metrics}
    return op
