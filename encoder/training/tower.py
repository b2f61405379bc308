"""Query-tower regime (``relsearch train --regime encoder``): relation-conditioned query encoders.

The query side is a copy of the base encoder that reads ``"relation: NAME; head text"`` with the
linear layers of its top ``layers`` transformer layers tuned (default 3 of MiniLM's 6): their whole
weights (``lora_rank=0``, the default) or LoRA deltas (``peft``) of rank ``lora_rank``. Both are
stored as LoRA pairs (a full delta ΔW as ``B = ΔW, A = I`` or ``B = I, A = ΔW``, scale 1), so serving
is the same; documents stay frozen in the base encoder's space, so the bundle serves any index built
with the base encoder (operators of kind ``encoder``, encoder/tower.py). The layers below stay frozen:
no graph is recorded through them, so a step's backward runs through the tuned layers only.

Recipe (informed by SimKGC and sentence-transformers' CachedMultipleNegativesRankingLoss):

- **frozen documents, so whole-table negatives**: every distinct text of the data (heads, tails,
  hard negatives of all splits, plus ``candidates`` such as all entity descriptions of a knowledge
  graph) is encoded once with the frozen base encoder; each query is contrasted with the whole
  table (``negatives="table"``; a seeded sample of ``max_candidates`` plus the batch's tails when
  the table is larger). ``negatives="batch"``: only the batch's tails and heads plus, with
  ``pre_batch=k``, the tails of the k previous batches (exact vectors: documents do not move);
- **the head as a self-negative**: the query's own text stays in the softmax (it is what plain
  similarity ranks first); other training tails of (head, relation) are masked out (false
  negatives; dev and test answers are not: that would leak held-out labels into training);
- **additive margin** m subtracted from the gold cosine, **learnable temperature** (1/τ, from
  ``temperature``, at most 100), AdamW with **linear warm-up then linear decay**;
- **one forward per distinct query**: a batch holds ``batch_size`` distinct (relation, head) queries
  with all their training tails (a film's ten cast members cost one forward, as ten triples);
- **gradient caching** (:func:`~.finetune.chunked_backward`) when a batch has more queries than one
  ``chunk``: a batch of any size runs in the memory of one chunk, with the full-batch gradient;
- **no degenerate trailing batches** (:func:`even_batches`): a last batch under half the batch size
  is merged into the one before;
- no dropout by default (``dropout``): a CPU budget sees about one epoch, and sampling the masks
  costs about 15% of a step;
- bf16 autocast on CUDA GPUs that have it (fp16 on older ones, bf16 on AMX CPUs, else fp32).

Dev MRR (over the whole table, filtered, query excluded; queries cut at the base encoder's length,
as an index's query encoder cuts them, not at the training ``max_length``) at step 0, every
``eval_every`` steps and at each epoch's end keeps the best state (any gain); ``patience`` evaluations
each at least two standard errors of the dev MRR below the best stop the run (``dev_mrr_se``, over the
``max_dev_queries`` sampled dev queries; :class:`~.loop.EarlyStopping`): a wobble within the dev
sample's noise never does. The history logs each evaluation's score, standard error and ``stale``.
With ``inverse`` the history also records the dev MRR of each direction (``dev_mrr_tail`` over the
relations, ``dev_mrr_head`` over their ``^-1``); ``dev_mrr``, which early stopping reads, is over
both (each dev triple appears once each way, so it is about their mean).
``time_budget`` (minutes, :class:`~.loop.Budget`) stops it before a step and the evaluation after it
would overrun the budget (table encoding and evaluations count; the final test metrics do not), and
the learning rate then decays to zero at the budget's end or the last step, whichever comes first.
``until_budget`` (a run option: ``relsearch train`` sets it for ``--time-budget`` without
``--epochs``) lifts the ``epochs`` limit: the run goes on, epoch after epoch, until the budget is
spent or dev patience stops it, and the learning rate decays to zero at the budget's end. The
training record says which ended it (``stopped_by``: ``time budget``, ``patience`` or ``epochs``).
Interrupted runs resume from ``OUT.checkpoint`` (:class:`~.loop.Checkpoint`), budget spent included.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, load_bundle
from ..metrics import Ranks, rank_gold, ranking_metrics, reciprocal_ranks
from ..relations import Operator, normalize
from ..tower import MARKER, marked
from .cache import _tqdm, encode_cached
from .card import hyperparameters
from .data import INVERSE_SUFFIX, load_triple_splits
from .loop import Budget, Checkpoint, EarlyStopping, dev_line, seed_everything, standard_error
from .splits import text_ids
from .tower_weights import LORA_TARGETS, lora_state, tune_whole_weights, tuned_layers, whole_deltas

NEGATIVES = ("table", "batch")
TOWER_NAME = "query-tower"
MAX_INV_TEMPERATURE = 100.0
PROTOCOL = ("link prediction on the test triples: candidates = the whole text table (every head, tail and "
            "negative of train/dev/test plus --candidates); filtered (other true tails of (head, relation) "
            "removed); query itself excluded; realistic ranks")


@dataclass(frozen=True, kw_only=True)
class TowerConfig:
    """Hyperparameters of :func:`train_tower` (see the module docstring)."""

    epochs: int = 3
    batch_size: int = 128  # distinct queries per step, each with all its training tails
    chunk: int = 256  # queries per gradient-cache chunk (a batch within one chunk needs no replay)
    lr: float | None = None  # tuned weights and temperature: 3e-4 (whole weights) or 1e-3 (LoRA)
    temperature: float = 0.05  # initial τ; learned
    margin: float = 0.02
    negatives: str = "table"
    max_candidates: int | None = 65536  # "table": above this many texts, a seeded sample per batch
    pre_batch: int = 0  # "batch": earlier batches whose tails are negatives too
    warmup: float = 0.02  # fraction of the steps with a rising learning rate
    lora_rank: int = 0  # 0: the tuned layers' whole weights; r > 0: LoRA deltas of rank r
    layers: int | None = 3  # top transformer layers tuned (None or 0: all)
    max_length: int = 32  # query tokens while training
    dropout: bool = False  # the encoder's dropout while training (its sampling costs ~15% of a CPU step)
    eval_every: int | None = 200  # steps between dev evaluations (None: once per epoch)
    patience: int = 3
    max_dev_queries: int | None = 1000  # dev queries per evaluation (seeded sample): MRR's SE ≈ 0.01 at 1,000
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
        if self.negatives not in NEGATIVES:
            raise ValueError(f"unknown negatives {self.negatives!r}; choose one of {', '.join(NEGATIVES)}")
        if self.epochs < 1 or self.batch_size < 2 or self.chunk < 1 or self.patience < 1:
            raise ValueError("epochs ≥ 1, batch_size ≥ 2, chunk and patience ≥ 1 are needed")
        if self.lora_rank < 0 or (self.layers or 0) < 0:
            raise ValueError("lora_rank ≥ 0 (0: whole weights) and layers ≥ 0 (0: all) are needed")
        if not 0 <= self.warmup < 1 or self.temperature <= 0 or self.margin < 0 or self.pre_batch < 0:
            raise ValueError("warmup in [0, 1), temperature > 0, margin ≥ 0 and pre_batch ≥ 0 are needed")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return 1e-3 if self.lora_rank else 3e-4


def even_batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A shuffled split of ``range(n)`` into batches of ``batch_size``; a last batch smaller than half
    of it joins the previous batch (a tiny batch has almost no negatives: a near-zero, noisy step)."""
    order = rng.permutation(n)
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if len(batches) > 1 and len(batches[-1]) < batch_size / 2:
        batches[-2:] = [np.concatenate(batches[-2:])]
    return batches


def lr_factor(step: int, total: int | None, warmup: int, time_fraction: float = 0.0) -> float:
    """Linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total`` — or, under a time
    budget of which ``time_fraction`` is spent, at the budget's end if that comes first (``total``
    None: no last step, the budget alone sets the decay)."""
    if step < warmup:
        return (step + 1) / warmup
    by_time = 1.0 - time_fraction
    if total is None:
        return max(0.0, by_time)
    return max(0.0, min((total - step) / max(1, total - warmup), by_time))


def tower_loss(q, cand, gold, mask, inv_temperature, margin: float):
    """Additive-margin InfoNCE: mean over queries of −log softmax((cos − m·[gold]) / τ)[gold].

    ``q`` (b, d) and ``cand`` (c, d) unit vectors; ``gold`` (b,) column of each query's tail;
    ``mask`` (b, c) bool, True = a false negative left out (never the gold column);
    ``inv_temperature`` 1/τ (a scalar tensor, learnable).
    """
    import torch.nn.functional as F

    cos = q @ cand.T
    cos = cos - margin * F.one_hot(gold, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy((cos * inv_temperature).masked_fill(mask, float("-inf")), gold)


@dataclass
class _Data:
    """Triples as text ids: relation name, head, tail per row of each split."""

    rel: list[str]
    head: np.ndarray
    tail: np.ndarray

    def __len__(self):
        return len(self.head)


def _known(*splits: _Data) -> dict[tuple[str, int], set[int]]:
    out: dict[tuple[str, int], set[int]] = {}
    for s in splits:
        for r, h, t in zip(s.rel, s.head.tolist(), s.tail.tolist()):
            out.setdefault((r, h), set()).add(t)
    return out


def _false_negatives(data: _Data, rows, cols: np.ndarray, known, n_cols: int) -> np.ndarray:
    """(b, c) bool: other true tails of each row's (relation, head) among the columns (``cols``: text id → column)."""
    mask = np.zeros((len(rows), n_cols), dtype=bool)
    for i, row in enumerate(rows):
        others = [t for t in known[(data.rel[row], int(data.head[row]))] if t != data.tail[row]]
        pos = cols[others] if others else np.zeros(0, np.int64)
        mask[i, pos[pos >= 0]] = True
    return mask


def gold_ranks(query_unit: np.ndarray, data: _Data, rows: np.ndarray, table_unit: np.ndarray, known,
               *, chunk: int = 1024) -> Ranks:
    """Filtered ranks of each row's tail for unit query vectors (one per row of ``rows``) against the whole table."""
    cols = np.arange(len(table_unit))
    parts = []
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        scores = query_unit[start:start + chunk] @ table_unit.T
        filt = _false_negatives(data, part, cols, known, len(table_unit))
        parts.append(rank_gold(scores, data.tail[part], filter_mask=filt, exclude=data.head[part]))
    return Ranks.concat(parts)


def evaluate(query_unit: np.ndarray, data: _Data, rows: np.ndarray, table_unit: np.ndarray, known,
             *, chunk: int = 1024) -> dict:
    """Filtered realistic metrics of unit query vectors (one per row of ``rows``) against the whole table."""
    return ranking_metrics(gold_ranks(query_unit, data, rows, table_unit, known, chunk=chunk)) if len(rows) else {}


def is_inverse(relation: str) -> bool:
    """Whether ``relation`` is a reversed one (``<r>^-1``: head prediction for r)."""
    return relation.endswith(INVERSE_SUFFIX)


def query_groups(data: _Data) -> list[np.ndarray]:
    """Row indices of ``data`` grouped by distinct query (relation, head), in order of first appearance."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(zip(data.rel, data.head.tolist())):
        groups.setdefault(key, []).append(i)
    return [np.array(rows, dtype=np.int64) for rows in groups.values()]


def train_tower(train_files, *, dev_files=(), test_files=(), config: TowerConfig = TowerConfig(), base=None,
                out=None, candidates: list[str] | None = None) -> Bundle:
    """Train one query tower for the relations of ``train_files``; returns a bundle of ``encoder``
    operators on the base encoder (indexes built with the base encoder serve it unchanged)."""
    import torch

    from ..model import Encoder, EncoderConfig

    budget = Budget(config.time_budget)  # from here: loading, encoding the table and evaluations count
    try:
        import peft  # noqa: F401  (checked first: the run needs it)
    except ImportError as e:
        raise RuntimeError("--regime encoder needs peft: pip install peft") from e
    loaded, wanted = load_triple_splits(train_files, dev_files, test_files, relations=config.relations,
                                        inverse=config.inverse)
    if config.threads:
        torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    texts = text_ids(loaded, extra=candidates)
    text_list = list(texts)
    data = {s: _Data([t.relation for t in v], np.array([texts[t.head] for t in v], np.int64),
                     np.array([texts[t.tail] for t in v], np.int64)) for s, v in loaded.items()}
    base_ref = load_bundle(base).encoder if base else load_bundle(None).encoder
    frozen = Encoder(EncoderConfig(model=base_ref["model"], max_length=base_ref.get("max_length")))
    table = normalize(encode_cached(frozen, text_list, cache_dir=config.cache_dir, progress=config.progress))
    run = _Run(config, base_ref["model"], text_list, data, table, budget, serve_length=frozen.max_length)
    hyper = _hyper(config, train_files, base, candidates)
    checkpoint = Checkpoint(out, hyper) if out else None
    run.start(checkpoint)
    _loop(run, checkpoint)
    run.restore(run.best)
    return _bundle(run, frozen, wanted, hyper)


class _Run:
    """The LoRA query tower being trained, its optimizer and schedule, and the run's progress."""

    def __init__(self, config: TowerConfig, model: str, text_list: list[str], data: dict[str, _Data],
                 table: np.ndarray, budget: Budget | None = None, serve_length: int | None = None):
        import torch
        from peft import LoraConfig, get_peft_model

        from .finetune import TrainableEncoder, adamw

        self.config, self.text_list, self.data, self.table = config, text_list, data, table
        # dev and test queries are cut where the index's query encoder cuts them, not at the
        # training length: the trainer then reports what a search will show
        self.serve_length = serve_length
        self.budget = budget or Budget(config.time_budget)
        self.known = _known(*data.values())  # ranks on dev and test are filtered by every split
        # the softmax masks only the answers training may know: masking dev or test answers would
        # spare them the push down every other wrong answer gets (a leak of held-out labels)
        self.train_known = _known(data["train"])
        cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        self.encoder = TrainableEncoder(model, max_length=config.max_length, precision="bf16" if cuda_bf16 else "auto")
        self.device = self.encoder.device
        # eager attention: on CPU, SDPA's flash-attention backward costs more than the eager path's
        # batched products at these lengths (a MiniLM step of 128 queries × 32 tokens: 0.80 vs 0.66 s)
        if self.device == "cpu":
            self.encoder.model.set_attn_implementation("eager")
        self.layers = tuned_layers(self.encoder.model, config.layers)
        if config.lora_rank:  # LoRA deltas on the tuned layers
            self.lora = LoraConfig(r=config.lora_rank, lora_alpha=2 * config.lora_rank, lora_dropout=0.0,
                                   target_modules=list(LORA_TARGETS), layers_to_transform=self.layers,
                                   layers_pattern="layer" if self.layers else None)
            self.encoder.model = get_peft_model(self.encoder.model, self.lora)
            self.tuned = lora_state(self.encoder.model)
            self.scale = self.lora.lora_alpha / self.lora.r
        else:  # the tuned layers' whole weights
            self.tuned = tune_whole_weights(self.encoder.model, self.layers)
            self.base_weights = {k: v.detach().clone() for k, v in self.tuned.items()}
            self.scale = 1.0
        self.log_inv_t = torch.tensor(math.log(1 / config.temperature), device=self.device, requires_grad=True)
        self.opt = adamw([*self.tuned.values(), self.log_inv_t], lr=config.learning_rate, weight_decay=0.0)
        self.table_t = torch.from_numpy(table).to(self.device)
        rng = np.random.default_rng(config.seed)
        self.groups = query_groups(data["train"])  # a batch: batch_size distinct queries, all their tails
        self._epoch: tuple[int, list[np.ndarray]] = (-1, [])
        self.per_epoch = len(self.epoch_batches(0))  # the same count every epoch: only the order changes
        # None: no epoch limit (until_budget), the budget or patience ends the run
        self.max_steps = None if config.until_budget else config.epochs * self.per_epoch
        self.warmup = int(config.warmup * config.epochs * self.per_epoch)  # of the planned epochs either way
        self.sched = self._schedule()
        dev = data["dev"]
        self.dev_rows = np.arange(len(dev))
        if config.max_dev_queries and len(dev) > config.max_dev_queries:
            self.dev_rows = np.sort(rng.choice(len(dev), config.max_dev_queries, replace=False))
        self.stopper, self.step, self.history, self.seconds = EarlyStopping(config.patience), 0, [], 0.0
        self.best: dict | None = None
        self.prev_tails: list[np.ndarray] = []
        self.stop_reason, self.loop_seconds, self.loop_cpu_seconds = "epochs", 0.0, 0.0

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """Training rows of each batch of ``epoch`` (0-based), drawn from ``(seed, epoch)``; the last epoch is kept."""
        if self._epoch[0] != epoch:
            config = self.config
            order = even_batches(len(self.groups), config.batch_size, np.random.default_rng([config.seed, epoch]))
            self._epoch = (epoch, [np.concatenate([self.groups[g] for g in b]) for b in order])
        return self._epoch[1]

    def batch_at(self, step: int) -> tuple[int, np.ndarray]:
        """(epoch, training rows) of the batch that step ``step`` (0-based, counted over all epochs) trains on."""
        epoch, index = divmod(step, self.per_epoch)
        return epoch, self.epoch_batches(epoch)[index]

    def triples_trained(self) -> int:
        """Training triples seen by the steps taken so far (a triple counts once per epoch it was trained in)."""
        full, part = divmod(self.step, self.per_epoch)
        n = full * len(self.data["train"])
        return n + (sum(len(b) for b in self.epoch_batches(full)[:part]) if part else 0)

    def _schedule(self, last_epoch: int = -1):
        import torch

        total, warmup, budget = self.max_steps, self.warmup, self.budget
        return torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, total, warmup, budget.fraction()),
                                                 last_epoch=last_epoch)

    @property
    def temperature(self) -> float:
        return round(1 / float(self.log_inv_t.detach().exp()), 5)

    def tower_unit(self, split: _Data, rows: np.ndarray) -> np.ndarray:
        by_rel = [(split.rel[r], self.text_list[split.head[r]]) for r in rows]
        return normalize(self.encoder.embed([marked(MARKER, r, [x])[0] for r, x in by_rel], max_length=self.serve_length))

    def dev_scores(self) -> dict[str, float]:
        """``{"dev_mrr", "dev_mrr_se"}`` over the sampled dev triples (the MRR and its standard error
        over those queries), plus ``dev_mrr_tail`` and ``dev_mrr_head`` (the relations and their
        ``^-1``) when both directions are among them; NaN without dev data."""
        if not len(self.dev_rows):
            return {"dev_mrr": float("nan")}
        dev, rows = self.data["dev"], self.dev_rows
        rr = reciprocal_ranks(gold_ranks(self.tower_unit(dev, rows), dev, rows, self.table, self.known))
        out = {"dev_mrr": float(rr.mean()), "dev_mrr_se": standard_error(rr)}
        head = np.array([is_inverse(dev.rel[r]) for r in rows], dtype=bool)
        if head.any() and not head.all():
            out["dev_mrr_tail"], out["dev_mrr_head"] = float(rr[~head].mean()), float(rr[head].mean())
        return out

    def dev_mrr(self) -> float:
        return self.dev_scores()["dev_mrr"]

    # ----------------------------------------------------------------------------- state
    def snapshot(self) -> dict:
        return {**{f"tuned.{k}": v.detach().clone() for k, v in self.tuned.items()},
                "log_inv_t": self.log_inv_t.detach().clone()}

    def restore(self, state: dict, prefix: str = "") -> None:
        import torch

        with torch.no_grad():
            for k, v in self.tuned.items():
                v.copy_(state[f"{prefix}tuned.{k}"])
            self.log_inv_t.copy_(state[f"{prefix}log_inv_t"])

    def start(self, checkpoint: Checkpoint | None) -> None:
        """Resume from ``checkpoint`` when it holds this run, else score the start (step 0) on dev."""
        resumed = checkpoint.load() if checkpoint else None
        if resumed:
            self.restore(resumed["tensors"])
            self.best = {k[5:]: v for k, v in resumed["tensors"].items() if k.startswith("best.")} or None
            self.opt.load_state_dict(resumed["optimizer"])
            self.stopper.restore(resumed["state"]["stopper"])
            state = resumed["state"]
            self.step, self.history, self.seconds = state["step"], state["history"], state["seconds"]
            self.budget.spent = state.get("elapsed", 0.0)  # earlier sessions' share of the budget
            self.budget.eval_done(state.get("eval_seconds", 0.0))
            self.sched = self._schedule(last_epoch=self.step - 1)
        else:
            t0 = self.budget.clock()
            scores = self.dev_scores()
            self.budget.eval_done(self.budget.clock() - t0)
            start = scores["dev_mrr"]
            if not math.isnan(start):
                self.stopper.update(start, 0, scores.get("dev_mrr_se", 0.0))
            self.history.append({"step": 0, **_rounded(scores), "seconds": round(self.budget.elapsed(), 1)})
            self.best = self.snapshot()

    def after_step(self, epoch: int, loss: float, checkpoint: Checkpoint | None) -> None:
        """Dev evaluation: keep the best state, update early stopping, save the checkpoint."""
        t0 = self.budget.clock()
        scores = self.dev_scores()
        score = scores["dev_mrr"]
        self.encoder.train(self.config.dropout)
        if math.isnan(score) or self.stopper.improved(score):
            self.best = self.snapshot()
        if not math.isnan(score):
            self.stopper.update(score, self.step, scores.get("dev_mrr_se", 0.0))
        self.history.append({"step": self.step, "epoch": epoch + 1, "loss": round(loss, 5),
                             **_rounded(scores), "stale": self.stopper.counted, "temperature": self.temperature,
                             "seconds": round(self.budget.elapsed(), 1)})
        if checkpoint:
            tensors = {**self.snapshot(), **{f"best.{k}": v for k, v in self.best.items()}}
            checkpoint.save({"step": self.step, "history": self.history, "stopper": self.stopper.state(),
                             "seconds": self.seconds, "elapsed": self.budget.elapsed(),
                             "eval_seconds": self.budget.eval_seconds}, tensors, self.opt)
        self.budget.eval_done(self.budget.clock() - t0)

    # ------------------------------------------------------------------------------ step
    def candidates(self, batch: np.ndarray) -> np.ndarray:
        """Text ids of the batch's softmax columns (see ``negatives`` in the module docstring)."""
        config, train, n = self.config, self.data["train"], len(self.table)
        heads, tails = train.head[batch], train.tail[batch]
        if config.negatives == "table" and (not config.max_candidates or n <= config.max_candidates):
            return np.arange(n)
        if config.negatives == "table":
            sample = np.random.default_rng([config.seed, self.step]).choice(n, config.max_candidates, replace=False)
            return np.unique(np.concatenate([sample, tails, heads]))
        # in-batch tails, the heads as self-negatives, and earlier batches' tails
        cand = np.unique(np.concatenate([tails, heads, *self.prev_tails]))
        self.prev_tails = ([tails] + self.prev_tails)[:config.pre_batch]
        return cand

    def train_step(self, batch: np.ndarray) -> float:
        """One optimizer and schedule step on training rows ``batch``; returns the batch loss."""
        import torch

        from .finetune import chunked_backward

        config, train, device = self.config, self.data["train"], self.device
        t0 = time.perf_counter()
        cand = self.candidates(batch)
        cols = np.full(len(self.table), -1, dtype=np.int64)
        cols[cand] = np.arange(len(cand))
        mask = torch.as_tensor(_false_negatives(train, batch, cols, self.train_known, len(cand)), device=device)
        gold = torch.as_tensor(cols[train.tail[batch]], device=device)
        cand_t = self.table_t if len(cand) == len(self.table) else self.table_t[torch.as_tensor(cand, device=device)]
        # one forward per distinct query (relation, head): a head with several tails is encoded once
        queries, row_query = np.unique([marked(MARKER, train.rel[r], [self.text_list[train.head[r]]])[0]
                                        for r in batch], return_inverse=True)
        row_query = torch.as_tensor(row_query.reshape(-1), device=device)

        def loss_fn(q_raw):
            inv_t = self.log_inv_t.exp().clamp(max=MAX_INV_TEMPERATURE)
            q = torch.nn.functional.normalize(q_raw, dim=-1)[row_query]
            return tower_loss(q, cand_t, gold, mask, inv_t, config.margin)

        self.opt.zero_grad()
        loss = chunked_backward(self.encoder, [queries.tolist()], loss_fn, chunk=config.chunk)
        self.opt.step()
        self.sched.step()
        self.seconds += time.perf_counter() - t0
        self.step += 1
        return loss


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 5) for k, v in scores.items()}


def _loop(run: _Run, checkpoint: Checkpoint | None) -> None:
    """Steps until the epochs (none with ``until_budget``), patience or time budget run out; dev
    evaluations every ``eval_every`` steps, at epoch ends, and after the last step when the budget
    ends the run between evaluations."""
    config, budget, last = run.config, run.budget, run.max_steps
    eval_every = config.eval_every or run.per_epoch
    bar = _tqdm(total=last, initial=run.step, desc="rse query tower", unit="step", disable=not config.progress)
    run.encoder.train(config.dropout)
    t_loop, c_loop, e, loss, evaluated = time.perf_counter(), time.process_time(), 0, float("nan"), run.step
    dev = ""  # the last evaluation, as dev_line shows it
    while last is None or run.step < last:
        e, batch = run.batch_at(run.step)
        if run.stopper.stale >= config.patience:
            run.stop_reason = "patience"
            break
        if not budget.allows(with_eval=True):  # this step and the evaluation that must follow it
            run.stop_reason = "time budget"
            break
        t0 = budget.clock()
        loss = run.train_step(batch)
        budget.unit_done(budget.clock() - t0)
        bar.update(1)
        bar.set_postfix_str(f"loss={loss:.4f}, tau={1 / float(run.log_inv_t.detach().exp()):.4f}" + (dev and ", " + dev))
        epoch_end = run.step % run.per_epoch == 0
        if run.step % eval_every == 0 or epoch_end:
            run.after_step(e, loss, checkpoint)
            dev = dev_line(run.history[-1], run.stopper, config.patience)
            evaluated = run.step
    if evaluated != run.step:  # stopped by the budget after steps no evaluation has seen yet
        run.after_step(e, loss, checkpoint)
    run.loop_seconds += time.perf_counter() - t_loop
    run.loop_cpu_seconds += time.process_time() - c_loop  # CPU time: less sensitive to other jobs
    bar.close()


def _bundle(run: _Run, frozen, wanted: list[str], hyper: dict) -> Bundle:
    """Operators of kind ``encoder`` sharing the trained tower, with training info and test metrics."""
    trained_triples = run.triples_trained()
    seconds = run.seconds
    training = {"steps": run.step, "steps_per_epoch": run.per_epoch, "epochs_run": round(run.step / run.per_epoch, 2),
                "max_epochs": None if run.config.until_budget else run.config.epochs,
                "best_step": run.stopper.best_step, "dev_mrr_start": run.history[0]["dev_mrr"],
                "dev_mrr": run.stopper.best, "train_seconds": round(seconds, 2), "device": run.device,
                "triples_per_second": round(trained_triples / seconds, 1) if seconds else None,
                "loop_seconds": round(run.loop_seconds, 2), "loop_cpu_seconds": round(run.loop_cpu_seconds, 2),
                "precision": run.encoder.precision,
                "precision_reason": run.encoder.precision_reason, "stopped_by": run.stop_reason,
                **run.budget.record(), "temperature": run.temperature, "history": run.history}
    if run.config.lora_rank:
        params = {k: v.detach().float().cpu().numpy().copy() for k, v in run.tuned.items()}
    else:
        params = whole_deltas(run.tuned, run.base_weights)
    tower = {"name": TOWER_NAME, "marker": MARKER, "scale": run.scale, "base": frozen.identity["weights_sha256"],
             "rank": run.config.lora_rank, "targets": list(LORA_TARGETS), "layers": run.layers}
    metrics = _test_metrics(run.data["test"], run.tower_unit, run.table, run.known, wanted)
    ops = {}
    for name in wanted:
        info = {"tower": tower, "regime": "encoder",
                "data": {s: {"triples": sum(r == name for r in d.rel)} for s, d in run.data.items()},
                "hyperparameters": hyper, "training": training}
        if name in metrics:
            info["metrics"] = metrics[name]
        ops[name] = Operator(name=name, kind="encoder", params=params, info=info,
                             description=f"{name} (relation-conditioned query encoder)")
    return Bundle(encoder=dict(frozen.identity), operators=ops,
                  info={"trainer": "relsearch rse query tower (query encoder, top layers tuned, frozen documents)",
                        "config": hyper})


def _test_metrics(test: _Data, tower_unit, table: np.ndarray, known, wanted) -> dict[str, dict]:
    """Per relation: the tower vs identity of the base encoder, on the whole table (``PROTOCOL``)."""
    out = {}
    for name in wanted:
        rows = np.array([i for i, r in enumerate(test.rel) if r == name], dtype=np.int64)
        if not len(rows):
            continue
        trained = evaluate(tower_unit(test, rows), test, rows, table, known)
        plain = evaluate(table[test.head[rows]], test, rows, table, known)
        out[name] = {"split": "test", "protocol": PROTOCOL, "queries": len(rows), "candidates": len(table),
                     "trained": {k: round(v, 5) for k, v in trained.items()},
                     "identity": {k: round(v, 5) for k, v in plain.items()}}
    return out


def _hyper(config: TowerConfig, train_files, base, candidates) -> dict:
    return hyperparameters(config, lr=config.learning_rate, base=base, data=[str(f) for f in train_files],
                           candidates=len(candidates) if candidates else 0)
