"""PU learning on partly labelled pairs (PAUSE, design.md §4): a pair head + an ANN operator.

Data: pairs JSONL ``{"a", "b"[, "label"]}`` (:func:`~.data.read_pairs`); a pair without a label is
*unlabelled*. The K classes are the sorted distinct labels of the training file; ``positive`` names
the class whose probability is the re-ranking score (and whose test pairs measure the operator).

Model (PAUSE): a shared-weight dual encoder with masked mean pooling gives h_a, h_b; a projection P
(d×d, identity at start, shared by both sides) gives u = P h_a, v = P h_b; the head maps
[u; v; |u−v|; u⊙v] → Linear(4d, 128) → ELU → Linear(128, K). Regimes:

- ``adapter`` (default): the encoder is frozen, h comes from the vector cache, P and the head learn;
- ``joint``: the encoder is fine-tuned too (:class:`~.finetune.TrainableEncoder`, its own learning
  rate, 2e-5 by default).

Loss per batch = cross-entropy over the batch's labelled pairs + w(t) · mean_k R_k, with
w(t) = pu_weight · (t / T)^p (p = 3), t the *global* step of the whole run (1 … T, never reset per
epoch — PAUSE's reference code resets it each epoch, a known bug) and T = epochs × steps per epoch.
R_k is the non-negative PU risk (Kiryo et al., 2017) of class k one-vs-rest on logit z_k, with the
sigmoid loss ℓ(z, y) = σ(−y z), class prior π_k, the batch's pairs labelled k as positives (P) and
its unlabelled pairs (U):

    R_p⁺ = π_k · mean_P ℓ(z, +1)      R_n⁻ = mean_U ℓ(z, −1) − π_k · mean_P ℓ(z, −1)
    R_k  = R_p⁺ + R_n⁻   if R_n⁻ ≥ 0,   else −R_n⁻   (the nnPU correction: a step that undoes the
                                                       over-fitting which drove R_n⁻ below zero)

A class with no labelled pair in the batch, or a batch with no unlabelled pair, contributes no PU
term (the estimate needs both samples). π of the positive class is ``prior`` (default: its
fraction among the labelled training pairs); every other class k gets its own fraction, rescaled so
that the priors sum to 1. ``pu_classes="positive"`` keeps only the positive class's risk.

Output bundle: the operator ``name`` (kind linear, W = PᵀP, b = 0) for the ANN, and the head
``head_name`` (:class:`~relsearch.encoder.heads.PairHead`) as a re-ranker, each with its metrics.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, is_bundle, load_bundle
from ..heads import PairHead
from ..metrics import Ranks, rank_gold, ranking_metrics
from ..relations import Operator, normalize
from .cache import _tqdm, encode_cached
from .data import Pair, read_pairs
from .loop import Checkpoint, EarlyStopping, seed_everything

REGIMES = ("adapter", "joint")
PU_CLASSES = ("all", "positive")
OPERATOR_PROTOCOL = ("retrieval on the test pairs labelled with the positive label: query = a, gold = b, "
                     "candidates = all distinct texts of the test pairs; filtered (other positive partners of a "
                     "removed); query itself excluded; realistic ranks (expectation under random tie-breaking)")
_BINARY_POSITIVES = {"1", "true", "yes", "positive"}


@dataclass(frozen=True, kw_only=True)
class PUConfig:
    """Hyperparameters of :func:`train_pu` (CLI: ``relsearch train --objective pu``)."""

    positive: str | None = None  # the positive label; None: "1"/"true" when the labels are binary, else an error
    regime: str = "adapter"  # adapter (frozen encoder) | joint (encoder fine-tuned too)
    name: str = "pu"  # the ANN operator's name
    head_name: str = "pu-head"  # the re-ranking head's name
    prior: float | None = None  # π of the positive class; None: its fraction among labelled train pairs
    pu_weight: float = 1.0  # scale of the PU term; 0 = cross-entropy alone (the baseline)
    power: float = 3.0  # p in w(t) = pu_weight · (t/T)^p
    pu_classes: str = "all"  # all: mean over the K one-vs-rest risks (PAUSE) | positive: its risk only
    label_fraction: float | None = None  # keep labels on this seeded fraction of labelled train pairs
    # T = epochs × steps per epoch sets the annealing: with 10% of SICK's labels the dev accuracy
    # peaks after 2–5 epochs, so a long schedule leaves w(t) ≈ 0 where early stopping stops (PU = CE)
    epochs: int = 5  # maximum; early stopping on dev accuracy
    patience: int = 3
    batch_size: int = 64
    lr: float = 1e-3  # head and projection P
    encoder_lr: float = 2e-5  # joint regime: the encoder
    hidden: int = 128
    max_length: int = 32  # joint regime: tokens per text
    seed: int = 13
    threads: int | None = None  # torch CPU threads while training (None: leave torch's setting)
    cache_dir: str | None = None  # vector cache (adapter); default $RELSEARCH_CACHE or ~/.cache/relsearch/vectors
    device: str = "auto"  # joint regime
    progress: bool = True

    def __post_init__(self):
        if self.regime not in REGIMES:
            raise ValueError(f"unknown regime {self.regime!r}; choose one of {', '.join(REGIMES)}")
        if self.pu_classes not in PU_CLASSES:
            raise ValueError(f"unknown pu_classes {self.pu_classes!r}; choose one of {', '.join(PU_CLASSES)}")
        if self.prior is not None and not 0 < self.prior < 1:
            raise ValueError(f"prior must be in (0, 1), got {self.prior}")
        if self.label_fraction is not None and not 0 < self.label_fraction <= 1:
            raise ValueError(f"label_fraction must be in (0, 1], got {self.label_fraction}")
        if self.pu_weight < 0 or self.power < 0:
            raise ValueError("pu_weight and power must be ≥ 0")
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1 or self.hidden < 1:
            raise ValueError("epochs, batch_size, patience and hidden must be ≥ 1")
        if self.name == self.head_name:
            raise ValueError("the operator and the head need different names")


# ------------------------------------------------------------------------------------ the maths
def pu_weight_at(step: int, total: int, config: PUConfig) -> float:
    """w(t) = pu_weight · (t/T)^p for the global step t (1-based) of T."""
    return config.pu_weight * (min(step, total) / max(total, 1)) ** config.power


def nnpu_risk(z, positive, unlabelled, prior: float):
    """Non-negative PU risk (sigmoid loss) of one class's logits ``z`` (n,); masks are bool (n,).

    Returns the value to minimise: R_p⁺ + R_n⁻ when R_n⁻ ≥ 0, else −R_n⁻ (module docstring).
    """
    import torch

    pos, unl = positive.float(), unlabelled.float()
    n_pos, n_unl = pos.sum().clamp(min=1.0), unl.sum().clamp(min=1.0)
    loss_pos, loss_neg = torch.sigmoid(-z), torch.sigmoid(z)  # ℓ(z, +1), ℓ(z, −1)
    risk_pos = prior * (pos * loss_pos).sum() / n_pos
    risk_neg = (unl * loss_neg).sum() / n_unl - prior * (pos * loss_neg).sum() / n_pos
    return torch.where(risk_neg < 0, -risk_neg, risk_pos + risk_neg)


def pu_term(logits, y, priors: np.ndarray, classes: list[int]):
    """mean over ``classes`` of nnPU risks; y (n,) class index or −1 (unlabelled). 0 when inapplicable."""
    unlabelled = y < 0
    risks = []
    if bool(unlabelled.any()):
        for k in classes:
            positive = y == k
            if bool(positive.any()):
                risks.append(nnpu_risk(logits[:, k], positive, unlabelled, float(priors[k])))
    if not risks:
        return logits.sum() * 0.0
    return sum(risks) / len(classes)


def class_priors(y_labelled: np.ndarray, n_classes: int, positive: int, prior: float | None) -> np.ndarray:
    """Per-class π: class fractions among labelled pairs; ``prior`` replaces the positive one (others rescaled)."""
    counts = np.bincount(y_labelled, minlength=n_classes).astype(np.float64)
    frac = counts / max(counts.sum(), 1.0)
    if prior is None:
        return frac
    out = frac.copy()
    rest = 1.0 - frac[positive]
    out[positive] = prior
    others = [k for k in range(n_classes) if k != positive]
    for k in others:
        out[k] = (1.0 - prior) * (frac[k] / rest if rest > 0 else 1.0 / len(others))
    return out


def subsample_labels(pairs: list[Pair], fraction: float | None, seed: int) -> list[Pair]:
    """Keep labels on exactly round(fraction × #labelled) labelled pairs (seeded); the rest become unlabelled."""
    if fraction is None or fraction >= 1:
        return list(pairs)
    labelled = [i for i, p in enumerate(pairs) if p.label is not None]
    keep_n = max(1, int(round(fraction * len(labelled)))) if labelled else 0
    rng = np.random.default_rng([seed, 0x50])
    keep = set(rng.choice(labelled, size=keep_n, replace=False).tolist()) if keep_n else set()
    return [p if p.label is None or i in keep else dataclasses.replace(p, label=None) for i, p in enumerate(pairs)]


# ------------------------------------------------------------------------------------ the model
def _build_model(d: int, n_classes: int, hidden: int):
    import torch

    class PUModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.P = torch.nn.Parameter(torch.eye(d))
            self.fc1 = torch.nn.Linear(4 * d, hidden)
            self.fc2 = torch.nn.Linear(hidden, n_classes)

        def forward(self, h_a, h_b):
            u, v = h_a @ self.P.T, h_b @ self.P.T
            x = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
            return self.fc2(torch.nn.functional.elu(self.fc1(x)))

    return PUModel()


def _head_params(model) -> dict[str, np.ndarray]:
    return {"P": model.P.detach().cpu().numpy().copy(), "W1": model.fc1.weight.detach().cpu().numpy().copy(),
            "b1": model.fc1.bias.detach().cpu().numpy().copy(), "W2": model.fc2.weight.detach().cpu().numpy().copy(),
            "b2": model.fc2.bias.detach().cpu().numpy().copy()}


# ----------------------------------------------------------------------------------- evaluation
def classification_metrics(pred: np.ndarray, gold: np.ndarray, n_classes: int, labels: list[str]) -> dict:
    """Accuracy, macro F1 and per-class F1 of class indices ``pred`` against ``gold``."""
    f1 = {}
    for k in range(n_classes):
        tp = int(((pred == k) & (gold == k)).sum())
        fp, fn = int(((pred == k) & (gold != k)).sum()), int(((pred != k) & (gold == k)).sum())
        f1[labels[k]] = 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return {"accuracy": round(float((pred == gold).mean()) if len(gold) else float("nan"), 5),
            "macro_f1": round(float(np.mean(list(f1.values()))), 5),
            "f1": {k: round(v, 5) for k, v in f1.items()}, "pairs": int(len(gold))}


def retrieval_metrics(apply, vectors: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[dict, int, int]:
    """Rank each gold b for query a among all texts of the split (see ``OPERATOR_PROTOCOL``)."""
    cand = np.unique(np.concatenate([a, b]))
    pos = np.full(len(vectors), -1, dtype=np.int64)
    pos[cand] = np.arange(len(cand))
    known: dict[int, set[int]] = {}
    for x, y in zip(a.tolist(), b.tolist()):
        known.setdefault(x, set()).add(y)
    keep = a != b
    a, b = a[keep], b[keep]
    cand_unit = normalize(vectors[cand])
    parts = []
    for start in range(0, len(a), 2048):
        qa, qb = a[start:start + 2048], b[start:start + 2048]
        scores = apply(vectors[qa]) @ cand_unit.T
        filt = np.zeros(scores.shape, dtype=bool)
        for row, x in enumerate(qa.tolist()):
            filt[row, pos[list(known[x])]] = True
        parts.append(rank_gold(scores, pos[qb], filter_mask=filt, exclude=pos[qa]))
    return ranking_metrics(Ranks.concat(parts)), len(a), len(cand)


# ------------------------------------------------------------------------------------- training
def _load(files) -> list[Pair]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    return [p for f in files for p in read_pairs(f)]


def _resolve_base(base):
    """(base bundle or None, encoder model reference)."""
    if base is None:
        from ..model import DEFAULT_MODEL

        return None, DEFAULT_MODEL
    base = str(base)
    if is_bundle(base):
        bundle = load_bundle(base)
        return bundle, bundle.encoder["model"]
    return None, base


def _choose_positive(labels: list[str], positive: str | None) -> str:
    if positive is None:
        truthy = [x for x in labels if x.lower() in _BINARY_POSITIVES]
        if len(labels) == 2 and len(truthy) == 1:
            return truthy[0]
        raise ValueError(f"name the positive label (--positive-label); the training labels are {', '.join(labels)}")
    if positive not in labels:
        raise ValueError(f"positive label {positive!r} is not among the training labels {', '.join(labels)}")
    return positive


def _config_dict(config: PUConfig) -> dict:
    d = dataclasses.asdict(config)
    for k in ("cache_dir", "progress", "threads", "device"):
        d.pop(k)
    return d


def train_pu(train_files, *, dev_files=(), test_files=(), config: PUConfig = PUConfig(), base=None,
             out=None, encoder=None):
    """Train a PU pair head and its ANN operator; return ``(bundle, trainable_encoder_or_None)``.

    ``base``: None (default encoder), a model id/path, or a bundle folder (its encoder; its other
    operators and heads are kept in adapter regime). ``out``: the bundle folder the caller will
    write; with it, a checkpoint ``OUT.checkpoint/`` is saved at each epoch end and a rerun with
    the same settings resumes after the last completed epoch (the caller clears it once the bundle
    is written). ``encoder``: an already-loaded frozen encoder for ``base`` (tests reuse one).
    In joint regime the returned bundle's encoder is a placeholder: write it with
    ``write_bundle(bundle, out, encoder=trainable)``.
    """
    import torch

    def as_list(files):
        return [files] if isinstance(files, (str, os.PathLike)) else list(files or ())

    train_files, dev_files, test_files = as_list(train_files), as_list(dev_files), as_list(test_files)
    if not train_files:
        raise ValueError("no training files given")
    data = {"train": _load(train_files), "dev": _load(dev_files) if dev_files else [],
            "test": _load(test_files) if test_files else []}
    labels = sorted({p.label for p in data["train"] if p.label is not None})
    if not labels:
        raise ValueError(f"{', '.join(map(str, train_files))}: no labelled pairs (PU learning needs some labels)")
    if len(labels) < 2:
        raise ValueError(f"only one label ({labels[0]!r}) in the training pairs; a classifier needs at least two")
    for split in ("dev", "test"):
        for p in data[split]:
            if p.label is not None and p.label not in labels:
                raise ValueError(f"{p.where}: label {p.label!r} of the {split} pairs is not in the training data; "
                                 f"known: {', '.join(labels)}")
    positive = _choose_positive(labels, config.positive)
    full_labelled = sum(p.label is not None for p in data["train"])
    data["train"] = subsample_labels(data["train"], config.label_fraction, config.seed)
    index = {lab: k for k, lab in enumerate(labels)}
    pos_k = index[positive]

    base_bundle, model_ref = _resolve_base(base)
    if encoder is None:  # the frozen encoder: adapter vectors, and the identity baseline in both regimes
        from ..model import Encoder, EncoderConfig

        encoder = Encoder(EncoderConfig(model=model_ref))
    texts: dict[str, int] = {}
    for split in data.values():
        for p in split:
            texts.setdefault(p.a, len(texts))
            texts.setdefault(p.b, len(texts))
    text_list = list(texts)
    base_vectors = encode_cached(encoder, text_list, cache_dir=config.cache_dir, progress=config.progress)

    def arrays(pairs):
        a = np.array([texts[p.a] for p in pairs], dtype=np.int64)
        b = np.array([texts[p.b] for p in pairs], dtype=np.int64)
        y = np.array([index[p.label] if p.label is not None else -1 for p in pairs], dtype=np.int64)
        return a, b, y

    train, dev, test = arrays(data["train"]), arrays(data["dev"]), arrays(data["test"])
    y_lab = train[2][train[2] >= 0]
    priors = class_priors(y_lab, len(labels), pos_k, config.prior)
    n_unlabelled = int((train[2] < 0).sum())

    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        run = {"config": _config_dict(config), "base": None if base is None else str(base),
               "files": {"train": [str(f) for f in train_files], "dev": [str(f) for f in dev_files],
                         "test": [str(f) for f in test_files]}}
        model, trainable, info = _fit(config, base_vectors, text_list, model_ref, train, dev, labels, priors,
                                      pos_k, out, run)
    finally:
        torch.set_num_threads(threads)

    # final vectors: the frozen ones (adapter) or the fine-tuned encoder's (joint)
    vectors = base_vectors if trainable is None else trainable.embed(text_list)
    params = _head_params(model)
    head = PairHead(name=config.head_name, labels=tuple(labels), positive=positive, params=params,
                    description=f"PU-trained pair classifier (PAUSE); score = P({positive} | a, b)")
    # The operator: cos(W h_q, t̂) with W = PᵀP ranks the documents of one query by
    # ⟨W h_q, t̂⟩ = ⟨P h_q, P t̂⟩, the bilinear score u·v of the projected pair that the head sees
    # (its u⊙v block): the query side alone carries the projection, so existing indexes of unit
    # document vectors t̂ stay valid. (‖W h_q‖ is one constant per query and does not change the order.)
    P = params["P"]
    op = Operator(name=config.name, kind="linear", params={"W": (P.T @ P).astype(np.float32),
                                                            "b": np.zeros(P.shape[0], np.float32)},
                  description=f"PU-trained projection (PAUSE), query side: ⟨P h_q, P t̂⟩ for {positive!r} pairs")
    data_info = {s: {"files": sorted({p.where.rsplit(':', 1)[0] for p in v}), "pairs": len(v),
                     "labelled": int(sum(p.label is not None for p in v))} for s, v in data.items()}
    data_info["train"]["labelled_before_fraction"] = full_labelled
    data_info["train"]["unlabelled"] = n_unlabelled
    hyper = _config_dict(config)
    hyper.update(positive=positive, priors={lab: round(float(priors[k]), 5) for k, lab in enumerate(labels)})
    head_metrics: dict = {"split": "test"}
    op_metrics: dict = {"split": "test", "protocol": OPERATOR_PROTOCOL}
    a, b, y = test
    if len(y) and (y >= 0).any():
        lab = y >= 0
        pred = head.logits(vectors[a[lab]], vectors[b[lab]]).argmax(axis=1)
        head_metrics.update(classification_metrics(pred, y[lab], len(labels), labels))
        pos_rows = y == pos_k
        if pos_rows.any():
            trained, n_q, n_c = retrieval_metrics(op.apply, vectors, a[pos_rows], b[pos_rows])
            ident, _, _ = retrieval_metrics(normalize, base_vectors, a[pos_rows], b[pos_rows])
            keys = ("mrr", "hits@1", "hits@10")
            op_metrics.update(queries=n_q, candidates=n_c, trained={k: round(trained[k], 5) for k in keys},
                              identity={k: round(ident[k], 5) for k in keys})
    head_metrics["dev_accuracy"] = info.get("dev_accuracy")
    head.info = {"data": data_info, "hyperparameters": hyper, "training": info, "metrics": head_metrics,
                 "operator": config.name}
    op.info = {"data": data_info, "hyperparameters": hyper, "training": {k: v for k, v in info.items() if k != "history"},
               "metrics": op_metrics, "head": config.head_name}

    operators, heads = {}, {}
    if base_bundle is not None and trainable is None:  # adapter: the base bundle's operators stay valid
        operators.update({k: v for k, v in base_bundle.operators.items() if k != "identity"})
        heads.update(base_bundle.heads)
    operators[config.name] = op
    heads[config.head_name] = head
    enc_identity = dict(encoder.identity) if trainable is None else {
        "model": None, "dim": int(vectors.shape[1]),
        "note": "fine-tuned weights: write with write_bundle(bundle, out, encoder=trainable)"}
    bundle = Bundle(encoder=enc_identity, operators=operators, heads=heads,
                    info={"trainer": f"relsearch pu ({config.regime}; PAUSE: cross-entropy + annealed nnPU risk)",
                          "config": hyper})
    return bundle, trainable


def _fit(config: PUConfig, vectors, text_list, model_ref, train, dev, labels, priors, pos_k, out, run: dict):
    """The training loop; returns (best model, trainable encoder or None, training info)."""
    import torch

    seed_everything(config.seed)
    n_classes, d = len(labels), vectors.shape[1]
    model = _build_model(d, n_classes, config.hidden)
    trainable = None
    groups = [{"params": list(model.parameters()), "lr": config.lr}]
    if config.regime == "joint":
        from .finetune import TrainableEncoder

        trainable = TrainableEncoder(model_ref, max_length=config.max_length, device=config.device)
        model.to(trainable.device)
        groups.append({"params": list(trainable.parameters()), "lr": config.encoder_lr})
    device = "cpu" if trainable is None else trainable.device
    opt = torch.optim.Adam(groups)
    raw = torch.from_numpy(vectors)
    classes = list(range(n_classes)) if config.pu_classes == "all" else [pos_k]
    ta, tb, ty = train
    has_dev = bool(len(dev[2]) and (dev[2] >= 0).any())
    dev_rows = dev[2] >= 0
    steps_per_epoch = math.ceil(len(ty) / config.batch_size)
    total = config.epochs * steps_per_epoch

    def state_tensors(prefix: str) -> dict:
        out_ = {f"{prefix}model/{k}": v for k, v in model.state_dict().items()}
        if trainable is not None:
            out_.update({f"{prefix}encoder/{k}": v for k, v in trainable.state_dict().items()})
        return out_

    def load_tensors(tensors: dict, prefix: str) -> None:
        model.load_state_dict({k[len(prefix) + 6:]: v for k, v in tensors.items() if k.startswith(prefix + "model/")})
        if trainable is not None:
            trainable.load_state_dict({k[len(prefix) + 8:]: v for k, v in tensors.items()
                                       if k.startswith(prefix + "encoder/")})

    def embed(idx: np.ndarray):
        if trainable is None:
            return raw[idx]
        return trainable([text_list[i] for i in idx])

    def dev_accuracy() -> float:
        if not has_dev:
            return float("nan")
        a, b, y = dev[0][dev_rows], dev[1][dev_rows], dev[2][dev_rows]
        model.eval()
        with torch.no_grad():
            if trainable is None:
                ha, hb = raw[a], raw[b]
            else:
                emb = torch.from_numpy(trainable.embed([text_list[i] for i in np.unique(np.concatenate([a, b]))]))
                where = {t: i for i, t in enumerate(np.unique(np.concatenate([a, b])).tolist())}
                ha = emb[[where[i] for i in a.tolist()]].to(device)
                hb = emb[[where[i] for i in b.tolist()]].to(device)
            pred = model(ha.to(device), hb.to(device)).argmax(dim=1).cpu().numpy()
        model.train()
        return float((pred == y).mean())

    stopper = EarlyStopping(config.patience)
    progress = {"epoch": 0, "step": 0, "history": [], "stopped": False, "early": stopper.state(), "seconds": 0.0}
    checkpoint = Checkpoint(out, run) if out is not None else None
    best_tensors = None
    resumed = checkpoint.load() if checkpoint is not None else None
    if resumed is not None:
        progress = resumed["state"]
        stopper.restore(progress["early"])
        load_tensors(resumed["tensors"], "")
        if any(k.startswith("best/") for k in resumed["tensors"]):
            best_tensors = {k[5:]: v for k, v in resumed["tensors"].items() if k.startswith("best/")}
        if resumed["optimizer"] is not None:
            opt.load_state_dict(resumed["optimizer"])
    step, t0 = progress["step"], time.time() - progress.get("seconds", 0.0)
    model.train()
    if trainable is not None:
        trainable.train()
    bar = _tqdm(total=total, initial=step, desc=f"pu ({config.regime})", unit="step", disable=not config.progress)
    for epoch in range(progress["epoch"] + 1, config.epochs + 1):
        if progress["stopped"]:
            break
        order = np.random.default_rng([config.seed, epoch]).permutation(len(ty))
        torch.manual_seed(config.seed * 1000 + epoch)  # dropout (joint) replays on resume
        losses, ce_sum, pu_sum = [], 0.0, 0.0
        for start in range(0, len(order), config.batch_size):
            batch = order[start:start + config.batch_size]
            step += 1
            y = torch.from_numpy(ty[batch]).to(device)
            if trainable is None:
                logits = model(raw[ta[batch]], raw[tb[batch]])
            else:
                with trainable.autocast():
                    logits = model(embed(ta[batch]), embed(tb[batch])).float()
            labelled = y >= 0
            ce = (torch.nn.functional.cross_entropy(logits[labelled], y[labelled]) if bool(labelled.any())
                  else logits.sum() * 0.0)
            w = pu_weight_at(step, total, config)
            pu = pu_term(logits, y, priors, classes) if w > 0 else logits.sum() * 0.0
            loss = ce + w * pu
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            ce_sum += float(ce.detach())
            pu_sum += float(pu.detach())
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}", w=f"{w:.3f}")
        acc = dev_accuracy()
        n = max(len(losses), 1)
        progress["history"].append({"epoch": epoch, "step": step, "loss": round(float(np.mean(losses)), 5),
                                    "ce": round(ce_sum / n, 5), "pu": round(pu_sum / n, 5),
                                    "pu_weight": round(pu_weight_at(step, total, config), 5),
                                    "dev_accuracy": None if math.isnan(acc) else round(acc, 5)})
        bar.set_postfix(epoch=epoch, loss=f"{np.mean(losses):.4f}", dev_acc=f"{acc:.3f}")
        if has_dev:
            if stopper.improved(acc):
                best_tensors = {k: v.detach().clone() for k, v in state_tensors("").items()}
            progress["stopped"] = stopper.update(acc, epoch)
        progress.update(epoch=epoch, step=step, early=stopper.state(), seconds=round(time.time() - t0, 1))
        if checkpoint is not None:
            tensors = state_tensors("")
            if best_tensors is not None:
                tensors.update({f"best/{k}": v for k, v in best_tensors.items()})
            checkpoint.save(progress, tensors, opt)
        if progress["stopped"]:
            break
    bar.close()
    if has_dev and best_tensors is not None:
        load_tensors(best_tensors, "")
    model.eval()
    if trainable is not None:
        trainable.train(False)
    info = {"epochs_run": len(progress["history"]), "steps": step, "total_steps": total,
            "best_epoch": stopper.best_step if has_dev else len(progress["history"]),
            "dev_accuracy": None if stopper.best is None else round(stopper.best, 5),
            "stopped_early": bool(progress["stopped"]), "seconds": round(time.time() - t0, 1),
            "history": progress["history"]}
    return model, trainable, info
