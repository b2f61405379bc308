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

The maths (w(t), nnPU risk, priors, label subsampling) live in :mod:`.pu_risk`, the model and its
metrics in :mod:`.pu_model`; this module holds the config, the data preparation and the loop.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, is_bundle, load_bundle
from ..heads import PairHead
from ..relations import Operator, normalize
from .cache import _tqdm, encode_cached
from .card import hyperparameters
from .data import Pair, read_pairs
from .loop import Budget, Checkpoint, EarlyStopping, seed_everything
from .pu_model import OPERATOR_PROTOCOL, build_model, classification_metrics, head_params, retrieval_metrics
from .pu_risk import class_priors, nnpu_risk, pu_term, pu_weight_at, subsample_labels

# The maths and the model moved to pu_risk / pu_model; they are imported from here too.
__all__ = ["OPERATOR_PROTOCOL", "PUConfig", "class_priors", "classification_metrics", "nnpu_risk", "pu_term",
           "pu_weight_at", "retrieval_metrics", "subsample_labels", "train_pu"]

REGIMES = ("adapter", "joint")
PU_CLASSES = ("all", "positive")
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
    time_budget: float | None = None  # minutes of training (a run option: not in the hyperparameter record)

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


# ------------------------------------------------------------------------------------------ data
def _load(files) -> list[Pair]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    return [p for f in files for p in read_pairs(f)]


def _as_list(files) -> list:
    return [files] if isinstance(files, (str, os.PathLike)) else list(files or ())


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
    return hyperparameters(config)


@dataclass
class _Data:
    """The pairs of each split, the classes, and the pairs as arrays of text ids and class indices."""

    pairs: dict[str, list[Pair]]  # split → pairs (train: after label subsampling)
    labels: list[str]  # the K classes, sorted
    positive: str
    full_labelled: int  # labelled training pairs before label subsampling
    text_list: list[str] = None
    arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = None  # split → (a, b, y); y = −1 unlabelled

    @property
    def pos_k(self) -> int:
        return self.labels.index(self.positive)


def _read(train_files: list, dev_files: list, test_files: list, config: PUConfig) -> _Data:
    """Read and check the pairs, choose the positive label, subsample the training labels."""
    if not train_files:
        raise ValueError("no training files given")
    pairs = {"train": _load(train_files), "dev": _load(dev_files) if dev_files else [],
             "test": _load(test_files) if test_files else []}
    labels = sorted({p.label for p in pairs["train"] if p.label is not None})
    if not labels:
        raise ValueError(f"{', '.join(map(str, train_files))}: no labelled pairs (PU learning needs some labels)")
    if len(labels) < 2:
        raise ValueError(f"only one label ({labels[0]!r}) in the training pairs; a classifier needs at least two")
    for split in ("dev", "test"):
        for p in pairs[split]:
            if p.label is not None and p.label not in labels:
                raise ValueError(f"{p.where}: label {p.label!r} of the {split} pairs is not in the training data; "
                                 f"known: {', '.join(labels)}")
    positive = _choose_positive(labels, config.positive)
    full_labelled = sum(p.label is not None for p in pairs["train"])
    pairs["train"] = subsample_labels(pairs["train"], config.label_fraction, config.seed)
    return _Data(pairs, labels, positive, full_labelled)


def _index(data: _Data) -> None:
    """Give every text an id and each split its (a, b, y) arrays."""
    texts: dict[str, int] = {}
    for split in data.pairs.values():
        for p in split:
            texts.setdefault(p.a, len(texts))
            texts.setdefault(p.b, len(texts))
    index = {lab: k for k, lab in enumerate(data.labels)}

    def arrays(pairs):
        a = np.array([texts[p.a] for p in pairs], dtype=np.int64)
        b = np.array([texts[p.b] for p in pairs], dtype=np.int64)
        y = np.array([index[p.label] if p.label is not None else -1 for p in pairs], dtype=np.int64)
        return a, b, y

    data.text_list = list(texts)
    data.arrays = {s: arrays(v) for s, v in data.pairs.items()}


# ------------------------------------------------------------------------------------- training
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

    train_files, dev_files, test_files = _as_list(train_files), _as_list(dev_files), _as_list(test_files)
    data = _read(train_files, dev_files, test_files, config)
    base_bundle, model_ref = _resolve_base(base)
    if encoder is None:  # the frozen encoder: adapter vectors, and the identity baseline in both regimes
        from ..model import Encoder, EncoderConfig

        encoder = Encoder(EncoderConfig(model=model_ref))
    _index(data)
    base_vectors = encode_cached(encoder, data.text_list, cache_dir=config.cache_dir, progress=config.progress)
    train = data.arrays["train"]
    priors = class_priors(train[2][train[2] >= 0], len(data.labels), data.pos_k, config.prior)

    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        run = {"config": _config_dict(config), "base": None if base is None else str(base),
               "files": {"train": [str(f) for f in train_files], "dev": [str(f) for f in dev_files],
                         "test": [str(f) for f in test_files]}}
        model, trainable, info = _fit(config, base_vectors, data.text_list, model_ref, train, data.arrays["dev"],
                                      data.labels, priors, data.pos_k, out, run)
    finally:
        torch.set_num_threads(threads)

    # final vectors: the frozen ones (adapter) or the fine-tuned encoder's (joint)
    vectors = base_vectors if trainable is None else trainable.embed(data.text_list)
    head, op = _head_and_operator(model, data, config, priors, info, vectors, base_vectors)
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
                          "config": head.info["hyperparameters"]})
    return bundle, trainable


def _head_and_operator(model, data: _Data, config: PUConfig, priors, info: dict, vectors, base_vectors):
    """The trained head and its ANN operator, each with data, hyperparameters, training and test metrics."""
    labels, positive = data.labels, data.positive
    params = head_params(model)
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
                     "labelled": int(sum(p.label is not None for p in v))} for s, v in data.pairs.items()}
    data_info["train"]["labelled_before_fraction"] = data.full_labelled
    data_info["train"]["unlabelled"] = int((data.arrays["train"][2] < 0).sum())
    hyper = _config_dict(config)
    hyper.update(positive=positive, priors={lab: round(float(priors[k]), 5) for k, lab in enumerate(labels)})
    head_metrics, op_metrics = _test_metrics(head, op, data, vectors, base_vectors)
    head_metrics["dev_accuracy"] = info.get("dev_accuracy")
    head.info = {"data": data_info, "hyperparameters": hyper, "training": info, "metrics": head_metrics,
                 "operator": config.name}
    op.info = {"data": data_info, "hyperparameters": hyper,
               "training": {k: v for k, v in info.items() if k != "history"}, "metrics": op_metrics,
               "head": config.head_name}
    return head, op


def _test_metrics(head: PairHead, op: Operator, data: _Data, vectors, base_vectors) -> tuple[dict, dict]:
    """(head classification metrics, operator retrieval metrics vs identity) on the labelled test pairs."""
    head_metrics: dict = {"split": "test"}
    op_metrics: dict = {"split": "test", "protocol": OPERATOR_PROTOCOL}
    a, b, y = data.arrays["test"]
    if not (len(y) and (y >= 0).any()):
        return head_metrics, op_metrics
    lab = y >= 0
    pred = head.logits(vectors[a[lab]], vectors[b[lab]]).argmax(axis=1)
    head_metrics.update(classification_metrics(pred, y[lab], len(data.labels), data.labels))
    pos_rows = y == data.pos_k
    if pos_rows.any():
        trained, n_q, n_c = retrieval_metrics(op.apply, vectors, a[pos_rows], b[pos_rows])
        ident, _, _ = retrieval_metrics(normalize, base_vectors, a[pos_rows], b[pos_rows])
        keys = ("mrr", "hits@1", "hits@10")
        op_metrics.update(queries=n_q, candidates=n_c, trained={k: round(trained[k], 5) for k in keys},
                          identity={k: round(ident[k], 5) for k in keys})
    return head_metrics, op_metrics


class _Model:
    """The PAUSE model being trained: head + projection, the encoder too in joint regime, the optimizer."""

    def __init__(self, config: PUConfig, vectors: np.ndarray, text_list: list[str], model_ref: str, n_classes: int):
        import torch

        seed_everything(config.seed)
        self.text_list = text_list
        self.model = build_model(vectors.shape[1], n_classes, config.hidden)
        self.trainable = None
        groups = [{"params": list(self.model.parameters()), "lr": config.lr}]
        if config.regime == "joint":
            from .finetune import TrainableEncoder

            self.trainable = TrainableEncoder(model_ref, max_length=config.max_length, device=config.device)
            self.model.to(self.trainable.device)
            groups.append({"params": list(self.trainable.parameters()), "lr": config.encoder_lr})
        self.device = "cpu" if self.trainable is None else self.trainable.device
        self.opt = torch.optim.Adam(groups)
        self.raw = torch.from_numpy(vectors)

    def state_tensors(self) -> dict:
        out = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        if self.trainable is not None:
            out.update({f"encoder/{k}": v for k, v in self.trainable.state_dict().items()})
        return out

    def load_tensors(self, tensors: dict) -> None:
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
        if self.trainable is not None:
            self.trainable.load_state_dict({k[8:]: v for k, v in tensors.items() if k.startswith("encoder/")})

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)
        if self.trainable is not None:
            self.trainable.train(mode)

    def logits(self, a: np.ndarray, b: np.ndarray):
        """Class logits of pairs (text ids ``a``, ``b``), with gradients."""
        if self.trainable is None:
            return self.model(self.raw[a], self.raw[b])
        with self.trainable.autocast():
            return self.model(self.trainable([self.text_list[i] for i in a]),
                              self.trainable([self.text_list[i] for i in b])).float()

    def accuracy(self, a: np.ndarray, b: np.ndarray, y: np.ndarray) -> float:
        """Accuracy of the predicted class on labelled pairs (no gradients; the model is left in training mode)."""
        import torch

        self.model.eval()
        with torch.no_grad():
            if self.trainable is None:
                ha, hb = self.raw[a], self.raw[b]
            else:
                used = np.unique(np.concatenate([a, b]))
                emb = torch.from_numpy(self.trainable.embed([self.text_list[i] for i in used]))
                where = {t: i for i, t in enumerate(used.tolist())}
                ha = emb[[where[i] for i in a.tolist()]].to(self.device)
                hb = emb[[where[i] for i in b.tolist()]].to(self.device)
            pred = self.model(ha.to(self.device), hb.to(self.device)).argmax(dim=1).cpu().numpy()
        self.model.train()
        return float((pred == y).mean())


def _step(m: _Model, batch: np.ndarray, train, w: float, priors, classes: list[int]) -> tuple[float, float, float]:
    """One optimizer step on ``batch``: cross-entropy on its labelled pairs + w · PU term; returns (loss, ce, pu)."""
    import torch

    ta, tb, ty = train
    y = torch.from_numpy(ty[batch]).to(m.device)
    logits = m.logits(ta[batch], tb[batch])
    labelled = y >= 0
    ce = (torch.nn.functional.cross_entropy(logits[labelled], y[labelled]) if bool(labelled.any())
          else logits.sum() * 0.0)
    pu = pu_term(logits, y, priors, classes) if w > 0 else logits.sum() * 0.0
    loss = ce + w * pu
    m.opt.zero_grad()
    loss.backward()
    m.opt.step()
    return float(loss.detach()), float(ce.detach()), float(pu.detach())


def _fit(config: PUConfig, vectors, text_list, model_ref, train, dev, labels, priors, pos_k, out, run: dict):
    """The training loop; returns (best model, trainable encoder or None, training info)."""
    m = _Model(config, vectors, text_list, model_ref, len(labels))
    classes = list(range(len(labels))) if config.pu_classes == "all" else [pos_k]
    dev_rows = dev[2] >= 0
    has_dev = bool(len(dev[2]) and dev_rows.any())
    steps_per_epoch = math.ceil(len(train[2]) / config.batch_size)
    total = config.epochs * steps_per_epoch
    stopper, budget = EarlyStopping(config.patience), Budget(config.time_budget)
    progress = {"epoch": 0, "step": 0, "history": [], "stopped": False, "early": stopper.state(), "seconds": 0.0}
    checkpoint = Checkpoint(out, run) if out is not None else None
    best = None
    resumed = checkpoint.load() if checkpoint is not None else None
    if resumed is not None:
        progress, best = _resume(m, stopper, resumed)
        budget.spent = progress.get("elapsed", 0.0)
    step, t0 = progress["step"], time.time() - progress.get("seconds", 0.0)
    stopped_by = "patience" if progress["stopped"] else "epochs"
    m.train()
    bar = _tqdm(total=total, initial=step, desc=f"pu ({config.regime})", unit="step", disable=not config.progress)
    for epoch in range(progress["epoch"] + 1, config.epochs + 1):
        if progress["stopped"]:
            break
        if not budget.allows():  # an epoch and its dev evaluation must fit
            stopped_by = "time budget"
            break
        t_epoch = budget.clock()
        step, entry, loss = _epoch(m, config, epoch, step, total, train, priors, classes, bar)
        acc = m.accuracy(dev[0][dev_rows], dev[1][dev_rows], dev[2][dev_rows]) if has_dev else float("nan")
        se = math.sqrt(acc * (1 - acc) / dev_rows.sum()) if has_dev else float("nan")  # of a mean of 0/1 outcomes
        budget.unit_done(budget.clock() - t_epoch)
        bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", dev_acc=f"{acc:.3f} ± {se:.3f}")
        if has_dev:
            if stopper.improved(acc):
                best = {k: v.detach().clone() for k, v in m.state_tensors().items()}
            progress["stopped"] = stopper.update(acc, epoch, se)  # stale only 2 SE below the best
        progress["history"].append(dict(entry, dev_accuracy=None if math.isnan(acc) else round(acc, 5),
                                        **({"dev_accuracy_se": round(se, 5), "stale": stopper.counted} if has_dev
                                           else {}), seconds=round(budget.elapsed(), 1)))
        progress.update(epoch=epoch, step=step, early=stopper.state(), seconds=round(time.time() - t0, 1),
                        elapsed=budget.elapsed())
        if progress["stopped"]:
            stopped_by = "patience"
        if checkpoint is not None:
            tensors = m.state_tensors()
            if best is not None:
                tensors.update({f"best/{k}": v for k, v in best.items()})
            checkpoint.save(progress, tensors, m.opt)
        if progress["stopped"]:
            break
    bar.close()
    if has_dev and best is not None:
        m.load_tensors(best)
    m.train(False)
    info = {"epochs_run": len(progress["history"]), "steps": step, "total_steps": total,
            "best_epoch": stopper.best_step if has_dev else len(progress["history"]),
            "dev_accuracy": None if stopper.best is None else round(stopper.best, 5),
            "stopped_early": bool(progress["stopped"]), "seconds": round(time.time() - t0, 1),
            "stopped_by": stopped_by, **(budget.record() if config.time_budget else {}),
            "history": progress["history"]}
    return m.model, m.trainable, info


def _resume(m: _Model, stopper: EarlyStopping, resumed: dict) -> tuple[dict, dict | None]:
    """Restore model, optimizer and early stopping from a checkpoint; returns (progress, best tensors or None)."""
    progress = resumed["state"]
    stopper.restore(progress["early"])
    m.load_tensors(resumed["tensors"])
    best = None
    if any(k.startswith("best/") for k in resumed["tensors"]):
        best = {k[5:]: v for k, v in resumed["tensors"].items() if k.startswith("best/")}
    if resumed["optimizer"] is not None:
        m.opt.load_state_dict(resumed["optimizer"])
    return progress, best


def _epoch(m: _Model, config: PUConfig, epoch: int, step: int, total: int, train, priors, classes, bar):
    """One epoch (order and dropout drawn from ``(seed, epoch)``); returns (global step, history entry, mean loss)."""
    import torch

    order = np.random.default_rng([config.seed, epoch]).permutation(len(train[2]))
    torch.manual_seed(config.seed * 1000 + epoch)  # dropout (joint) replays on resume
    losses, ce_sum, pu_sum = [], 0.0, 0.0
    for start in range(0, len(order), config.batch_size):
        step += 1
        w = pu_weight_at(step, total, config)
        loss, ce, pu = _step(m, order[start:start + config.batch_size], train, w, priors, classes)
        losses.append(loss)
        ce_sum += ce
        pu_sum += pu
        bar.update(1)
        bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.4f}", w=f"{w:.3f}")
    n, mean = max(len(losses), 1), float(np.mean(losses))
    entry = {"epoch": epoch, "step": step, "loss": round(mean, 5), "ce": round(ce_sum / n, 5),
             "pu": round(pu_sum / n, 5), "pu_weight": round(pu_weight_at(step, total, config), 5)}
    return step, entry, mean
