"""Joint-regime RSE (design.md §4): the encoder and the relation operators are fine-tuned together.

Each step takes a batch of triples from a group-aware sampler (no two triples of a batch share a
group, a head or a tail, so no item is another's false negative), embeds heads, tails and one hard
negative per triple (its ``negative`` field, else a random tail of the same relation that is not a
true tail of the head) with gradient caching, and minimises the RSE contrastive loss over the
batch's tails and hard negatives (other true tails of the head masked out). Relations and encoder
have separate learning rates (1e-2 and 2e-5 by default). Dev link-prediction MRR is measured at
the start (step 0), every ``eval_every`` steps and at each epoch's end; the best state is kept and
training stops after ``patience`` evaluations without a gain. The fine-tuned encoder goes into the
bundle (``encoder/``), so corpora must be re-indexed with it — the index's encoder check refuses a
mismatch. Test metrics compare the trained model with identity *of the base encoder*, the baseline
a user has before training.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, load_bundle
from ..relations import Operator, normalize
from .cache import _tqdm, encode_cached
from .data import load_triple_splits
from .loop import Checkpoint, EarlyStopping, seed_everything
from .rse import PROTOCOL, _Split, _split, _true_tails, link_prediction


@dataclass(frozen=True, kw_only=True)
class JointConfig:
    operator: str = "translation"
    epochs: int = 1
    batch_size: int = 64
    lr: float | None = None  # encoder learning rate, default 2e-5
    relation_lr: float | None = None  # default 1e-2 (translation) / 3e-3 (linear)
    temperature: float = 0.05
    max_length: int = 32
    chunk: int = 64  # texts per gradient-cache chunk: memory of one chunk, gradient of the whole batch
    eval_every: int | None = None  # steps between dev evaluations (default: once per epoch)
    patience: int = 3
    max_dev_queries: int | None = 1000
    relations: tuple[str, ...] | None = None
    inverse: bool = False  # also train "<relation>^-1" on reversed triples (head prediction)
    seed: int = 13
    threads: int | None = None
    cache_dir: str | None = None
    progress: bool = True

    def __post_init__(self):
        if self.operator not in ("translation", "linear"):
            raise ValueError(f"unknown operator {self.operator!r}; choose translation or linear")
        if self.epochs < 1 or self.batch_size < 2 or self.patience < 1:
            raise ValueError("epochs ≥ 1, batch_size ≥ 2 and patience ≥ 1 are needed")

    @property
    def encoder_lr(self) -> float:
        return self.lr if self.lr is not None else 2e-5

    @property
    def operator_lr(self) -> float:
        return self.relation_lr if self.relation_lr is not None else (1e-2 if self.operator == "translation" else 3e-3)


def group_aware_batches(keys: list[set], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffle items into batches in which no two items share a key (group, head or tail).

    An item that conflicts with the batch being filled waits for a later batch, so every item is
    used exactly once; a final batch may be smaller.
    """
    order = list(range(len(keys)))
    rng.shuffle(order)
    batches, waiting = [], order
    while waiting:
        batch, used, later = [], set(), []
        for i in waiting:
            if len(batch) < batch_size and not (keys[i] & used):
                batch.append(i)
                used |= keys[i]
            else:
                later.append(i)
        batches.append(batch)
        waiting = later
    return batches


def train_joint(train_files, *, dev_files=(), test_files=(), config: JointConfig = JointConfig(), base=None,
                out=None, candidates: list[str] | None = None):
    """Fine-tune encoder + relation operators; returns (bundle, TrainableEncoder) for ``write_bundle``.

    ``candidates``: more texts to contrast against (e.g. all entity descriptions of a knowledge
    graph): each step adds a seeded sample of ``batch_size`` of them (fewer when there are fewer)
    to the batch's negatives, embedded with gradients like the tails."""
    import torch
    import torch.nn.functional as F

    from ..model import Encoder, EncoderConfig
    from .finetune import TrainableEncoder, chunked_backward
    from .rse import _forward, _init_params

    loaded, wanted = load_triple_splits(train_files, dev_files, test_files, relations=config.relations,
                                        inverse=config.inverse)
    if config.threads:
        torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    base_bundle = load_bundle(base) if base else load_bundle(None)
    encoder = TrainableEncoder(base_bundle.encoder["model"], max_length=config.max_length)
    d, device = encoder.dim, encoder.device  # every tensor of a step lives where the encoder does
    gen = torch.Generator(device=device).manual_seed(config.seed)
    params = {name: _init_params(config.operator, d, gen, device) for name in wanted}
    opt = torch.optim.AdamW([{"params": list(encoder.parameters()), "lr": config.encoder_lr},
                             {"params": [p for ps in params.values() for p in ps.values()], "lr": config.operator_lr}],
                            weight_decay=0.0)

    texts: dict[str, int] = {}
    for split in loaded.values():
        for t in split:
            for x in (t.head, t.tail, t.negative):
                if x is not None:
                    texts.setdefault(x, len(texts))
    text_list = list(texts)
    splits = {}
    for s, v in loaded.items():
        groups: dict[str, int] = {}
        splits[s] = {name: _split([t for t in v if t.relation == name], texts, groups) for name in wanted}
    known = {name: _true_tails(*(splits[s][name] for s in splits)) for name in wanted}
    train = loaded["train"]
    tails_of = {name: sorted({texts[t.tail] for t in train if t.relation == name}) for name in wanted}
    keys = [{("g", t.group)} if t.group else set() for t in train]
    for k, t in zip(keys, train):
        k |= {("t", t.head), ("t", t.tail)}
    dev_rng = np.random.default_rng(config.seed)
    for name, sp in splits["dev"].items():
        if config.max_dev_queries and len(sp) > config.max_dev_queries:
            sp.query_rows = np.sort(dev_rng.choice(len(sp), config.max_dev_queries, replace=False))

    def operators_now() -> dict[str, Operator]:
        return {name: Operator(name=name, kind=config.operator,
                               params={k: v.detach().cpu().numpy().copy() for k, v in params[name].items()})
                for name in wanted}

    def evaluate(split: str, vectors: np.ndarray, ops: dict) -> dict[str, tuple]:
        return {name: link_prediction(ops[name].apply, vectors, splits[split][name], known[name])
                for name in wanted if len(splits[split][name])}

    def dev_mrr() -> float:
        if not any(len(sp) for sp in splits["dev"].values()):
            return float("nan")
        vectors = _embed_split(encoder, text_list, splits["dev"])
        res = evaluate("dev", vectors, operators_now())
        return float(np.mean([m["mrr"] for m, _, _ in res.values()]))

    state_names = [f"op.{name}.{k}" for name in wanted for k in params[name]]
    checkpoint = Checkpoint(out, dict(_hyper(config, train_files, base), candidates=len(candidates or ()))) \
        if out else None
    stopper, step, history = EarlyStopping(config.patience), 0, []
    best = None
    resumed = checkpoint.load() if checkpoint else None
    if resumed:
        tensors = resumed["tensors"]
        encoder.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        for key in state_names:
            _, name, p = key.split(".", 2)
            params[name][p].data.copy_(tensors[key])
        best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")} or None
        opt.load_state_dict(resumed["optimizer"])
        stopper.restore(resumed["state"]["stopper"])
        step, history = resumed["state"]["step"], resumed["state"]["history"]
    else:
        start = dev_mrr()
        stopper.update(start, 0)
        history.append({"step": 0, "dev_mrr": round(start, 5)})

    def snapshot() -> dict:
        out_ = {f"model.{k}": v.detach().clone() for k, v in encoder.state_dict().items()}
        out_.update({f"op.{n}.{k}": v.detach().clone() for n in wanted for k, v in params[n].items()})
        return out_

    batches_per_epoch = [group_aware_batches(keys, config.batch_size, random.Random(f"{config.seed}-{e}"))
                         for e in range(config.epochs)]
    total = sum(len(b) for b in batches_per_epoch)
    eval_every = config.eval_every or len(batches_per_epoch[0])
    bar = _tqdm(total=total, initial=step, desc=f"rse joint ({config.operator})", unit="step",
                disable=not config.progress)
    t0 = time.time()
    encoder.train()
    flat = [(e, b) for e, bs in enumerate(batches_per_epoch) for b in bs]
    for e, batch in flat[step:]:
        if stopper.stale >= config.patience:
            break
        rng = random.Random(f"{config.seed}-neg-{step}")
        heads = [train[i].head for i in batch]
        tails = [train[i].tail for i in batch]
        negs, rels = [], [train[i].relation for i in batch]
        for i in batch:
            t = train[i]
            if t.negative and t.negative not in (t.head, t.tail):
                negs.append(t.negative)
            else:
                negs.append(text_list[rng.choice(tails_of[t.relation])])
        extra = [] if not candidates else [candidates[i] for i in rng.sample(range(len(candidates)),
                                                                              min(len(candidates), len(batch)))]
        negs = negs + extra
        cands = tails + negs
        false_negatives = np.zeros((len(batch), len(cands)), dtype=bool)
        for row, i in enumerate(batch):
            true = known[rels[row]].get(texts[heads[row]], set())
            for col, c in enumerate(cands):
                if col != row and (texts.get(c, -1) in true or c == heads[row]):  # a candidate may be no triple's
                    false_negatives[row, col] = True
        mask = torch.as_tensor(false_negatives, device=device)
        labels = torch.arange(len(batch), device=device)

        def loss_fn(h, t, n):
            q = torch.cat([_forward(params[rels[r]], h[r:r + 1]) for r in range(len(batch))])
            logits = q @ F.normalize(torch.cat([t, n]), dim=-1).T / config.temperature
            return F.cross_entropy(logits.masked_fill(mask, float("-inf")), labels)

        opt.zero_grad()
        loss = chunked_backward(encoder, [heads, tails, negs], loss_fn, chunk=config.chunk)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
        epoch_end = step == len(flat) or flat[step][0] != e
        if step % eval_every == 0 or epoch_end:
            score = dev_mrr()
            encoder.train()
            history.append({"step": step, "epoch": e + 1, "loss": round(loss, 5), "dev_mrr": round(score, 5)})
            bar.set_postfix(loss=f"{loss:.4f}", dev_mrr=f"{score:.3f}")
            if np.isnan(score) or stopper.improved(score):
                best = snapshot()
            if not np.isnan(score):
                stopper.update(score, step)
            if checkpoint:
                tensors = snapshot()
                tensors.update({f"best.{k}": v for k, v in (best or {}).items()})
                checkpoint.save({"step": step, "history": history, "stopper": stopper.state()}, tensors, opt)
    bar.close()
    if best is not None:
        encoder.load_state_dict({k[6:]: v for k, v in best.items() if k.startswith("model.")})
        for key in state_names:
            _, name, p = key.split(".", 2)
            params[name][p].data.copy_(best[key])
    # Trained on short windows for speed; queries and indexing use the base encoder's full window.
    encoder.max_length = base_bundle.encoder.get("max_length") or encoder.max_length
    ops = operators_now()
    info_training = {"steps": step, "best_step": stopper.best_step, "dev_mrr_start": history[0]["dev_mrr"],
                     "dev_mrr": stopper.best, "seconds": round(time.time() - t0, 1), "history": history}
    if any(len(sp) for sp in splits["test"].values()):
        tuned = evaluate("test", _embed_split(encoder, text_list, splits["test"]), ops)
        base_encoder = Encoder(EncoderConfig(model=base_bundle.encoder["model"], max_length=encoder.max_length))
        base_vecs = encode_cached(base_encoder, text_list, cache_dir=config.cache_dir, progress=False)
        plain = {name: link_prediction(normalize, base_vecs, splits["test"][name], known[name])
                 for name in tuned}
    for name, op in ops.items():
        op.description = f"{name} (jointly fine-tuned encoder)"
        metrics = {"split": "test", "protocol": PROTOCOL + "; identity = the base encoder before fine-tuning"}
        if any(len(sp) for sp in splits["test"].values()) and name in tuned:
            m, metrics["queries"], metrics["candidates"] = tuned[name]
            metrics["trained"] = {k: round(v, 5) for k, v in m.items()}
            metrics["identity"] = {k: round(v, 5) for k, v in plain[name][0].items()}
        op.info = {"regime": "joint", "data": {s: {"triples": len(splits[s][name])} for s in splits},
                   "hyperparameters": _hyper(config, train_files, base), "training": info_training,
                   "metrics": metrics}
    bundle = Bundle(encoder={}, operators={"identity": base_bundle.operators["identity"], **ops},
                    info={"trainer": "relsearch rse joint (encoder + relations fine-tuned, RSE contrastive loss)",
                          "config": _hyper(config, train_files, base)})
    return bundle, encoder


def _embed_split(encoder, text_list: list[str], split_rels: dict[str, _Split]) -> np.ndarray:
    """Raw vectors for every text id used by ``split_rels`` (others stay zero)."""
    used = np.unique(np.concatenate([np.concatenate([s.head, s.tail]) for s in split_rels.values() if len(s)]))
    vectors = np.zeros((len(text_list), encoder.dim), dtype=np.float32)
    vectors[used] = encoder.embed([text_list[i] for i in used])
    return vectors


def _hyper(config: JointConfig, train_files, base) -> dict:
    d = dataclasses.asdict(config)
    d.update(lr=config.encoder_lr, relation_lr=config.operator_lr, base=base, data=[str(f) for f in train_files])
    for k in ("cache_dir", "progress", "threads"):
        d.pop(k)
    d["relations"] = list(d["relations"]) if d["relations"] else None
    return d
