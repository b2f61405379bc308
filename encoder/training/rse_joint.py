"""Joint-regime RSE (design.md §4): the encoder and the relation operators are fine-tuned together.

Each step takes a batch of triples from a group-aware sampler (no two triples of a batch share a
group, a head or a tail, so no item is another's false negative), embeds heads, tails and one hard
negative per triple (its ``negative`` field, else a random tail of the same relation that is not a
true tail of the head) with gradient caching, and minimises the RSE contrastive loss over the
batch's tails and hard negatives (other true tails of the head masked out). Relations and encoder
have separate learning rates (1e-2 and 2e-5 by default). Dev link-prediction MRR is measured at
the start (step 0), every ``eval_every`` steps and at each epoch's end; the best state is kept (any
gain) and training stops after ``patience`` evaluations each at least two standard errors below the
best (:class:`~.loop.EarlyStopping`: a wobble within the dev sample's noise never does), or before a step and its evaluation
would overrun ``time_budget`` minutes (:class:`~.loop.Budget`); with ``until_budget`` (``relsearch
train --time-budget`` without ``--epochs``) there is no epoch limit, the budget and patience end the
run (``training.stopped_by`` says which). The fine-tuned encoder goes into the
bundle (``encoder/``), so corpora must be re-indexed with it — the index's encoder check refuses a
mismatch. Test metrics compare the trained model with identity *of the base encoder*, the baseline
a user has before training.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, load_bundle
from ..kinds import TRAINABLE, kind_of
from ..relations import Operator, normalize
from .cache import _tqdm, encode_cached
from .card import hyperparameters
from ..metrics import reciprocal_ranks
from .data import INVERSE_SUFFIX, Triple, load_triple_splits
from .linkpred import PROTOCOL, forward, init_params, link_prediction, link_ranks
from .loop import Budget, Checkpoint, EarlyStopping, dev_line, seed_everything, standard_error
from .splits import RelationSplit, relation_splits, sample_queries, text_ids, true_tails


@dataclass(frozen=True, kw_only=True)
class JointConfig:
    operator: str = "translation"
    epochs: int = 1
    batch_size: int = 64
    lr: float | None = None  # encoder learning rate, default 2e-5
    relation_lr: float | None = None  # default 1e-2 (translation) / 3e-3 (linear)
    temperature: float = 0.05
    max_length: int = 32
    chunk: int = 256  # texts per gradient-cache chunk: memory of one chunk, gradient of the whole batch
    # (a batch's heads, tails and negatives within one chunk run without the cache's replay forward)
    eval_every: int | None = None  # steps between dev evaluations (default: once per epoch)
    patience: int = 3
    max_dev_queries: int | None = 1000
    relations: tuple[str, ...] | None = None
    inverse: bool = False  # also train "<relation>^-1" on reversed triples (head prediction)
    seed: int = 13
    threads: int | None = None
    cache_dir: str | None = None
    progress: bool = True
    time_budget: float | None = None  # minutes (a run option: not in the hyperparameter record)
    until_budget: bool = False  # with time_budget: no epoch limit, the budget and patience end the run (run option)

    def __post_init__(self):
        if self.until_budget and self.time_budget is None:
            raise ValueError("until_budget needs a time_budget: without one, only epochs can end the run")
        if self.operator not in TRAINABLE:
            raise ValueError(f"unknown operator {self.operator!r}; choose {' or '.join(TRAINABLE)}")
        if self.epochs < 1 or self.batch_size < 2 or self.patience < 1:
            raise ValueError("epochs ≥ 1, batch_size ≥ 2 and patience ≥ 1 are needed")

    @property
    def encoder_lr(self) -> float:
        return self.lr if self.lr is not None else 2e-5

    @property
    def operator_lr(self) -> float:
        return self.relation_lr if self.relation_lr is not None else kind_of(self.operator).lr


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


@dataclass
class _Data:
    """The triples as the joint loop uses them: text ids, per-relation splits, batching keys."""

    train: list[Triple]
    texts: dict[str, int]  # text → id
    text_list: list[str]
    splits: dict[str, dict[str, RelationSplit]]  # split → relation → triples as ids
    known: dict[str, dict[int, set[int]]]  # relation → head id → every true tail id
    tails_of: dict[str, list[int]]  # relation → its training tails (random hard negatives)
    keys: list[set]  # per training triple: group, head and tail (group_aware_batches)

    def has(self, split: str) -> bool:
        return any(len(sp) for sp in self.splits[split].values())


def _prepare(loaded: dict[str, list[Triple]], wanted: list[str], config: JointConfig) -> _Data:
    texts = text_ids(loaded)
    by_relation = {name: relation_splits(loaded, name, texts) for name in wanted}
    splits = {s: {name: by_relation[name][s] for name in wanted} for s in loaded}
    known = {name: true_tails(*(splits[s][name] for s in splits)) for name in wanted}
    train = loaded["train"]
    tails_of = {name: sorted({texts[t.tail] for t in train if t.relation == name}) for name in wanted}
    keys = [{("g", t.group)} if t.group else set() for t in train]
    for k, t in zip(keys, train):
        k |= {("t", t.head), ("t", t.tail)}
    dev_rng = np.random.default_rng(config.seed)
    splits["dev"] = {name: sample_queries(sp, config.max_dev_queries, dev_rng) for name, sp in splits["dev"].items()}
    return _Data(train, texts, list(texts), splits, known, tails_of, keys)


class _Run:
    """The trainable state of a joint run (encoder, relation parameters, optimizer) and its progress."""

    def __init__(self, config: JointConfig, model: str, wanted: list[str], data: _Data, budget: Budget | None = None):
        import torch

        from .finetune import TrainableEncoder, adamw

        self.config, self.wanted, self.data = config, wanted, data
        self.budget = budget or Budget(config.time_budget)
        self.stop_reason, self.loop_seconds, self.seconds, self.trained = "epochs", 0.0, 0.0, 0
        self.loop_cpu_seconds = 0.0
        self.encoder = TrainableEncoder(model, max_length=config.max_length)
        d, self.device = self.encoder.dim, self.encoder.device  # every tensor of a step lives where the encoder does
        gen = torch.Generator(device=self.device).manual_seed(config.seed)
        self.params = {name: init_params(config.operator, d, gen, self.device) for name in wanted}
        self.opt = adamw(
            [{"params": list(self.encoder.parameters()), "lr": config.encoder_lr},
             {"params": [p for ps in self.params.values() for p in ps.values()], "lr": config.operator_lr}],
            weight_decay=0.0)
        self.stopper, self.step, self.history, self.best = EarlyStopping(config.patience), 0, [], None
        self.dev_shown = ""  # the last evaluation, as the progress bar shows it

    def operators(self) -> dict[str, Operator]:
        return {name: Operator(name=name, kind=self.config.operator,
                               params={k: v.detach().cpu().numpy().copy() for k, v in self.params[name].items()})
                for name in self.wanted}

    def evaluate(self, split: str, vectors: np.ndarray, ops: dict) -> dict[str, tuple]:
        sp, known = self.data.splits[split], self.data.known
        return {name: link_prediction(ops[name].apply, vectors, sp[name], known[name]) for name in self.wanted
                if len(sp[name])}

    def dev_scores(self) -> dict[str, float]:
        """``{"dev_mrr", "dev_mrr_se"}``: the mean over relations of each one's dev MRR, and its standard
        error (from each relation's over its sampled queries); plus ``dev_mrr_tail`` and ``dev_mrr_head``
        (the mean over the relations, and over their ``^-1``) when both directions are trained; NaN
        without dev data."""
        if not self.data.has("dev"):
            return {"dev_mrr": float("nan")}
        sp, known, ops = self.data.splits["dev"], self.data.known, self.operators()
        vectors = _embed_split(self.encoder, self.data.text_list, sp)
        rr = {name: reciprocal_ranks(link_ranks(ops[name].apply, vectors, sp[name], known[name])[0])
              for name in self.wanted if len(sp[name])}
        mrr = {name: float(r.mean()) for name, r in rr.items()}
        out = {"dev_mrr": float(np.mean(list(mrr.values()))),
               "dev_mrr_se": float(np.sqrt(sum(standard_error(r) ** 2 for r in rr.values())) / len(rr))}
        head = [name for name in mrr if name.endswith(INVERSE_SUFFIX)]
        if head and len(head) < len(mrr):
            out["dev_mrr_tail"] = float(np.mean([v for name, v in mrr.items() if name not in head]))
            out["dev_mrr_head"] = float(np.mean([mrr[name] for name in head]))
        return out

    # ----------------------------------------------------------------------------- state
    def snapshot(self) -> dict:
        out = {f"model.{k}": v.detach().clone() for k, v in self.encoder.state_dict().items()}
        out.update({f"op.{n}.{k}": v.detach().clone() for n in self.wanted for k, v in self.params[n].items()})
        return out

    def load(self, tensors: dict) -> None:
        """Encoder and relation parameters from ``snapshot()``-named tensors."""
        self.encoder.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        for name in self.wanted:
            for p, value in self.params[name].items():
                value.data.copy_(tensors[f"op.{name}.{p}"])

    def start(self, checkpoint: Checkpoint | None) -> None:
        """Resume from ``checkpoint`` when it holds this run, else score the start (step 0) on dev."""
        resumed = checkpoint.load() if checkpoint else None
        if resumed:
            self.load(resumed["tensors"])
            self.best = {k[5:]: v for k, v in resumed["tensors"].items() if k.startswith("best.")} or None
            self.opt.load_state_dict(resumed["optimizer"])
            self.stopper.restore(resumed["state"]["stopper"])
            self.step, self.history = resumed["state"]["step"], resumed["state"]["history"]
            state = resumed["state"]
            self.budget.spent = state.get("elapsed", 0.0)  # earlier sessions' share of the budget
            self.budget.eval_done(state.get("eval_seconds", 0.0))
            self.seconds, self.trained = state.get("seconds", 0.0), state.get("trained", 0)
        else:
            t0 = self.budget.clock()
            scores = self.dev_scores()
            self.budget.eval_done(self.budget.clock() - t0)
            self.stopper.update(scores["dev_mrr"], 0, scores.get("dev_mrr_se", 0.0))
            self.history.append({"step": 0, **_rounded(scores), "seconds": round(self.budget.elapsed(), 1)})
            self.best = self.snapshot()  # the base encoder stays the answer when no step beats it on dev

    def after_step(self, epoch: int, loss: float, checkpoint: Checkpoint | None, bar) -> None:
        """Dev evaluation: keep the best state, update early stopping, save the checkpoint."""
        t0 = self.budget.clock()
        scores = self.dev_scores()
        score = scores["dev_mrr"]
        self.encoder.train()
        if np.isnan(score) or self.stopper.improved(score):
            self.best = self.snapshot()
        if not np.isnan(score):
            self.stopper.update(score, self.step, scores.get("dev_mrr_se", 0.0))
        self.history.append({"step": self.step, "epoch": epoch + 1, "loss": round(loss, 5), **_rounded(scores),
                             "stale": self.stopper.counted, "seconds": round(self.budget.elapsed(), 1)})
        self.dev_shown = dev_line(self.history[-1], self.stopper, self.config.patience)
        bar.set_postfix_str(f"loss={loss:.4f}, {self.dev_shown}")
        if checkpoint:
            tensors = self.snapshot()
            tensors.update({f"best.{k}": v for k, v in (self.best or {}).items()})
            checkpoint.save({"step": self.step, "history": self.history, "stopper": self.stopper.state(),
                             "elapsed": self.budget.elapsed(), "eval_seconds": self.budget.eval_seconds,
                             "seconds": self.seconds, "trained": self.trained}, tensors, self.opt)
        self.budget.eval_done(self.budget.clock() - t0)

    # ------------------------------------------------------------------------------ step
    def train_step(self, batch: list[int], candidates: list[str] | None) -> float:
        """One optimizer step on training triples ``batch``; returns the batch loss."""
        import torch
        import torch.nn.functional as F

        from .finetune import chunked_backward

        config, data, device = self.config, self.data, self.device
        train = data.train
        rng = random.Random(f"{config.seed}-neg-{self.step}")
        heads = [train[i].head for i in batch]
        tails = [train[i].tail for i in batch]
        rels = [train[i].relation for i in batch]
        negs = [_hard_negative(train[i], data, rng) for i in batch]
        if candidates:
            negs += [candidates[i] for i in rng.sample(range(len(candidates)), min(len(candidates), len(batch)))]
        mask = torch.as_tensor(_false_negatives(heads, rels, tails + negs, data), device=device)
        labels = torch.arange(len(batch), device=device)

        def loss_fn(h, t, n):
            q = torch.cat([forward(self.params[rels[r]], h[r:r + 1]) for r in range(len(batch))])
            logits = q @ F.normalize(torch.cat([t, n]), dim=-1).T / config.temperature
            return F.cross_entropy(logits.masked_fill(mask, float("-inf")), labels)

        self.opt.zero_grad()
        loss = chunked_backward(self.encoder, [heads, tails, negs], loss_fn, chunk=config.chunk)
        self.opt.step()
        self.step += 1
        self.trained += len(batch)
        return loss


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 5) for k, v in scores.items()}


def _hard_negative(t: Triple, data: _Data, rng: random.Random) -> str:
    """The triple's own negative, else a random training tail of its relation (a true one is masked)."""
    if t.negative and t.negative not in (t.head, t.tail):
        return t.negative
    return data.text_list[rng.choice(data.tails_of[t.relation])]


def _false_negatives(heads: list[str], rels: list[str], cands: list[str], data: _Data) -> np.ndarray:
    """(batch, candidates) bool: other true tails of each row's head, and the head itself (never the gold column)."""
    out = np.zeros((len(heads), len(cands)), dtype=bool)
    for row, (head, rel) in enumerate(zip(heads, rels)):
        true = data.known[rel].get(data.texts[head], set())
        for col, c in enumerate(cands):
            if col != row and (data.texts.get(c, -1) in true or c == head):  # a candidate may be no triple's
                out[row, col] = True
    return out


def train_joint(train_files, *, dev_files=(), test_files=(), config: JointConfig = JointConfig(), base=None,
                out=None, candidates: list[str] | None = None):
    """Fine-tune encoder + relation operators; returns (bundle, TrainableEncoder) for ``write_bundle``.

    ``candidates``: more texts to contrast against (e.g. all entity descriptions of a knowledge
    graph): each step adds a seeded sample of ``batch_size`` of them (fewer when there are fewer)
    to the batch's negatives, embedded with gradients like the tails."""
    import torch

    budget = Budget(config.time_budget)  # from here: loading and evaluations count
    loaded, wanted = load_triple_splits(train_files, dev_files, test_files, relations=config.relations,
                                        inverse=config.inverse)
    if config.threads:
        torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    base_bundle = load_bundle(base) if base else load_bundle(None)
    data = _prepare(loaded, wanted, config)
    run = _Run(config, base_bundle.encoder["model"], wanted, data, budget)
    hyper = _hyper(config, train_files, base)
    checkpoint = Checkpoint(out, dict(hyper, candidates=len(candidates or ()))) if out else None
    run.start(checkpoint)
    t0 = time.time()
    _loop(run, candidates, checkpoint)
    if run.best is not None:
        run.load(run.best)
    # Trained on short windows for speed; queries and indexing use the base encoder's full window.
    run.encoder.max_length = base_bundle.encoder.get("max_length") or run.encoder.max_length
    training = {"steps": run.step, "max_epochs": None if config.until_budget else config.epochs,
                "best_step": run.stopper.best_step, "dev_mrr_start": run.history[0]["dev_mrr"],
                "dev_mrr": run.stopper.best, "seconds": round(time.time() - t0, 1),
                "train_seconds": round(run.seconds, 2), "loop_seconds": round(run.loop_seconds, 2),
                "loop_cpu_seconds": round(run.loop_cpu_seconds, 2),
                "triples_per_second": round(run.trained / run.seconds, 1) if run.seconds else None,
                "device": run.device, "precision": run.encoder.precision,
                "precision_reason": run.encoder.precision_reason, "stopped_by": run.stop_reason,
                **run.budget.record(), "history": run.history}
    ops = run.operators()
    metrics = _test_metrics(run, ops, base_bundle, config)
    for name, op in ops.items():
        op.description = f"{name} (jointly fine-tuned encoder)"
        op.info = {"regime": "joint", "data": {s: {"triples": len(data.splits[s][name])} for s in data.splits},
                   "hyperparameters": hyper, "training": training, "metrics": metrics[name]}
    bundle = Bundle(encoder={}, operators={"identity": base_bundle.operators["identity"], **ops},
                    info={"trainer": "relsearch rse joint (encoder + relations fine-tuned, RSE contrastive loss)",
                          "config": hyper})
    return bundle, run.encoder


def _epoch_batches(run: _Run, epoch: int) -> list:
    config = run.config
    return group_aware_batches(run.data.keys, config.batch_size, random.Random(f"{config.seed}-{epoch}"))


def _steps(run: _Run):
    """(epoch, batch, last of its epoch) from the run's step on: ``epochs`` epochs, or with
    ``until_budget`` as many as the budget and patience allow (epoch e drawn from ``(seed, e)``)."""
    config, done, epoch = run.config, 0, 0
    while config.until_budget or epoch < config.epochs:
        batches = _epoch_batches(run, epoch)
        if not batches:
            return
        for i, batch in enumerate(batches):
            if done >= run.step:
                yield epoch, batch, i == len(batches) - 1
            done += 1
        epoch += 1


def _loop(run: _Run, candidates: list[str] | None, checkpoint: Checkpoint | None) -> None:
    """Steps over group-aware batches until the epochs, patience or time budget run out (:func:`_steps`)."""
    config = run.config
    first = _epoch_batches(run, 0)
    eval_every = config.eval_every or len(first)
    total = None if config.until_budget else len(first) + sum(len(_epoch_batches(run, e))
                                                              for e in range(1, config.epochs))
    bar = _tqdm(total=total, initial=run.step, desc=f"rse joint ({config.operator})", unit="step",
                disable=not config.progress)
    run.encoder.train()
    budget, t_loop, c_loop = run.budget, time.perf_counter(), time.process_time()
    e, loss, evaluated = 0, float("nan"), run.step
    for e, batch, epoch_end in _steps(run):
        if run.stopper.stale >= config.patience:
            run.stop_reason = "patience"
            break
        if not budget.allows(with_eval=True):  # this step and the evaluation that must follow it
            run.stop_reason = "time budget"
            break
        t0, b0 = time.perf_counter(), budget.clock()
        loss = run.train_step(batch, candidates)
        run.seconds += time.perf_counter() - t0
        budget.unit_done(budget.clock() - b0)
        bar.update(1)
        bar.set_postfix_str(f"loss={loss:.4f}" + (run.dev_shown and ", " + run.dev_shown))
        if run.step % eval_every == 0 or epoch_end:
            run.after_step(e, loss, checkpoint, bar)
            evaluated = run.step
    if evaluated != run.step:  # stopped by the budget after steps no evaluation has seen yet
        run.after_step(e, loss, checkpoint, bar)
    run.loop_seconds += time.perf_counter() - t_loop
    run.loop_cpu_seconds += time.process_time() - c_loop  # CPU time: less sensitive to other jobs
    bar.close()


def _test_metrics(run: _Run, ops: dict[str, Operator], base_bundle: Bundle, config: JointConfig) -> dict[str, dict]:
    """Per relation: the fine-tuned model vs identity *of the base encoder* on the test triples."""
    from ..model import Encoder

    data = run.data
    metrics = {name: {"split": "test", "protocol": PROTOCOL + "; identity = the base encoder before fine-tuning"}
               for name in ops}
    if not data.has("test"):
        return metrics
    tuned = run.evaluate("test", _embed_split(run.encoder, data.text_list, data.splits["test"]), ops)
    base_encoder = Encoder(base_bundle.encoder_config(max_length=run.encoder.max_length))
    base_vecs = encode_cached(base_encoder, data.text_list, cache_dir=config.cache_dir, progress=False)
    for name in tuned:
        m, metrics[name]["queries"], metrics[name]["candidates"] = tuned[name]
        plain = link_prediction(normalize, base_vecs, data.splits["test"][name], data.known[name])[0]
        metrics[name]["trained"] = {k: round(v, 5) for k, v in m.items()}
        metrics[name]["identity"] = {k: round(v, 5) for k, v in plain.items()}
    return metrics


def _embed_split(encoder, text_list: list[str], split_rels: dict[str, RelationSplit]) -> np.ndarray:
    """Raw vectors for every text id used by ``split_rels`` (others stay zero)."""
    used = np.unique(np.concatenate([np.concatenate([s.head, s.tail]) for s in split_rels.values() if len(s)]))
    vectors = np.zeros((len(text_list), encoder.dim), dtype=np.float32)
    vectors[used] = encoder.embed([text_list[i] for i in used])
    return vectors


def _hyper(config: JointConfig, train_files, base) -> dict:
    return hyperparameters(config, lr=config.encoder_lr, relation_lr=config.operator_lr, base=base,
                           data=[str(f) for f in train_files])
