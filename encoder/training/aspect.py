"""Aspect embeddings (AspectCSE, design.md §4): "near in one aspect" — same sector, same industry.

From a labelled corpus (``{"text", FIELD: label or [labels]}``): for an anchor document, documents
sharing its aspect label are positives and the rest negatives. One operator per aspect field
(``aspect:FIELD``), or, with ``combine``, one operator for several fields: ``union`` (relevant =
shares any of the fields' labels, named ``aspect:any:F1,F2``) or ``intersection`` (shares all,
``aspect:all:F1,F2``).

Regimes:

- ``adapter`` — frozen encoder, a linear operator per aspect on the query side (W = I, b = 0 at
  start, so epoch 0 is identity), trained on cached vectors with a multi-positive contrastive loss
  over the whole training table: −log Σ_{p relevant} e^{cos(Wh, t_p)/τ} / Σ_m e^{cos(Wh, t_m)/τ}.
  Documents in an index are unchanged, so the index stays valid.
- ``adapter`` with ``project`` — a both-sides projection P (identity start, no bias): the score is
  cos(P h_q, P h_t), so documents change too; the searcher builds the projected copy of the index
  (normalize(P t̂) for every stored t̂) on first use and searches it exactly (kind ``projection``).
- ``joint`` — the encoder itself is fine-tuned (AspectCSE proper): anchor, one positive, one hard
  negative (different label) per item, the batch's other positives and negatives as in-batch
  negatives, same-label items masked out of each other's negatives; gradient caching for big
  batches. The operator is then plain cosine in the new space (kind ``identity`` under the
  aspect's name) and the corpus must be re-indexed with the bundle.

Early stopping on the dev split's P@10 (AspectCSE protocol, :func:`.aspect_data.aspect_metrics`);
test P@10 / R@10 / MRR@10 of the operator and of identity go to ``op.info["metrics"]``.
Data and evaluation live in :mod:`.aspect_data`, the joint regime in :mod:`.aspect_joint`; this
module holds the config, the entry point and the adapter regime.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, load_bundle
from ..relations import Operator
from .aspect_data import K, describe, load_splits, operator_info, operator_name, record, relevance
# dev scoring looks _metrics up in this module at each call, so a test can interrupt a run through it
from .aspect_data import aspect_metrics as _metrics
from .cache import _tqdm, encode_cached
from .loop import Budget, Checkpoint, EarlyStopping, seed_everything

__all__ = ["AspectConfig", "operator_name", "relevance", "train_aspects"]

COMBINE = ("separate", "union", "intersection")
REGIMES = ("adapter", "joint")


@dataclass(frozen=True, kw_only=True)
class AspectConfig:
    aspects: tuple[str, ...]
    combine: str = "separate"  # several aspects: one operator each, or one for their union / intersection
    regime: str = "adapter"
    text_field: str = "text"
    split_field: str | None = None  # one corpus file holding train/dev/test rows (e.g. "split")
    epochs: int = 30  # adapter; joint default is 1 (see epochs_for)
    patience: int = 4
    batch_size: int = 256  # adapter anchors per step; joint anchors per step (each brings 2 more texts)
    lr: float | None = None  # adapter 3e-3, joint (encoder) 2e-5
    temperature: float = 0.05
    max_candidates: int = 8192
    project: bool = False  # adapter: a both-sides projection P (searched in its own projected index)
    max_length: int = 128  # joint: tokens per description while fine-tuning
    chunk: int = 32  # joint: texts per gradient-cache chunk
    seed: int = 13
    threads: int | None = None
    cache_dir: str | None = None
    progress: bool = True
    time_budget: float | None = None  # minutes for the whole run (a run option: not in the hyperparameter record)

    def __post_init__(self):
        if not self.aspects:
            raise ValueError("name at least one aspect field (--aspect FIELD)")
        if self.combine not in COMBINE:
            raise ValueError(f"unknown combine {self.combine!r}; choose one of {', '.join(COMBINE)}")
        if self.regime not in REGIMES:
            raise ValueError(f"unknown regime {self.regime!r}; choose one of {', '.join(REGIMES)}")
        if self.combine != "separate" and len(self.aspects) < 2:
            raise ValueError(f"--combine {self.combine} needs at least two --aspect fields")
        if self.project and self.regime == "joint":
            raise ValueError("--project learns a projection on a frozen encoder (adapter regime); the joint regime "
                             "already changes documents and queries alike")
        if self.regime == "joint" and self.combine == "separate" and len(self.aspects) > 1:
            raise ValueError("the joint regime fine-tunes one encoder: train one aspect, or combine them "
                             "(--combine union|intersection)")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (3e-3 if self.regime == "adapter" else 2e-5)


def train_aspects(train_files, *, dev_files=(), test_files=(), config: AspectConfig, base=None,
                  out=None) -> tuple[Bundle, object]:
    """Train aspect operators; returns (bundle, fine-tuned TrainableEncoder or None).

    ``base``: None (the default pack), a model id/path or a bundle (its encoder; in the adapter
    regime its operators and re-ranking heads are kept). ``out``: where the bundle will go — its
    checkpoint lives beside it (``OUT.checkpoint``).
    """
    from ..model import Encoder, EncoderConfig

    budget = Budget(config.time_budget)
    splits = load_splits(list(train_files), list(dev_files), list(test_files), config)
    if len(splits["train"]) < 2:
        raise ValueError("fewer than 2 training documents with a text and every aspect label")
    base_bundle = load_bundle(base) if base else load_bundle(None)
    groups = [config.aspects] if config.combine != "separate" else [(f,) for f in config.aspects]
    combine = config.combine if config.combine != "separate" else "union"
    checkpoint = Checkpoint(out, record(config)) if out else None
    if config.regime == "joint":
        from .aspect_joint import train_joint_aspect

        return train_joint_aspect(splits, groups[0], combine, config, base_bundle, checkpoint, budget)

    base_encoder = base_bundle.encoder
    encoder = Encoder(EncoderConfig(model=base_encoder["model"], max_length=base_encoder.get("max_length")))
    docs = splits["train"] + splits["dev"] + splits["test"]
    vectors = encode_cached(encoder, [d.text for d in docs], cache_dir=config.cache_dir, progress=config.progress)
    n_tr, n_dv = len(splits["train"]), len(splits["dev"])
    vec = {"train": vectors[:n_tr], "dev": vectors[n_tr:n_tr + n_dv], "test": vectors[n_tr + n_dv:]}
    operators = {name: op for name, op in base_bundle.operators.items()}
    for fields in groups:
        op = _train_adapter(fields, combine, splits, vec, config, checkpoint, budget)
        operators[op.name] = op
    # the base's re-ranking heads stay valid with its operators (the encoder is unchanged), and
    # operator descriptions name them (e.g. "re-rank with --rerank pu-head")
    return Bundle(encoder=dict(encoder.identity), operators=operators, heads=dict(base_bundle.heads),
                  info={"trainer": "relsearch aspect (AspectCSE, adapter)", "config": record(config)}), None


def _train_adapter(fields, combine, splits, vec, config: AspectConfig, checkpoint, budget: Budget | None = None) -> Operator:
    import torch
    import torch.nn.functional as F

    name = operator_name(fields, combine)
    seed_everything(config.seed)
    rng = np.random.default_rng(config.seed)
    train = splits["train"]
    relevant_to = relevance(train, fields, combine)
    raw = torch.from_numpy(vec["train"])
    unit = F.normalize(raw, dim=-1)
    # --project: P on both sides, no bias (normalize(P t̂) must not depend on ‖h_t‖); else query-side W h + b
    W, b = torch.eye(raw.shape[1]).requires_grad_(), torch.zeros(raw.shape[1]).requires_grad_(not config.project)
    opt = torch.optim.Adam([W, b] if not config.project else [W], lr=config.learning_rate)
    anchors = np.array([i for i in range(len(train)) if relevant_to(i).sum() > 1])  # has a positive besides itself
    if not len(anchors):
        raise ValueError(f"{name}: no training document shares its label with another one")

    def dev_score() -> float:
        if len(splits["dev"]) < 2:
            return float("nan")
        return _metrics(_as_operator(name, W, b, config.project), vec["dev"], splits["dev"], fields, combine)[f"p@{K}"]

    budget = budget or Budget(config.time_budget)
    stopper, stopped_by = EarlyStopping(config.patience), "epochs"
    resumed = _resume(checkpoint, name, W, b, opt, stopper, budget)
    if resumed is None:
        stopper.update(dev_score(), 0)
    best, start_epoch, history = resumed or ((W.detach().clone(), b.detach().clone()), 1, [])
    bar = _tqdm(total=config.epochs, initial=start_epoch - 1, desc=f"{name} (adapter)", unit="epoch",
                disable=not config.progress)
    t0 = time.time()
    for epoch in range(start_epoch, config.epochs + 1):
        if stopper.stale >= config.patience:
            stopped_by = "patience"
            break
        if not budget.allows():  # an epoch and its dev evaluation must fit
            stopped_by = "time budget"
            break
        t_epoch = budget.clock()
        order = np.random.default_rng([config.seed, epoch]).permutation(anchors)  # resumable: per-epoch seed
        loss = _adapter_epoch(order, relevant_to, raw, unit, W, b, rng, config, opt)
        score = dev_score()
        budget.unit_done(budget.clock() - t_epoch)
        history.append({"epoch": epoch, "loss": round(loss, 5), f"dev_p@{K}": round(score, 5),
                        "seconds": round(budget.elapsed(), 1)})
        if np.isnan(score) or stopper.improved(score):
            best = (W.detach().clone(), b.detach().clone())
        if not np.isnan(score):
            stopper.update(score, epoch)
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", dev_p10=f"{score:.3f}")
        if checkpoint:
            checkpoint.save({"operator": name, "epoch": epoch, "history": history, "stopper": stopper.state(),
                             "elapsed": budget.elapsed()}, {"W": W, "b": b, "best_W": best[0], "best_b": best[1]}, opt)
    bar.close()
    return _adapter_operator(name, best, fields, combine, splits, vec, config, {
        "epochs_run": len(history), "best_epoch": stopper.best_step, "seconds": round(time.time() - t0, 1),
        f"dev_p@{K}": stopper.best, "stopped_by": stopped_by, **(budget.record() if config.time_budget else {}),
        "history": history})


def _adapter_operator(name: str, best: tuple, fields, combine, splits, vec, config: AspectConfig,
                      training: dict) -> Operator:
    """The operator of the ``best`` (W, b), described, with its figures and ``training``'s record in its info."""
    op = _as_operator(name, *best, config.project)
    op.description = describe(fields, combine) + (" (projection: documents too, its own index)"
                                                   if config.project else "")
    op.info = operator_info(op, splits, vec, fields, combine, config, training)
    return op


def _resume(checkpoint, name: str, W, b, opt, stopper: EarlyStopping, budget: Budget) -> tuple | None:
    """Restore operator ``name``'s training from ``checkpoint`` into ``W``, ``b``, ``opt``,
    ``stopper`` and ``budget``: returns its best (W, b), the next epoch and the history so far; None
    when the checkpoint holds no run of it."""
    resumed = checkpoint.load() if checkpoint else None
    if not (resumed and resumed["state"].get("operator") == name):
        return None
    W.data.copy_(resumed["tensors"]["W"])
    b.data.copy_(resumed["tensors"]["b"])
    opt.load_state_dict(resumed["optimizer"])
    stopper.restore(resumed["state"]["stopper"])
    budget.spent = resumed["state"].get("elapsed", 0.0)
    best = (resumed["tensors"]["best_W"], resumed["tensors"]["best_b"])
    return best, resumed["state"]["epoch"] + 1, resumed["state"]["history"]


def _adapter_epoch(order: np.ndarray, relevant_to, raw, unit, W, b, rng, config: AspectConfig, opt) -> float:
    """One epoch over the anchors in ``order``, a batch per optimiser step; returns the mean loss."""
    losses = []
    for s in range(0, len(order), config.batch_size):
        loss = _adapter_loss(order[s:s + config.batch_size], relevant_to, raw, unit, W, b, rng, config)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def _as_operator(name: str, W, b, project: bool) -> Operator:
    """The operator of parameters W, b (torch): a both-sides projection P = W, or the query-side W h + b."""
    if project:
        return Operator(name=name, kind="projection", params={"P": W.detach().numpy().copy()})
    return Operator(name=name, kind="linear", params={"W": W.detach().numpy().copy(), "b": b.detach().numpy().copy()})


def _adapter_loss(batch: np.ndarray, relevant_to, raw, unit, W, b, rng: np.random.Generator, config: AspectConfig):
    """Multi-positive contrastive loss of anchors ``batch`` against the training table (module docstring)."""
    import torch
    import torch.nn.functional as F

    n = len(raw)
    rel = torch.from_numpy(np.stack([relevant_to(i) for i in batch]))
    rel[torch.arange(len(batch)), torch.from_numpy(batch)] = False
    cand = torch.arange(n)
    if n > config.max_candidates:  # sampled softmax; keep one positive per anchor
        pos = [int(rng.choice(np.flatnonzero(r))) for r in rel.numpy()]
        cand = torch.from_numpy(np.unique(np.concatenate([rng.choice(n, config.max_candidates, replace=False),
                                                          pos, batch])))
    q = F.normalize(raw[batch] @ W.T + b, dim=-1)
    docs = F.normalize(unit[cand] @ W.T, dim=-1) if config.project else unit[cand]
    logits = (q @ docs.T) / config.temperature
    self_mask = cand[None, :] == torch.from_numpy(batch)[:, None]
    logits = logits.masked_fill(self_mask, float("-inf"))
    relevant = logits.masked_fill(~rel[:, cand], float("-inf"))
    return (torch.logsumexp(logits, 1) - torch.logsumexp(relevant, 1)).mean()
