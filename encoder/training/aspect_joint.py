"""AspectCSE's joint regime: the encoder itself is fine-tuned so that same-label documents are near.

Per step: anchors, one positive (same label) and one hard negative (different label) each, the
batch's other positives and negatives as in-batch negatives, same-label candidates masked out of
an anchor's negatives; gradient caching for big batches (:func:`.finetune.chunked_backward`). The
operator is then plain cosine in the new space (kind ``identity`` under the aspect's name) and the
corpus must be re-indexed with the bundle. Called by :func:`.aspect.train_aspects`.
"""
from __future__ import annotations

import random
import time

import numpy as np

from ..bundle import Bundle
from ..relations import IDENTITY, Operator
from .aspect_data import K, aspect_metrics, describe, operator_info, operator_name, record, relevance
from .cache import _tqdm
from .loop import Budget, EarlyStopping, seed_everything


def train_joint_aspect(splits, fields, combine, config, base_bundle: Bundle, checkpoint, budget: Budget | None = None):
    """Fine-tune the encoder for one aspect (or combination); returns (bundle, TrainableEncoder).
    ``budget`` (``--time-budget``) ends the run before an epoch and its dev evaluation would overrun it."""
    import torch

    from .finetune import TrainableEncoder

    name = operator_name(fields, combine)
    seed_everything(config.seed)
    encoder = TrainableEncoder(base_bundle.encoder["model"], max_length=config.max_length)
    opt = torch.optim.AdamW(encoder.parameters(), lr=config.learning_rate, weight_decay=0.0)
    stopper = EarlyStopping(config.patience)
    budget, stopped_by = budget or Budget(config.time_budget), "epochs"

    def dev_score() -> tuple[float, float]:
        """Dev P@K and a bound on its standard error: √(p(1−p)/queries), the largest a mean of per-query
        precisions in [0, 1] can have (so the noise margin of early stopping errs toward training on)."""
        if len(splits["dev"]) < 2:
            return float("nan"), float("nan")
        v = encoder.embed([d.text for d in splits["dev"]])
        m = aspect_metrics(IDENTITY, v, splits["dev"], fields, combine)
        p = m[f"p@{K}"]
        return p, float(np.sqrt(p * (1 - p) / m["seeds"])) if m["seeds"] else 0.0

    resumed = _resume(checkpoint, encoder, opt, stopper, budget)
    if resumed is None:
        start, se = dev_score()
        stopper.update(start, 0, se)
    best_state, start_epoch, history = resumed or (None, 1, [])
    t0 = time.time()
    train = splits["train"]
    steps = -(-len(train) // config.batch_size)
    bar = _tqdm(total=config.epochs * steps, initial=(start_epoch - 1) * steps, desc=f"{name} (joint)", unit="step",
                disable=not config.progress)
    encoder.train()
    relevant_to = relevance(train, fields, combine)
    for epoch in range(start_epoch, config.epochs + 1):
        if stopper.stale >= config.patience:
            stopped_by = "patience"
            break
        if not budget.allows():  # an epoch and its dev evaluation must fit
            stopped_by = "time budget"
            break
        t_epoch = budget.clock()
        losses = _epoch(encoder, opt, [d.text for d in train], relevant_to, config, epoch, bar)
        score, se = dev_score()
        encoder.train()
        budget.unit_done(budget.clock() - t_epoch)
        if np.isnan(score) or stopper.improved(score):
            best_state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        if not np.isnan(score):
            stopper.update(score, epoch, se)  # stale only 2 SE below the best
        history.append({"epoch": epoch, "loss": round(float(np.mean(losses)), 5), f"dev_p@{K}": round(score, 5),
                        f"dev_p@{K}_se": round(se, 5), "stale": stopper.counted, "seconds": round(budget.elapsed(), 1)})
        if checkpoint:
            _save(checkpoint, encoder, opt, best_state, {"epoch": epoch, "history": history,
                                                         "stopper": stopper.state(), "elapsed": budget.elapsed()})
    bar.close()
    if best_state is not None:
        encoder.load_state_dict(best_state)
    training = {"epochs_run": len(history), "best_epoch": stopper.best_step, "seconds": round(time.time() - t0, 1),
                f"dev_p@{K}": stopper.best, "stopped_by": stopped_by, "precision": encoder.precision,
                **(budget.record() if config.time_budget else {}), "history": history}
    return _bundle(encoder, name, splits, fields, combine, config, base_bundle, training), encoder


def _resume(checkpoint, encoder, opt, stopper: EarlyStopping, budget: Budget) -> tuple | None:
    """Restore a run from ``checkpoint`` into ``encoder``, ``opt``, ``stopper`` and ``budget``:
    returns its best weights (None: none yet), the next epoch and the history; None without one."""
    resumed = checkpoint.load() if checkpoint else None
    if not resumed:
        return None
    tensors = resumed["tensors"]
    encoder.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    best_state = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")} or None
    opt.load_state_dict(resumed["optimizer"])
    stopper.restore(resumed["state"]["stopper"])
    budget.spent = resumed["state"].get("elapsed", 0.0)
    return best_state, resumed["state"]["epoch"] + 1, resumed["state"]["history"]


def _save(checkpoint, encoder, opt, best_state: dict | None, state: dict) -> None:
    """Save the encoder's weights, the best ones so far, the optimiser and ``state`` to ``checkpoint``."""
    tensors = {f"model.{k}": v for k, v in encoder.state_dict().items()}
    tensors.update({f"best.{k}": v for k, v in (best_state or {}).items()})
    checkpoint.save(state, tensors, opt)


def _epoch(encoder, opt, texts: list[str], relevant_to, config, epoch: int, bar) -> list[float]:
    """One epoch of steps (order, positives and negatives drawn from ``(seed, epoch)``); returns the losses."""
    import torch
    import torch.nn.functional as F

    from .finetune import chunked_backward

    rng = random.Random(f"{config.seed}-{epoch}")
    order = list(range(len(texts)))
    rng.shuffle(order)
    losses = []
    for s in range(0, len(order), config.batch_size):
        batch = order[s:s + config.batch_size]
        rel = [relevant_to(i) for i in batch]
        pos, neg = [], []
        for i, r in zip(batch, rel):
            r = r.copy()
            r[i] = False
            pos.append(int(rng.choice(np.flatnonzero(r))) if r.any() else i)
            neg.append(int(rng.choice(np.flatnonzero(~relevant_to(i)))))
        # false negatives: candidates relevant to the anchor other than its own positive
        false_negatives = np.stack([r[pos + neg] for r in rel])
        np.fill_diagonal(false_negatives, False)
        mask = torch.as_tensor(false_negatives, device=encoder.device)  # where the encoder's outputs are
        labels = torch.arange(len(batch), device=encoder.device)

        def loss_fn(a, p, n, mask=mask, labels=labels):
            logits = F.normalize(a, dim=-1) @ F.normalize(torch.cat([p, n]), dim=-1).T / config.temperature
            return F.cross_entropy(logits.masked_fill(mask, float("-inf")), labels)

        opt.zero_grad()
        losses.append(chunked_backward(encoder, [[texts[i] for i in batch], [texts[i] for i in pos],
                                                 [texts[i] for i in neg]], loss_fn, chunk=config.chunk))
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    return losses


def _bundle(encoder, name, splits, fields, combine, config, base_bundle: Bundle, training: dict) -> Bundle:
    """The aspect's operator (plain cosine in the new space) with its test metrics against the base encoder."""
    # Trained on short windows for speed; queries and indexing use the base encoder's full window.
    encoder.max_length = base_bundle.encoder.get("max_length") or encoder.max_length
    op = Operator(name=name, kind="identity", description=describe(fields, combine) + " (fine-tuned encoder)")
    vec = {}
    if len(splits["test"]) >= 2:
        vec["test"] = encoder.embed([d.text for d in splits["test"]])
    op.info = operator_info(op, splits, vec, fields, combine, config, training)
    if "metrics" in op.info and "identity" in op.info["metrics"]:  # identity = the base encoder, unchanged
        from ..model import Encoder

        base = Encoder(base_bundle.encoder_config(max_length=encoder.max_length))
        h = base.encode([d.text for d in splits["test"]]).vectors
        op.info["metrics"]["identity"] = _strip(aspect_metrics(IDENTITY, h, splits["test"], fields, combine))
        op.info["metrics"]["identity_note"] = "identity = the base encoder before fine-tuning"
    # the base bundle's other operators were trained for the old encoder: they do not carry over
    operators = {"identity": base_bundle.operators["identity"], name: op}
    return Bundle(encoder={}, operators=operators,
                  info={"trainer": "relsearch aspect (AspectCSE, joint)", "config": record(config)})


def _strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("seeds", "seeds_without_relevant")}
