"""Sentence ensemble distillation (design.md §4, seed: "Sentence Ensemble Distillation").

A student encoder learns the MSE to the mean of several teachers' *raw* mean-pooled embeddings on
unlabelled sentences. Teachers share architecture and initialisation (e.g. the same encoder
fine-tuned with different seeds — :func:`.sts_teacher.train_sts_teacher` makes such teachers); averaging
embeddings of models that started from the same point is meaningful, averaging unrelated models
is not, so teachers with different dimensions or architectures are refused.

Flow of :func:`train_distill`:

1. read sentences from corpus JSONL files — per line ``text_field`` (default ``"text"``), else
   both sides of a pair (``"a"``/``"b"``) or of a triple (``"head"``/``"tail"``); scores and labels
   are ignored; duplicates are kept once;
2. targets: each teacher encodes every sentence once (inference :class:`~..model.Encoder` at the
   student's max length, through the on-disk vector cache :func:`.cache.encode_cached`), and the
   targets are the mean of the teachers' raw vectors;
3. the student (:class:`.finetune.TrainableEncoder`, initialised from ``base``, default the default
   encoder — the teachers' common starting point; bf16 autocast where the hardware has it) is
   trained with MSE to the targets (Adam, lr 2e-5, batch 64, max length 64, no warm-up or weight
   decay);
4. after every epoch: dev score and a checkpoint (student weights, optimizer, torch RNG); early
   stopping keeps the best epoch. Dev is an STS pairs file (``{"a", "b", "score"}``: Spearman of
   cosine vs score, higher is better) or, without scores, sentences (MSE to the teachers' mean,
   lower is better). Epoch 0 is the starting student.
5. test STS Spearman of the student, of each teacher, of the teachers' mean embedding (the
   ensemble itself) and of the base (the student before distillation) go to
   ``bundle.info["metrics"]``: ``{"split", "metric": "spearman", "protocol", "pairs", "files",
   "student", "teachers": {ref: ρ}, "teachers_mean", "ensemble", "base"}``.

The returned bundle carries the base bundle's operators and re-ranking heads (or identity only);
the caller writes it with ``loop.write_bundle(bundle, out, encoder=student, card=...)``, which
stores the student's weights under ``OUT/encoder/`` (indexes of the old encoder must be rebuilt).

Corpus and STS readers live in :mod:`.distill_data`, STS teachers in :mod:`.sts_teacher`, the
model card in :func:`.card.distill_card`; this module holds the config, the teachers' targets and
the training steps.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..bundle import Bundle, is_bundle, load_bundle
from .cache import _tqdm, encode_cached
from .card import distill_card
from .card import hyperparameters as _record
from .distill_data import STSPairs, is_sts_file, read_sentences, read_sts, sts_spearman
from .loop import Budget, Checkpoint, EarlyStopping, seed_everything
from .sts_teacher import cosent_loss, train_sts_teacher

# Readers, the STS teacher trainer and the card moved to their own modules; imported from here too.
__all__ = ["DistillConfig", "cosent_loss", "distill_card", "hyperparameters", "load_teachers", "model_of",
           "read_sentences", "read_sts", "sts_spearman", "teacher_targets", "train_distill", "train_sts_teacher"]

TRAINER = "relsearch distill (sentence ensemble distillation: MSE to the teachers' mean raw embedding)"
ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "vocab_size")


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Hyperparameters of :func:`train_distill` (CLI flag in each comment)."""

    epochs: int = 3  # --epochs: maximum; early stopping on dev
    patience: int = 2  # --patience
    batch_size: int = 64  # --batch-size
    lr: float = 2e-5  # --lr (Adam, student encoder)
    max_length: int = 64  # --max-length: tokens, for the student and the teachers' targets
    text_field: str = "text"  # --text-field: corpus field holding a sentence
    max_sentences: int | None = None  # --max-sentences: seeded subsample of the corpus
    # --dropout/--no-dropout. Off by default: the targets are dropout-free (teachers in eval mode) and
    # with dropout on, its noise dominated the MSE (STS-B run: 6.6e-3 vs 8e-5 with it off).
    dropout: bool = False
    seed: int = 13  # --seed
    device: str = "auto"  # --device
    threads: int | None = None  # --threads: torch CPU threads while training
    cache_dir: str | None = None  # --cache-dir: teachers' vector cache
    progress: bool = True  # --quiet
    time_budget: float | None = None  # minutes of training (a run option: not in the hyperparameter record)

    def __post_init__(self):
        if self.epochs < 0 or self.batch_size < 1 or self.patience < 1 or self.lr <= 0 or self.max_length < 2:
            raise ValueError("epochs must be ≥ 0, batch_size and patience ≥ 1, lr > 0, max_length ≥ 2")
        if self.max_sentences is not None and self.max_sentences < 1:
            raise ValueError("max_sentences must be ≥ 1")


def hyperparameters(config: DistillConfig) -> dict:
    return _record(config)


# -------------------------------------------------------------------------------------- teachers
def model_of(ref: str) -> str:
    """The encoder model a teacher/base reference stands for: a bundle's encoder, or the id/path itself."""
    ref = str(ref)
    return load_bundle(ref).encoder["model"] if is_bundle(ref) else ref


def load_teachers(teachers, *, max_length: int):
    """Inference encoders (mean pooling, ``max_length``) for teacher refs; refuses mismatched ones."""
    from transformers import AutoConfig

    from ..model import Encoder, EncoderConfig, resolve_model_path

    if not teachers:
        raise ValueError("distillation needs at least one teacher (--teachers A,B,...)")
    encoders, archs = [], []
    for ref in teachers:
        model = model_of(ref)
        encoders.append(Encoder(EncoderConfig(model=model, pooling="mean", max_length=max_length)))
        cfg = AutoConfig.from_pretrained(resolve_model_path(model)).to_dict()
        archs.append({k: cfg.get(k) for k in ARCH_KEYS})
    dims = {str(t): e.dim for t, e in zip(teachers, encoders)}
    if len(set(dims.values())) > 1:
        raise ValueError("teachers have different dimensions (" + ", ".join(f"{t}: {d}" for t, d in dims.items())
                         + "); distillation averages their embeddings, so they must share architecture")
    for t, arch in zip(teachers[1:], archs[1:]):
        if arch != archs[0]:
            diff = {k: (archs[0][k], arch[k]) for k in ARCH_KEYS if archs[0][k] != arch[k]}
            raise ValueError(f"teacher {t} has another architecture than {teachers[0]}: {diff}")
    return encoders


def teacher_targets(encoders, sentences: list[str], *, cache_dir=None, progress: bool = True) -> np.ndarray:
    """Mean of the teachers' raw vectors (n, d), float32."""
    total = None
    for enc in encoders:
        v = encode_cached(enc, sentences, cache_dir=cache_dir, progress=progress).astype(np.float64)
        total = v if total is None else total + v
    return (total / len(encoders)).astype(np.float32)


# -------------------------------------------------------------------------------------- training
@dataclass
class _Data:
    """Corpus sentences (subsampled), dev (STS pairs or sentences, or none) and test STS pairs."""

    sentences: list[str]
    dev_sts: STSPairs | None
    dev_sentences: list[str]
    test: STSPairs | None

    @property
    def dev_metric(self) -> str | None:
        """spearman (higher is better), mse to the teachers' mean (lower is better), or None without dev."""
        return "spearman" if self.dev_sts is not None else ("mse" if self.dev_sentences else None)

    @property
    def dev_size(self) -> int:
        return len(self.dev_sts) if self.dev_sts is not None else len(self.dev_sentences)


def _read_data(corpus_files, dev_files: list, test_files: list, config: DistillConfig) -> _Data:
    sentences = read_sentences(corpus_files, text_field=config.text_field)
    if config.max_sentences and len(sentences) > config.max_sentences:
        keep = np.sort(np.random.default_rng([config.seed, 1]).choice(len(sentences), config.max_sentences,
                                                                       replace=False))
        sentences = [sentences[i] for i in keep]
    dev_sts, dev_sentences = None, []
    if dev_files:
        kinds = {is_sts_file(f) for f in dev_files}
        if len(kinds) > 1:
            raise ValueError("dev files mix STS pairs (a, b, score) and unlabelled sentences; use one kind")
        if kinds.pop():
            dev_sts = read_sts(dev_files)
        else:
            dev_sentences = read_sentences(dev_files, text_field=config.text_field)
    return _Data(sentences, dev_sts, dev_sentences, read_sts(test_files) if test_files else None)


class _Run:
    """The student, its optimizer and the run's progress (epochs, early stopping, best weights)."""

    def __init__(self, config: DistillConfig, data: _Data, model: str, dev_targets: np.ndarray | None):
        import torch

        from .finetune import TrainableEncoder

        self.config, self.data, self.dev_targets = config, data, dev_targets
        seed_everything(config.seed)  # dropout draws come from torch's global generator
        self.student = TrainableEncoder(model, pooling="mean", max_length=config.max_length, device=config.device)
        self.student.train(config.dropout)
        self.opt = torch.optim.Adam(self.student.parameters(), lr=config.lr)
        self.metric = data.dev_metric
        self.stopper = EarlyStopping(config.patience, higher_is_better=self.metric != "mse")
        self.history, self.epoch, self.done, self.seconds = [], 0, False, 0.0
        self.best_state: dict = {}
        self.budget, self.stopped_by = Budget(config.time_budget), "epochs"

    def dev_score(self) -> float:
        dev_sts, student = self.data.dev_sts, self.student
        if dev_sts is not None:
            return sts_spearman(student.embed(dev_sts.a), student.embed(dev_sts.b), dev_sts.score)
        pred = student.embed(self.data.dev_sentences)
        return float(((pred - self.dev_targets) ** 2).mean())

    def snapshot(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.student.state_dict().items()}

    def start(self, ckpt: Checkpoint | None) -> None:
        """Resume from ``ckpt`` when it holds this run; else score the starting student (epoch 0)."""
        import torch

        saved = ckpt.load() if ckpt is not None else None
        if saved is None:
            if self.metric:
                self.stopper.update(self.dev_score(), 0)
            self.best_state = self.snapshot()
            return
        state, tensors = saved["state"], saved["tensors"]
        self.student.load_state_dict({k[len("student/"):]: v for k, v in tensors.items() if k.startswith("student/")})
        if saved["optimizer"] is not None:
            self.opt.load_state_dict(saved["optimizer"])
        torch.set_rng_state(tensors["rng/torch"])
        self.stopper.restore(state["stopper"])
        self.history, self.epoch, self.done, self.seconds = (state["history"], state["epoch"], state["done"],
                                                             state["seconds"])
        self.budget.spent = state.get("elapsed", 0.0)
        self.best_state = ({k[len("best/"):]: v for k, v in tensors.items() if k.startswith("best/")}
                           if self.stopper.best_step != self.epoch else self.snapshot())

    def train_epoch(self, targets, bar) -> float:
        """One epoch of MSE steps (order drawn from ``(seed, epoch)``); returns its mean loss."""
        import torch.nn.functional as F

        config, sentences = self.config, self.data.sentences
        order = np.random.default_rng([config.seed, self.epoch]).permutation(len(sentences))
        losses = []
        for start in range(0, len(order), config.batch_size):
            batch = order[start:start + config.batch_size]
            pred = self.student([sentences[i] for i in batch])
            loss = F.mse_loss(pred, targets[batch].to(pred.device))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.5f}")
        return float(np.mean(losses)) if losses else float("nan")

    def end_epoch(self, loss_value: float, bar) -> None:
        """Dev score, early stopping, best weights (no dev: the last epoch is kept)."""
        entry = {"epoch": self.epoch, "loss": round(loss_value, 6)}
        if self.metric:
            score = self.dev_score()
            entry[f"dev_{self.metric}"] = round(score, 6)
            stop = self.stopper.update(score, self.epoch)
        else:
            self.stopper.update(float(self.epoch), self.epoch)
            stop = False
        entry["seconds"] = round(self.budget.elapsed(), 1)
        self.history.append(entry)
        if stop:
            self.stopped_by = "patience"
        bar.set_postfix(loss=f"{loss_value:.5f}", **({f"dev_{self.metric}": f"{entry[f'dev_{self.metric}']:.4f}"}
                                                     if self.metric else {}))
        if self.stopper.best_step == self.epoch:
            self.best_state = self.snapshot()
        self.done = stop or self.epoch >= self.config.epochs

    def save(self, ckpt: Checkpoint) -> None:
        import torch

        tensors = {f"student/{k}": v for k, v in self.student.state_dict().items()}
        if self.stopper.best_step != self.epoch:  # else the best are the student's own weights: no second copy
            tensors.update({f"best/{k}": v for k, v in self.best_state.items()})
        tensors["rng/torch"] = torch.get_rng_state()
        ckpt.save({"epoch": self.epoch, "done": self.done, "stopper": self.stopper.state(), "history": self.history,
                   "seconds": self.seconds, "elapsed": self.budget.elapsed()}, tensors, self.opt)

    def training_info(self) -> dict:
        best = None if not self.metric else round(self.stopper.best, 6)
        return {"epochs_run": len(self.history), "best_epoch": self.stopper.best_step,
                "seconds": round(self.seconds, 1), "dev_metric": self.metric, "dev_best": best,
                "stopped_by": self.stopped_by, "precision": self.student.precision,
                **(self.budget.record() if self.config.time_budget else {}), "history": self.history}


def train_distill(corpus_files, *, teachers: list[str], dev_files=(), test_files=(),
                  config: DistillConfig = DistillConfig(), base=None, out=None):
    """Distil the teachers' mean embedding into a student; returns ``(bundle, student TrainableEncoder)``.

    ``teachers``: bundle folders or model ids/paths. ``base``: the student's starting point (bundle
    or model; default the default encoder); its bundle operators are carried over. ``out``: where the
    caller will write the bundle — only used for the resumable checkpoint ``OUT.checkpoint/``.
    """
    import torch

    teachers = [str(t) for t in teachers]
    if isinstance(corpus_files, (str, os.PathLike)):
        corpus_files = [corpus_files]
    if not corpus_files:
        raise ValueError("no corpus files given")
    dev_files, test_files = list(dev_files), list(test_files)
    data = _read_data(corpus_files, dev_files, test_files, config)
    encoders = load_teachers(teachers, max_length=config.max_length)
    # Teachers share an initialisation; by default the student starts there too (the default encoder),
    # not from one teacher, which would start it at that teacher's optimum (measured: it never moves).
    base_ref = str(base) if base is not None else load_bundle(None).encoder["model"]
    base_bundle = load_bundle(base_ref) if is_bundle(base_ref) else None
    ckpt = None
    if out is not None:
        files = {"corpus": [str(f) for f in corpus_files], "dev": dev_files}
        ckpt = Checkpoint(out, {"objective": "distill", "hyperparameters": hyperparameters(config),
                                "teachers": teachers, "base": base_ref, "files": files})
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        run = _distil(data, encoders, base_ref, config, ckpt)
        metrics = _test_metrics(run.student, data.test, teachers, encoders, base_ref, config) if data.test else None
    finally:
        torch.set_num_threads(threads)
    info = {"trainer": TRAINER, "config": hyperparameters(config), "teachers": teachers, "base": base_ref,
            "data": {"corpus": {"files": [str(f) for f in corpus_files], "sentences": len(data.sentences)},
                     "dev": {"files": dev_files, "kind": run.metric, "size": data.dev_size},
                     "test": {"files": test_files, "pairs": len(data.test) if data.test is not None else 0}},
            "training": run.training_info()}
    if metrics is not None:
        info["metrics"] = metrics
    operators = dict(base_bundle.operators) if base_bundle is not None else {}
    heads = dict(base_bundle.heads) if base_bundle is not None else {}  # kept with the operators they serve
    enc = {"model": model_of(base_ref), "pooling": "mean", "max_length": config.max_length, "dim": run.student.dim}
    return Bundle(encoder=enc, operators=operators, heads=heads, info=info), run.student


def _distil(data: _Data, encoders, base_ref: str, config: DistillConfig, ckpt: Checkpoint | None) -> _Run:
    """Targets, then epochs until done (resuming from ``ckpt``); the student ends at its best epoch."""
    import torch

    targets = teacher_targets(encoders, data.sentences, cache_dir=config.cache_dir, progress=config.progress)
    dev_targets = (teacher_targets(encoders, data.dev_sentences, cache_dir=config.cache_dir,
                                   progress=config.progress) if data.dev_sentences else None)
    run = _Run(config, data, model_of(base_ref), dev_targets)
    if run.student.dim != encoders[0].dim:
        raise ValueError(f"student {base_ref} has dimension {run.student.dim}, the teachers {encoders[0].dim}")
    run.start(ckpt)
    steps_per_epoch = -(-len(data.sentences) // config.batch_size)
    bar = _tqdm(total=config.epochs * steps_per_epoch, initial=run.epoch * steps_per_epoch, desc="distill",
                unit="step", disable=not config.progress)
    target_t = torch.from_numpy(targets)
    while not run.done and run.epoch < config.epochs:
        if not run.budget.allows():  # an epoch and its dev evaluation must fit
            run.stopped_by = "time budget"
            break
        t0, b0 = time.time(), run.budget.clock()
        run.epoch += 1
        run.end_epoch(run.train_epoch(target_t, bar), bar)
        run.seconds += time.time() - t0
        run.budget.unit_done(run.budget.clock() - b0)
        if ckpt is not None:
            run.save(ckpt)
    bar.close()
    if run.stopper.best_step != run.epoch:  # an earlier epoch was better: go back to it
        run.student.load_state_dict(run.best_state)
    run.student.train(False)
    return run


def _test_metrics(student, test: STSPairs, teachers: list[str], encoders, base_ref: str,
                  config: DistillConfig) -> dict:
    """Test STS Spearman of the student, each teacher, their mean, the ensemble and the base."""
    metrics = {"split": "test", "metric": "spearman", "protocol": "STS: Spearman of cos(a, b) vs score",
               "pairs": len(test), "files": test.files}
    metrics["student"] = round(sts_spearman(student.embed(test.a), student.embed(test.b), test.score), 5)
    texts = test.a + test.b
    per_teacher = [encode_cached(e, texts, cache_dir=config.cache_dir, progress=False) for e in encoders]
    n = len(test)
    metrics["teachers"] = {t: round(sts_spearman(v[:n], v[n:], test.score), 5) for t, v in zip(teachers, per_teacher)}
    metrics["teachers_mean"] = round(float(np.mean(list(metrics["teachers"].values()))), 5)
    ens = np.mean(per_teacher, axis=0)
    metrics["ensemble"] = round(sts_spearman(ens[:n], ens[n:], test.score), 5)
    base_model = model_of(base_ref)  # the student before distillation (a teacher by default)
    same = [t for t, e in zip(teachers, encoders) if e.config.model == base_model]
    if same:
        metrics["base"] = metrics["teachers"][same[0]]
    else:
        from ..model import Encoder, EncoderConfig

        base_encoder = Encoder(EncoderConfig(model=base_model, pooling="mean", max_length=config.max_length))
        v = encode_cached(base_encoder, texts, cache_dir=config.cache_dir, progress=False)
        metrics["base"] = round(sts_spearman(v[:n], v[n:], test.score), 5)
    return metrics
