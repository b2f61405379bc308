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

Early stopping on the dev split's P@10 (AspectCSE protocol, :func:`aspect_retrieval_metrics`);
test P@10 / R@10 / MRR@10 of the operator and of identity go to ``op.info["metrics"]``.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, load_bundle
from ..metrics import aspect_retrieval_metrics
from ..relations import IDENTITY, Operator, normalize
from .cache import _tqdm, encode_cached
from .data import Labelled, read_labelled
from .loop import Checkpoint, EarlyStopping, seed_everything

COMBINE = ("separate", "union", "intersection")
REGIMES = ("adapter", "joint")
K = 10


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


def operator_name(fields: tuple[str, ...], combine: str) -> str:
    if len(fields) == 1:
        return f"aspect:{fields[0]}"
    return f"aspect:{'any' if combine == 'union' else 'all'}:{','.join(fields)}"


def relevance(docs: list[Labelled], fields: tuple[str, ...], combine: str):
    """``i -> (n,) bool``: documents relevant to document i (sharing a label; all or any of ``fields``)."""
    per_field = []
    for f in fields:
        vocab: dict[str, int] = {}
        rows = [[vocab.setdefault(x, len(vocab)) for x in d.labels[f]] for d in docs]
        onehot = np.zeros((len(docs), len(vocab)), dtype=bool)
        for i, r in enumerate(rows):
            onehot[i, r] = True
        per_field.append(onehot)

    def relevant_to(i: int) -> np.ndarray:
        shares = [(m & m[i]).any(axis=1) for m in per_field]
        return np.logical_and.reduce(shares) if combine == "intersection" else np.logical_or.reduce(shares)

    return relevant_to


def _splits(train_files, dev_files, test_files, config: AspectConfig) -> dict[str, list[Labelled]]:
    if not config.split_field:
        return {"train": _load(train_files, config), "dev": _load(dev_files, config),
                "test": _load(test_files, config)}
    if dev_files or test_files:
        raise ValueError("give either --split-field (one corpus with train/dev/test rows) or --dev/--test files")
    return {s: _load(train_files, config, s) for s in ("train", "dev", "test")}


def _load(files, config: AspectConfig, split: str | None = None) -> list[Labelled]:
    """Documents of ``files`` (only the rows of ``split`` when given), exact duplicate texts dropped."""
    docs, seen = [], set()
    for f in files:
        try:
            found = read_labelled(f, config.aspects, text_field=config.text_field, split=split)[0]
        except ValueError as e:
            if split in (None, "train") or "no record has a text" not in str(e):
                raise
            found = []  # a corpus without dev/test rows: no early stopping / no test metrics
        for d in found:
            if d.text not in seen:  # an exact duplicate would be a trivial positive
                seen.add(d.text)
                docs.append(d)
    return docs


def _metrics(op: Operator, vectors: np.ndarray, docs, fields, combine) -> dict:
    q, d = op.apply(vectors), op.documents(normalize(vectors))
    m = aspect_retrieval_metrics(lambda a, b: q[a:b] @ d.T, relevance(docs, fields, combine), K)
    return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in m.items()}


def train_aspects(train_files, *, dev_files=(), test_files=(), config: AspectConfig, base=None,
                  out=None) -> tuple[Bundle, object]:
    """Train aspect operators; returns (bundle, fine-tuned TrainableEncoder or None).

    ``base``: None (the default pack), a model id/path or a bundle (its encoder; in the adapter
    regime its operators and re-ranking heads are kept). ``out``: where the bundle will go — its checkpoint lives beside it (``OUT.checkpoint``).
    """
    from ..model import Encoder, EncoderConfig

    splits = _splits(list(train_files), list(dev_files), list(test_files), config)
    if len(splits["train"]) < 2:
        raise ValueError("fewer than 2 training documents with a text and every aspect label")
    base_bundle = load_bundle(base) if base else load_bundle(None)
    groups = [config.aspects] if config.combine != "separate" else [(f,) for f in config.aspects]
    combine = config.combine if config.combine != "separate" else "union"
    checkpoint = Checkpoint(out, _hyper(config)) if out else None
    if config.regime == "joint":
        return _train_joint(splits, groups[0], combine, config, base_bundle, checkpoint)

    encoder = Encoder(EncoderConfig(model=base_bundle.encoder["model"], max_length=base_bundle.encoder.get("max_length")))
    docs = splits["train"] + splits["dev"] + splits["test"]
    vectors = encode_cached(encoder, [d.text for d in docs], cache_dir=config.cache_dir, progress=config.progress)
    n_tr, n_dv = len(splits["train"]), len(splits["dev"])
    vec = {"train": vectors[:n_tr], "dev": vectors[n_tr:n_tr + n_dv], "test": vectors[n_tr + n_dv:]}
    operators = {name: op for name, op in base_bundle.operators.items()}
    for fields in groups:
        op = _train_adapter(fields, combine, splits, vec, config, checkpoint)
        operators[op.name] = op
    # the base's re-ranking heads stay valid with its operators (the encoder is unchanged), and
    # operator descriptions name them (e.g. "re-rank with --rerank pu-head")
    return Bundle(encoder=dict(encoder.identity), operators=operators, heads=dict(base_bundle.heads),
                  info={"trainer": "relsearch aspect (AspectCSE, adapter)", "config": _hyper(config)}), None


def _train_adapter(fields, combine, splits, vec, config: AspectConfig, checkpoint) -> Operator:
    import torch
    import torch.nn.functional as F

    name = operator_name(fields, combine)
    seed_everything(config.seed)
    rng = np.random.default_rng(config.seed)
    train = splits["train"]
    relevant_to = relevance(train, fields, combine)
    raw = torch.from_numpy(vec["train"])
    unit = F.normalize(raw, dim=-1)
    d = raw.shape[1]
    # --project: P on both sides, no bias (normalize(P t̂) must not depend on ‖h_t‖); else query-side W h + b
    W, b = torch.eye(d).requires_grad_(), torch.zeros(d).requires_grad_(not config.project)
    opt = torch.optim.Adam([W, b] if not config.project else [W], lr=config.learning_rate)
    kind = "projection" if config.project else "linear"
    anchors = np.array([i for i in range(len(train)) if relevant_to(i).sum() > 1])  # has a positive besides itself
    if not len(anchors):
        raise ValueError(f"{name}: no training document shares its label with another one")

    def current(W_, b_) -> Operator:
        params = {"P": W_.detach().numpy().copy()} if config.project else \
            {"W": W_.detach().numpy().copy(), "b": b_.detach().numpy().copy()}
        return Operator(name=name, kind=kind, params=params)

    def dev_score() -> float:
        if len(splits["dev"]) < 2:
            return float("nan")
        return _metrics(current(W, b), vec["dev"], splits["dev"], fields, combine)[f"p@{K}"]

    stopper, start_epoch, history = EarlyStopping(config.patience), 1, []
    best = (W.detach().clone(), b.detach().clone())
    resumed = checkpoint.load() if checkpoint else None
    if resumed and resumed["state"].get("operator") == name:
        W.data.copy_(resumed["tensors"]["W"])
        b.data.copy_(resumed["tensors"]["b"])
        best = (resumed["tensors"]["best_W"], resumed["tensors"]["best_b"])
        opt.load_state_dict(resumed["optimizer"])
        stopper.restore(resumed["state"]["stopper"])
        start_epoch, history = resumed["state"]["epoch"] + 1, resumed["state"]["history"]
    else:
        stopper.update(dev_score(), 0)
    bar = _tqdm(total=config.epochs, initial=start_epoch - 1, desc=f"{name} (adapter)", unit="epoch",
                disable=not config.progress)
    t0 = time.time()
    for epoch in range(start_epoch, config.epochs + 1):
        if stopper.stale >= config.patience:
            break
        order = np.random.default_rng([config.seed, epoch]).permutation(anchors)  # resumable: per-epoch seed
        losses = []
        for s in range(0, len(order), config.batch_size):
            batch = order[s:s + config.batch_size]
            rel = torch.from_numpy(np.stack([relevant_to(i) for i in batch]))
            rel[torch.arange(len(batch)), torch.from_numpy(batch)] = False
            cand = torch.arange(len(train))
            if len(train) > config.max_candidates:  # sampled softmax; keep one positive per anchor
                pos = [int(rng.choice(np.flatnonzero(r))) for r in rel.numpy()]
                cand = torch.from_numpy(np.unique(np.concatenate(
                    [rng.choice(len(train), config.max_candidates, replace=False), pos, batch])))
            q = F.normalize(raw[batch] @ W.T + b, dim=-1)
            docs = F.normalize(unit[cand] @ W.T, dim=-1) if config.project else unit[cand]
            logits = (q @ docs.T) / config.temperature
            self_mask = cand[None, :] == torch.from_numpy(batch)[:, None]
            logits = logits.masked_fill(self_mask, float("-inf"))
            rel_c = rel[:, cand]
            loss = (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~rel_c, float("-inf")), 1)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        score = dev_score()
        history.append({"epoch": epoch, "loss": round(float(np.mean(losses)), 5), f"dev_p@{K}": round(score, 5)})
        if np.isnan(score) or stopper.improved(score):
            best = (W.detach().clone(), b.detach().clone())
        if not np.isnan(score):
            stopper.update(score, epoch)
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", dev_p10=f"{score:.3f}")
        if checkpoint:
            checkpoint.save({"operator": name, "epoch": epoch, "history": history, "stopper": stopper.state()},
                            {"W": W, "b": b, "best_W": best[0], "best_b": best[1]}, opt)
    bar.close()
    op = current(*best)
    op.description = _describe(fields, combine) + (" (projection: documents too, its own index)"
                                                   if config.project else "")
    op.info = _op_info(op, splits, vec, fields, combine, config, {
        "epochs_run": len(history), "best_epoch": stopper.best_step, "seconds": round(time.time() - t0, 1),
        f"dev_p@{K}": stopper.best, "history": history})
    return op


def _describe(fields, combine) -> str:
    joiner = " and " if combine == "intersection" else " or "
    return "documents with the same " + joiner.join(fields)


def _op_info(op, splits, vec, fields, combine, config, training: dict) -> dict:
    metrics = {"split": "test", "protocol": f"AspectCSE same-label retrieval on the test documents, k = {K}",
               "metric": f"p@{K}"}
    if len(splits["test"]) >= 2:
        for label, scorer in (("trained", op), ("identity", IDENTITY)):
            m = _metrics(scorer, vec["test"], splits["test"], fields, combine)
            metrics["queries"], metrics["candidates"] = m.pop("seeds"), len(splits["test"])
            m.pop("seeds_without_relevant")
            metrics[label] = m
    return {"aspects": list(fields), "combine": combine, "regime": config.regime,
            "data": {s: {"documents": len(v)} for s, v in splits.items()},
            "hyperparameters": _hyper(config), "training": training, "metrics": metrics}


def _hyper(config: AspectConfig) -> dict:
    d = dataclasses.asdict(config)
    d["lr"] = config.learning_rate
    for k in ("cache_dir", "progress", "threads"):
        d.pop(k)
    d["aspects"] = list(d["aspects"])
    return d


# ------------------------------------------------------------------------------------ joint regime
def _train_joint(splits, fields, combine, config: AspectConfig, base_bundle: Bundle, checkpoint):
    import torch
    import torch.nn.functional as F

    from .finetune import TrainableEncoder, chunked_backward

    name = operator_name(fields, combine)
    seed_everything(config.seed)
    encoder = TrainableEncoder(base_bundle.encoder["model"], max_length=config.max_length)
    train = splits["train"]
    relevant_to = relevance(train, fields, combine)
    texts = [d.text for d in train]
    opt = torch.optim.AdamW(encoder.parameters(), lr=config.learning_rate, weight_decay=0.0)
    epochs = config.epochs
    stopper, start_epoch, history = EarlyStopping(config.patience), 1, []

    def dev_score() -> float:
        if len(splits["dev"]) < 2:
            return float("nan")
        v = encoder.embed([d.text for d in splits["dev"]])
        return _metrics(IDENTITY, v, splits["dev"], fields, combine)[f"p@{K}"]

    resumed = checkpoint.load() if checkpoint else None
    best_state = None
    if resumed:
        encoder.load_state_dict({k[len("model."):]: v for k, v in resumed["tensors"].items() if k.startswith("model.")})
        best_state = {k[len("best."):]: v for k, v in resumed["tensors"].items() if k.startswith("best.")} or None
        opt.load_state_dict(resumed["optimizer"])
        stopper.restore(resumed["state"]["stopper"])
        start_epoch, history = resumed["state"]["epoch"] + 1, resumed["state"]["history"]
    else:
        stopper.update(dev_score(), 0)
    t0 = time.time()
    steps = -(-len(train) // config.batch_size)
    bar = _tqdm(total=epochs * steps, initial=(start_epoch - 1) * steps, desc=f"{name} (joint)", unit="step",
                disable=not config.progress)
    encoder.train()
    for epoch in range(start_epoch, epochs + 1):
        if stopper.stale >= config.patience:
            break
        rng = random.Random(f"{config.seed}-{epoch}")
        order = list(range(len(train)))
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
            cands = pos + neg
            # false negatives: candidates relevant to the anchor other than its own positive
            false_negatives = np.stack([r[cands] for r in rel])
            np.fill_diagonal(false_negatives, False)
            mask = torch.as_tensor(false_negatives, device=encoder.device)  # where the encoder's outputs are
            labels = torch.arange(len(batch), device=encoder.device)

            def loss_fn(a, p, n):
                logits = F.normalize(a, dim=-1) @ F.normalize(torch.cat([p, n]), dim=-1).T / config.temperature
                return F.cross_entropy(logits.masked_fill(mask, float("-inf")), labels)

            opt.zero_grad()
            losses.append(chunked_backward(encoder, [[texts[i] for i in batch], [texts[i] for i in pos],
                                                     [texts[i] for i in neg]], loss_fn, chunk=config.chunk))
            opt.step()
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        score = dev_score()
        encoder.train()
        history.append({"epoch": epoch, "loss": round(float(np.mean(losses)), 5), f"dev_p@{K}": round(score, 5)})
        if np.isnan(score) or stopper.improved(score):
            best_state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        if not np.isnan(score):
            stopper.update(score, epoch)
        if checkpoint:
            tensors = {f"model.{k}": v for k, v in encoder.state_dict().items()}
            tensors.update({f"best.{k}": v for k, v in (best_state or {}).items()})
            checkpoint.save({"epoch": epoch, "history": history, "stopper": stopper.state()}, tensors, opt)
    bar.close()
    if best_state is not None:
        encoder.load_state_dict(best_state)
    # Trained on short windows for speed; queries and indexing use the base encoder's full window.
    encoder.max_length = base_bundle.encoder.get("max_length") or encoder.max_length
    op = Operator(name=name, kind="identity", description=_describe(fields, combine) + " (fine-tuned encoder)")
    vec = {}
    if len(splits["test"]) >= 2:
        vec["test"] = encoder.embed([d.text for d in splits["test"]])
    op.info = _op_info(op, splits, vec, fields, combine, config, {
        "epochs_run": len(history), "best_epoch": stopper.best_step, "seconds": round(time.time() - t0, 1),
        f"dev_p@{K}": stopper.best, "history": history})
    if "metrics" in op.info and "identity" in op.info["metrics"]:  # identity = the base encoder, unchanged
        from ..model import Encoder, EncoderConfig

        base = Encoder(EncoderConfig(model=base_bundle.encoder["model"], max_length=encoder.max_length))
        h = base.encode([d.text for d in splits["test"]]).vectors
        op.info["metrics"]["identity"] = _strip(_metrics(IDENTITY, h, splits["test"], fields, combine))
        op.info["metrics"]["identity_note"] = "identity = the base encoder before fine-tuning"
    # the base bundle's other operators were trained for the old encoder: they do not carry over
    operators = {"identity": base_bundle.operators["identity"], name: op}
    return Bundle(encoder={}, operators=operators,
                  info={"trainer": "relsearch aspect (AspectCSE, joint)", "config": _hyper(config)}), encoder


def _strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("seeds", "seeds_without_relevant")}
