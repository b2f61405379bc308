"""Adapter-regime RSE training: frozen encoder, one learned operator per relation (design.md §4).

Flow of :func:`train_adapter`:

1. read triples JSONL (``{"head", "relation", "tail"[, "negative"][, "group"]}``) for train / dev / test;
2. encode every distinct text once with the frozen encoder, through an on-disk vector cache keyed
   by the encoder's weights fingerprint, pooling, max length and dtype plus a hash of each text
   (:func:`encode_cached`; a rerun encodes nothing);
3. per relation, learn a ``linear`` (W = I, b = 0 at start) or ``translation`` (r ~ N(0, 0.02))
   operator on the raw vectors with the RSE contrastive loss at τ = 0.05 (:func:`rse_loss`);
   early stopping on dev MRR (the starting point, ≈ identity, is epoch 0, so a relation whose dev
   MRR never improves keeps its initial operator);
4. evaluate trained operator and identity on the test triples (link prediction,
   :func:`.linkpred.link_prediction`) and store both in ``operator.info["metrics"]``.

The triple data shapes (:mod:`.splits`) and the link-prediction protocol (:mod:`.linkpred`) are
shared with :mod:`.rse_joint` and :mod:`.transition`.

Negatives. Vectors are precomputed, so by default (``negatives="all"``) each query is contrasted
with *every* distinct training text of its relation (heads, tails and hard negatives): a full
softmax over the relation's candidate table, which is the same candidate set shape as the test
protocol and contains each triple's hard negative; when that table has more than
``max_candidates`` texts, each batch instead gets a fresh uniform sample of that size plus the
batch's own tails and hard negatives (a sampled softmax, to bound the cost on large relations).
``negatives="batch"`` is RSE's own recipe:
the batch's tails plus one hard negative per triple (its ``negative`` field, else a random tail of
the relation that is not a true tail of the head). In both modes false negatives are masked out
of the softmax: other true tails of the same head (same text), texts sharing the triple's
``group``, and the head itself.
"""
from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle
from ..kinds import TRAINABLE, kind_of
from ..relations import Operator
from .cache import _tqdm, encode_cached
from .card import hyperparameters
from .data import Triple, read_triples, relations_to_train, with_inverses
from .linkpred import forward, init_params, link_prediction, numpy_apply, trained_vs_identity
from .loop import Budget, Checkpoint
from .splits import RelationSplit, relation_splits, sample_queries, text_ids, true_tails

OPERATOR_KINDS = TRAINABLE  # the kinds with a torch init and forward (encoder/kinds.py)
NEGATIVE_MODES = ("all", "batch")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyperparameters of :func:`train_adapter`. ``lr=None`` → 1e-2 (translation) / 3e-3 (linear)."""

    operator: str = "linear"
    epochs: int = 30  # maximum; early stopping on dev MRR
    patience: int = 4  # epochs without dev improvement before stopping
    batch_size: int = 256
    lr: float | None = None
    temperature: float = 0.05
    negatives: str = "all"
    max_candidates: int | None = 8192  # "all" mode: above this many texts, a fresh random sample per batch
    seed: int = 13
    relations: tuple[str, ...] | None = None  # train only these (default: every relation in train)
    inverse: bool = False  # also train "<relation>^-1" on reversed triples (head prediction)
    max_dev_queries: int | None = 2000  # dev triples scored per epoch (a seeded sample; candidates stay all)
    threads: int | None = None  # torch CPU threads while training (None: leave torch's setting)
    cache_dir: str | None = None  # vector cache; default $RELSEARCH_CACHE or ~/.cache/relsearch/vectors
    progress: bool = True
    time_budget: float | None = None  # minutes for the whole run (a run option: not in the hyperparameter record)

    def __post_init__(self):
        if self.operator not in OPERATOR_KINDS:
            raise ValueError(f"unknown operator {self.operator!r}; choose one of {', '.join(OPERATOR_KINDS)}")
        if self.negatives not in NEGATIVE_MODES:
            raise ValueError(f"unknown negatives {self.negatives!r}; choose one of {', '.join(NEGATIVE_MODES)}")
        if self.epochs < 0 or self.batch_size < 1 or self.temperature <= 0 or self.patience < 1:
            raise ValueError("epochs must be ≥ 0, batch_size and patience ≥ 1, temperature > 0")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else kind_of(self.operator).lr


# ---------------------------------------------------------------------------------------- loss
def rse_loss(queries, candidates, positive, mask, temperature: float):
    """RSE contrastive loss: mean over queries of −log softmax(cos(q_i, c)/τ)[positive_i].

    ``queries`` (b, d) and ``candidates`` (c, d) are unit vectors (torch); ``positive`` (b,) the
    column of each query's true tail; ``mask`` (b, c) bool, True = a false negative to drop from the
    softmax (its positive column must be False).
    """
    import torch.nn.functional as F

    logits = (queries @ candidates.T) / temperature
    logits = logits.masked_fill(mask, float("-inf"))
    return F.cross_entropy(logits, positive)


# ------------------------------------------------------------------------------ relation data
_Split = RelationSplit  # earlier names, still used by this module's tests
_init_params = init_params


def _exclusions(s: RelationSplit) -> list[np.ndarray]:
    """Per training triple: texts to mask out of its softmax (false negatives), never its tail."""
    known = true_tails(s)
    members: dict[int, set[int]] = {}
    for h, t, g in zip(s.head.tolist(), s.tail.tolist(), s.group.tolist()):
        if g >= 0:
            members.setdefault(g, set()).update((h, t))
    out = []
    for h, t, g in zip(s.head.tolist(), s.tail.tolist(), s.group.tolist()):
        ex = known[h] | members.get(g, set()) | {h}
        ex.discard(t)
        out.append(np.fromiter(ex, dtype=np.int64, count=len(ex)))
    return out


def _mask(batch: np.ndarray, excl: list[np.ndarray], cand_pos: np.ndarray, n_cand: int) -> np.ndarray:
    mask = np.zeros((len(batch), n_cand), dtype=bool)
    for row, i in enumerate(batch):
        p = cand_pos[excl[i]]
        mask[row, p[p >= 0]] = True
    return mask


# ----------------------------------------------------------------------------------- training
class _Candidates:
    """The softmax columns of one relation's training batches (module docstring, "Negatives")."""

    def __init__(self, raw, train: RelationSplit, config: TrainConfig, extra: np.ndarray | None):
        import torch

        self.train, self.config, self.n = train, config, len(raw)
        self.pool = np.unique(np.concatenate([train.head, train.tail, train.neg[train.neg >= 0]]
                                             + ([extra] if extra is not None else [])))
        self.tail_pool = np.unique(train.tail)
        self.unit = torch.nn.functional.normalize(raw, dim=-1)
        self.pool_unit = self.unit[self.pool]  # "all" mode: the candidate table is fixed, gather it once
        self.pos = np.full(self.n, -1, dtype=np.int64)  # text id → candidate column (−1: not a candidate)
        self.pos[self.pool] = np.arange(len(self.pool))

    def for_batch(self, batch: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, object]:
        """(text id → column map, unit candidate vectors) for one batch."""
        config, train = self.config, self.train
        if config.negatives == "all":
            if not config.max_candidates or len(self.pool) <= config.max_candidates:
                return self.pos, self.pool_unit
            sample = rng.choice(self.pool, config.max_candidates, replace=False)
            cand = np.unique(np.concatenate([sample, train.tail[batch], train.neg[batch][train.neg[batch] >= 0]]))
        else:
            neg = train.neg[batch].copy()
            need = neg < 0
            neg[need] = rng.choice(self.tail_pool, size=int(need.sum()))  # a true tail drawn here is masked
            cand = np.unique(np.concatenate([train.tail[batch], neg]))
        cand_pos = np.full(self.n, -1, dtype=np.int64)
        cand_pos[cand] = np.arange(len(cand))
        return cand_pos, self.unit[cand]


def _train_relation(name: str, vectors: np.ndarray, train: RelationSplit, dev: RelationSplit | None,
                    known: dict[int, set[int]], config: TrainConfig,
                    extra: np.ndarray | None = None, budget: Budget | None = None) -> tuple[dict, dict]:
    """Learn one operator; returns (numpy params, training info). ``budget`` (shared by the run's
    relations) ends it before an epoch (training and dev evaluation) that would not fit."""
    budget = budget or Budget(config.time_budget)
    import torch

    seed = [config.seed, zlib.crc32(name.encode())]
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
    params = init_params(config.operator, vectors.shape[1], gen)
    opt = torch.optim.Adam(params.values(), lr=config.learning_rate)
    excl = _exclusions(train)
    raw = torch.from_numpy(vectors)
    candidates = _Candidates(raw, train, config, extra)
    if dev is not None:
        dev = sample_queries(dev, config.max_dev_queries, rng)

    def dev_mrr() -> float:
        return link_prediction(numpy_apply(params), vectors, dev, known)[0]["mrr"] if dev else float("nan")

    best = {"epoch": 0, "mrr": dev_mrr(), "params": {k: v.detach().clone() for k, v in params.items()}}
    history, stale, loss_value, t0 = [], 0, float("nan"), time.time()
    bar = _tqdm(total=config.epochs, desc=f"{name} ({config.operator})", unit="epoch", disable=not config.progress)
    bar.set_postfix(dev_mrr=f"{best['mrr']:.3f}")
    stopped_by = "epochs"
    for epoch in range(1, config.epochs + 1):
        if not budget.allows():
            stopped_by = "time budget"
            break
        t_epoch = budget.clock()
        loss_value = _epoch(params, opt, raw, train, candidates, excl, rng, config)
        mrr = dev_mrr()
        budget.unit_done(budget.clock() - t_epoch)
        history.append({"epoch": epoch, "loss": round(loss_value, 5), "dev_mrr": round(mrr, 5),
                        "seconds": round(budget.elapsed(), 1)})
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}", dev_mrr=f"{mrr:.3f}")
        if dev is None or mrr > best["mrr"]:
            best = {"epoch": epoch, "mrr": mrr, "params": {k: v.detach().clone() for k, v in params.items()}}
            stale = 0
        else:
            stale += 1
            if stale >= config.patience:
                stopped_by = "patience"
                break
    bar.close()
    info = {"epochs_run": len(history), "best_epoch": best["epoch"], "seconds": round(time.time() - t0, 1),
            "dev_mrr": None if dev is None else round(best["mrr"], 5), "stopped_by": stopped_by,
            **(budget.record() if config.time_budget else {}), "history": history}
    return {k: v.numpy().astype(np.float32) for k, v in best["params"].items()}, info


def _epoch(params: dict, opt, raw, train: RelationSplit, candidates: _Candidates, excl, rng: np.random.Generator,
           config: TrainConfig) -> float:
    """One epoch over ``train`` in an order drawn from ``rng``, a batch per optimiser step, each
    against its candidates (``excl``: the known answers masked out); returns the mean loss."""
    import torch

    order, losses = rng.permutation(len(train)), []
    for start in range(0, len(order), config.batch_size):
        batch = order[start:start + config.batch_size]
        cand_pos, cand_unit = candidates.for_batch(batch, rng)
        mask = torch.from_numpy(_mask(batch, excl, cand_pos, len(cand_unit)))
        q = forward(params, raw[train.head[batch]])
        loss = rse_loss(q, cand_unit, torch.from_numpy(cand_pos[train.tail[batch]]), mask, config.temperature)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return float(np.mean(losses)) if losses else float("nan")


def _load(files) -> list[Triple]:
    return [t for f in files for t in read_triples(f)]


def train_adapter(train_files, *, dev_files=(), test_files=(), config: TrainConfig = TrainConfig(),
                  encoder=None, descriptions: dict[str, str] | None = None, out=None,
                  candidates: list[str] | None = None) -> Bundle:
    """Train one operator per relation of ``train_files`` on a frozen encoder; return the bundle.

    ``encoder``: an :class:`~relsearch.encoder.model.Encoder` (default: the default encoder).
    Dev triples drive early stopping; test triples give ``operator.info["metrics"]`` for the trained
    operator and for identity. With ``out`` (the bundle's destination), each finished relation is
    checkpointed in ``OUT.checkpoint`` and a rerun with the same settings resumes after it.
    ``candidates``: more texts every relation's softmax contrasts against (e.g. all entity
    descriptions of a knowledge graph, the table its tails are later ranked in). A dev/test
    relation absent from training is an error.
    """
    if isinstance(train_files, (str, os.PathLike)):
        train_files = [train_files]
    if not train_files:
        raise ValueError("no training files given")
    budget = Budget(config.time_budget)  # shared by the relations, trained one after another
    loaded = {"train": _load(train_files), "dev": _load(dev_files), "test": _load(test_files)}
    if config.inverse:
        loaded = {k: with_inverses(v) for k, v in loaded.items()}
    wanted = relations_to_train(loaded, config.relations)
    if encoder is None:
        from ..model import Encoder, EncoderConfig

        encoder = Encoder(EncoderConfig())
    texts = text_ids(loaded, wanted, extra=candidates)
    extra = np.array([texts[x] for x in candidates], dtype=np.int64) if candidates else None
    vectors = encode_cached(encoder, list(texts), cache_dir=config.cache_dir, progress=config.progress)

    import torch

    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    # Resumable per relation: each finished operator is checkpointed; a rerun skips those.
    checkpoint = Checkpoint(out, dict(_hyper(config), data=[str(f) for f in train_files])) if out else None
    resumed = checkpoint.load() if checkpoint else None
    done = resumed["state"]["done"] if resumed else {}
    budget.spent = resumed["state"].get("elapsed", 0.0) if resumed else 0.0
    tensors = dict(resumed["tensors"]) if resumed else {}
    operators = {}
    try:
        for name in wanted:
            if name in done:
                params = {k.split("/", 1)[1]: v.numpy() for k, v in tensors.items() if k.split("/", 1)[0] == name}
                operators[name] = Operator(name=name, kind=config.operator, params=params, info=done[name],
                                           description=(descriptions or {}).get(name, ""))
                continue
            operators[name] = op = _train_operator(name, loaded, texts, vectors, config, descriptions, extra, budget)
            if checkpoint:
                done[name] = op.info
                tensors.update({f"{name}/{k}": torch.from_numpy(v) for k, v in op.params.items()})
                checkpoint.save({"done": done, "elapsed": budget.elapsed()}, tensors)
    finally:
        torch.set_num_threads(threads)
    return Bundle(encoder=dict(encoder.identity), operators=operators,
                  info={"trainer": "relsearch adapter (frozen encoder, RSE contrastive loss)",
                        "config": _hyper(config)})


def _train_operator(name, loaded, texts, vectors, config, descriptions, extra=None, budget=None) -> Operator:
    """Train, evaluate and describe the operator of one relation."""
    splits = relation_splits(loaded, name, texts)
    train, dev, test = splits["train"], splits["dev"], splits["test"]
    if len(train) == 0:
        raise ValueError(f"relation {name!r}: no usable training triples (all have head == tail)")
    known = true_tails(train, dev, test)
    params, info = _train_relation(name, vectors, train, dev if len(dev) else None, known, config, extra, budget)
    op = Operator(name=name, kind=config.operator, description=(descriptions or {}).get(name, ""), params=params)
    metrics = trained_vs_identity(op.apply, vectors, test, known)
    op.info = {
        "data": {s: {"files": v.files, "triples": len(v), "dropped_head_equals_tail": v.dropped_self,
                     **({"hard_negatives": int((v.neg >= 0).sum())} if s == "train" else {})}
                 for s, v in splits.items()},
        "hyperparameters": _hyper(config),
        "training": info,
        "metrics": metrics,
    }
    return op


def _hyper(config: TrainConfig) -> dict:
    return hyperparameters(config, lr=config.learning_rate)
