"""Sentence ensemble distillation (design.md §4, seed: "Sentence Ensemble Distillation").

A student encoder learns the MSE to the mean of several teachers' *raw* mean-pooled embeddings on
unlabelled sentences. Teachers share architecture and initialisation (e.g. the same encoder
fine-tuned with different seeds — :func:`train_sts_teacher` makes such teachers); averaging
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
   encoder — the teachers' common starting point; bf16 autocast where the hardware has it) is trained with MSE to the targets (Adam,
   lr 2e-5, batch 64, max length 64, no warm-up or weight decay);
4. after every epoch: dev score and a checkpoint (student weights, optimizer, torch RNG); early
   stopping keeps the best epoch. Dev is an STS pairs file (``{"a", "b", "score"}``: Spearman of
   cosine vs score, higher is better) or, without scores, sentences (MSE to the teachers' mean,
   lower is better). Epoch 0 is the starting student.
5. test STS Spearman of the student, of each teacher, of the teachers' mean embedding (the
   ensemble itself) and of the base (the student before distillation) go to
   ``bundle.info["metrics"]``: ``{"split", "metric": "spearman", "protocol", "pairs", "files",
   "student", "teachers": {ref: ρ}, "teachers_mean", "ensemble", "base"}``.

The returned bundle carries the base bundle's operators and re-ranking heads (or identity only); the caller writes it
with ``loop.write_bundle(bundle, out, encoder=student, card=...)``, which stores the student's
weights under ``OUT/encoder/`` (indexes of the old encoder must be rebuilt).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..bundle import Bundle, is_bundle, load_bundle
from .cache import _tqdm, encode_cached
from .data import iter_jsonl
from .loop import Checkpoint, EarlyStopping, seed_everything, write_bundle

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

    def __post_init__(self):
        if self.epochs < 0 or self.batch_size < 1 or self.patience < 1 or self.lr <= 0 or self.max_length < 2:
            raise ValueError("epochs must be ≥ 0, batch_size and patience ≥ 1, lr > 0, max_length ≥ 2")
        if self.max_sentences is not None and self.max_sentences < 1:
            raise ValueError("max_sentences must be ≥ 1")


def hyperparameters(config: DistillConfig) -> dict:
    d = dataclasses.asdict(config)
    for k in ("cache_dir", "progress", "threads", "device"):
        d.pop(k)
    return d


# ------------------------------------------------------------------------------------------ data
def read_sentences(files, *, text_field: str = "text") -> list[str]:
    """Distinct sentences of corpus files, in first-seen order (see the module docstring for the fields)."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out: dict[str, None] = {}
    for f in files:
        n = 0
        for where, rec in iter_jsonl(f, "corpus"):
            if text_field in rec:
                fields = (text_field,)
            elif "a" in rec and "b" in rec:
                fields = ("a", "b")
            elif "head" in rec and "tail" in rec:
                fields = ("head", "tail")
            else:
                raise ValueError(f"{where}: no sentence field: need {text_field!r} (set --text-field), "
                                 f"or 'a' and 'b' (pairs), or 'head' and 'tail' (triples)")
            for k in fields:
                if not isinstance(rec[k], str) or not rec[k].strip():
                    raise ValueError(f"{where}: field {k!r} must be a non-empty string")
                out.setdefault(rec[k], None)
            n += 1
        if n == 0:
            raise ValueError(f"{f}: no sentences (empty file)")
    return list(out)


@dataclass(frozen=True)
class STSPairs:
    a: list[str]
    b: list[str]
    score: np.ndarray
    files: list[str]

    def __len__(self):
        return len(self.a)


def is_sts_file(path) -> bool:
    """True when the first record of ``path`` has ``a``, ``b`` and ``score``."""
    for _, rec in iter_jsonl(path, "STS pairs"):
        return all(k in rec for k in ("a", "b", "score"))
    return False


def read_sts(files) -> STSPairs:
    """STS pairs ``{"a", "b", "score"}`` (score any number, e.g. 0–5); every problem names file:line."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    a, b, s = [], [], []
    for f in files:
        n = 0
        for where, rec in iter_jsonl(f, "STS pairs"):
            missing = [k for k in ("a", "b", "score") if k not in rec]
            if missing:
                raise ValueError(f"{where}: missing field(s) {', '.join(missing)} (an STS pairs file needs a, b, score)")
            for k in ("a", "b"):
                if not isinstance(rec[k], str) or not rec[k].strip():
                    raise ValueError(f"{where}: field {k!r} must be a non-empty string")
            if isinstance(rec["score"], bool) or not isinstance(rec["score"], (int, float)):
                raise ValueError(f"{where}: field 'score' must be a number")
            a.append(rec["a"])
            b.append(rec["b"])
            s.append(float(rec["score"]))
            n += 1
        if n == 0:
            raise ValueError(f"{f}: no pairs (empty file)")
    return STSPairs(a, b, np.array(s, dtype=np.float64), [str(f) for f in files])


def sts_spearman(vectors_a: np.ndarray, vectors_b: np.ndarray, score: np.ndarray) -> float:
    """Spearman correlation of cos(a, b) with the gold scores."""
    from scipy.stats import spearmanr

    na = vectors_a / np.maximum(np.linalg.norm(vectors_a, axis=1, keepdims=True), 1e-12)
    nb = vectors_b / np.maximum(np.linalg.norm(vectors_b, axis=1, keepdims=True), 1e-12)
    return float(spearmanr((na * nb).sum(1), score).statistic)


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
def train_distill(corpus_files, *, teachers: list[str], dev_files=(), test_files=(),
                  config: DistillConfig = DistillConfig(), base=None, out=None):
    """Distil the teachers' mean embedding into a student; returns ``(bundle, student TrainableEncoder)``.

    ``teachers``: bundle folders or model ids/paths. ``base``: the student's starting point (bundle
    or model; default the first teacher); its bundle operators are carried over. ``out``: where the
    caller will write the bundle — only used for the resumable checkpoint ``OUT.checkpoint/``.
    """
    import torch
    import torch.nn.functional as F

    from .finetune import TrainableEncoder

    teachers = [str(t) for t in teachers]
    if isinstance(corpus_files, (str, os.PathLike)):
        corpus_files = [corpus_files]
    if not corpus_files:
        raise ValueError("no corpus files given")
    sentences = read_sentences(corpus_files, text_field=config.text_field)
    if config.max_sentences and len(sentences) > config.max_sentences:
        keep = np.sort(np.random.default_rng([config.seed, 1]).choice(len(sentences), config.max_sentences,
                                                                       replace=False))
        sentences = [sentences[i] for i in keep]
    dev_files, test_files = list(dev_files), list(test_files)
    dev_sts = None
    dev_sentences: list[str] = []
    if dev_files:
        kinds = {is_sts_file(f) for f in dev_files}
        if len(kinds) > 1:
            raise ValueError("dev files mix STS pairs (a, b, score) and unlabelled sentences; use one kind")
        if kinds.pop():
            dev_sts = read_sts(dev_files)
        else:
            dev_sentences = read_sentences(dev_files, text_field=config.text_field)
    test = read_sts(test_files) if test_files else None

    encoders = load_teachers(teachers, max_length=config.max_length)
    # Teachers share an initialisation; by default the student starts there too (the default encoder),
    # not from one teacher, which would start it at that teacher's optimum (measured: it never moves).
    base_ref = str(base) if base is not None else load_bundle(None).encoder["model"]
    base_bundle = load_bundle(base_ref) if is_bundle(base_ref) else None
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        targets = teacher_targets(encoders, sentences, cache_dir=config.cache_dir, progress=config.progress)
        dev_targets = (teacher_targets(encoders, dev_sentences, cache_dir=config.cache_dir, progress=config.progress)
                       if dev_sentences else None)
        seed_everything(config.seed)  # dropout draws come from torch's global generator
        student = TrainableEncoder(model_of(base_ref), pooling="mean", max_length=config.max_length,
                                   device=config.device)
        if student.dim != encoders[0].dim:
            raise ValueError(f"student {base_ref} has dimension {student.dim}, the teachers {encoders[0].dim}")
        student.train(config.dropout)
        opt = torch.optim.Adam(student.parameters(), lr=config.lr)

        def dev_score() -> float:
            if dev_sts is not None:
                return sts_spearman(student.embed(dev_sts.a), student.embed(dev_sts.b), dev_sts.score)
            pred = student.embed(dev_sentences)
            return float(((pred - dev_targets) ** 2).mean())

        has_dev = dev_sts is not None or dev_targets is not None
        metric = "spearman" if dev_sts is not None else ("mse" if has_dev else None)
        stopper = EarlyStopping(config.patience, higher_is_better=metric != "mse")
        ckpt = None
        if out is not None:
            ckpt = Checkpoint(out, {"objective": "distill", "hyperparameters": hyperparameters(config),
                                    "teachers": teachers, "base": base_ref,
                                    "files": {"corpus": [str(f) for f in corpus_files], "dev": dev_files}})
        saved = ckpt.load() if ckpt is not None else None
        history, epoch, done, seconds = [], 0, False, 0.0

        def snapshot() -> dict:
            return {k: v.detach().cpu().clone() for k, v in student.state_dict().items()}

        if saved is not None:
            state, tensors = saved["state"], saved["tensors"]
            student.load_state_dict({k[len("student/"):]: v for k, v in tensors.items() if k.startswith("student/")})
            if saved["optimizer"] is not None:
                opt.load_state_dict(saved["optimizer"])
            torch.set_rng_state(tensors["rng/torch"])
            stopper.restore(state["stopper"])
            history, epoch, done, seconds = state["history"], state["epoch"], state["done"], state["seconds"]
            best_state = ({k[len("best/"):]: v for k, v in tensors.items() if k.startswith("best/")}
                          if stopper.best_step != epoch else snapshot())
        else:
            if has_dev:
                stopper.update(dev_score(), 0)
            best_state = snapshot()

        steps_per_epoch = -(-len(sentences) // config.batch_size)
        bar = _tqdm(total=config.epochs * steps_per_epoch, initial=epoch * steps_per_epoch, desc="distill",
                    unit="step", disable=not config.progress)
        target_t = torch.from_numpy(targets)
        while not done and epoch < config.epochs:
            t0 = time.time()
            epoch += 1
            order = np.random.default_rng([config.seed, epoch]).permutation(len(sentences))
            losses = []
            for start in range(0, len(order), config.batch_size):
                batch = order[start:start + config.batch_size]
                pred = student([sentences[i] for i in batch])
                loss = F.mse_loss(pred, target_t[batch].to(pred.device))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.5f}")
            loss_value = float(np.mean(losses)) if losses else float("nan")
            entry = {"epoch": epoch, "loss": round(loss_value, 6)}
            if has_dev:
                score = dev_score()
                entry[f"dev_{metric}"] = round(score, 6)
                stop = stopper.update(score, epoch)
            else:
                stopper.update(float(epoch), epoch)  # no dev: keep the last epoch
                stop = False
            history.append(entry)
            bar.set_postfix(loss=f"{loss_value:.5f}", **({f"dev_{metric}": f"{entry[f'dev_{metric}']:.4f}"}
                                                         if has_dev else {}))
            if stopper.best_step == epoch:
                best_state = snapshot()
            done = stop or epoch >= config.epochs
            seconds += time.time() - t0
            if ckpt is not None:
                tensors = {f"student/{k}": v for k, v in student.state_dict().items()}
                if stopper.best_step != epoch:  # else the best are the student's own weights: no second copy
                    tensors.update({f"best/{k}": v for k, v in best_state.items()})
                tensors["rng/torch"] = torch.get_rng_state()
                ckpt.save({"epoch": epoch, "done": done, "stopper": stopper.state(), "history": history,
                           "seconds": seconds}, tensors, opt)
        bar.close()
        if stopper.best_step != epoch:  # an earlier epoch was better: go back to it
            student.load_state_dict(best_state)
        student.train(False)

        metrics = None
        if test is not None:
            metrics = {"split": "test", "metric": "spearman", "protocol": "STS: Spearman of cos(a, b) vs score",
                       "pairs": len(test), "files": test.files}
            metrics["student"] = round(sts_spearman(student.embed(test.a), student.embed(test.b), test.score), 5)
            texts = test.a + test.b
            per_teacher = [encode_cached(e, texts, cache_dir=config.cache_dir, progress=False) for e in encoders]
            n = len(test)
            metrics["teachers"] = {t: round(sts_spearman(v[:n], v[n:], test.score), 5)
                                   for t, v in zip(teachers, per_teacher)}
            metrics["teachers_mean"] = round(float(np.mean(list(metrics["teachers"].values()))), 5)
            ens = np.mean(per_teacher, axis=0)
            metrics["ensemble"] = round(sts_spearman(ens[:n], ens[n:], test.score), 5)
            base_model = model_of(base_ref)  # the student before distillation (a teacher by default)
            same = [t for t, e in zip(teachers, encoders) if e.config.model == base_model]
            if same:
                metrics["base"] = metrics["teachers"][same[0]]
            else:
                from ..model import Encoder, EncoderConfig

                v = encode_cached(Encoder(EncoderConfig(model=base_model, pooling="mean", max_length=config.max_length)),
                                  texts, cache_dir=config.cache_dir, progress=False)
                metrics["base"] = round(sts_spearman(v[:n], v[n:], test.score), 5)
    finally:
        torch.set_num_threads(threads)

    training = {"epochs_run": len(history), "best_epoch": stopper.best_step, "seconds": round(seconds, 1),
                "dev_metric": metric, "dev_best": None if not has_dev else round(stopper.best, 6),
                "history": history}
    info = {"trainer": TRAINER, "config": hyperparameters(config), "teachers": teachers, "base": base_ref,
            "data": {"corpus": {"files": [str(f) for f in corpus_files], "sentences": len(sentences)},
                     "dev": {"files": dev_files, "kind": metric,
                             "size": len(dev_sts) if dev_sts is not None else len(dev_sentences)},
                     "test": {"files": test_files, "pairs": len(test) if test is not None else 0}},
            "training": training}
    if metrics is not None:
        info["metrics"] = metrics
    operators = dict(base_bundle.operators) if base_bundle is not None else {}
    heads = dict(base_bundle.heads) if base_bundle is not None else {}  # kept with the operators they serve
    enc = {"model": model_of(base_ref), "pooling": "mean", "max_length": config.max_length, "dim": student.dim}
    return Bundle(encoder=enc, operators=operators, heads=heads, info=info), student


# --------------------------------------------------------------------------- teachers for tests
def cosent_loss(cos, score, scale: float = 20.0):
    """CoSENT: log(1 + Σ_{s_i > s_j} exp(scale·(cos_j − cos_i))) over the batch's pairs."""
    import torch

    diff = scale * (cos[None, :] - cos[:, None])  # [i, j] = scale·(cos_j − cos_i)
    keep = score[:, None] > score[None, :]
    diff = diff.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), dim=0)


def train_sts_teacher(pairs_file, out, *, seed: int, base: str = "all-MiniLM-L6-v2", max_pairs: int | None = 2000,
                      epochs: int = 1, lr: float = 2e-5, batch_size: int = 32, max_length: int = 64,
                      threads: int | None = None, progress: bool = True) -> Path:
    """Fine-tune ``base`` on STS pairs with CoSENT (cos vs score) and write a bundle with its weights.

    Real fine-tuning of a :class:`.finetune.TrainableEncoder` (mean pooling). ``seed`` draws the
    ``max_pairs`` subsample, the batch order and dropout, so two seeds give two teachers that share
    architecture and initialisation — the setting ensemble distillation assumes.
    """
    import torch
    import torch.nn.functional as F

    from .finetune import TrainableEncoder

    pairs = read_sts(pairs_file)
    rows = np.arange(len(pairs))
    if max_pairs and len(rows) > max_pairs:
        rows = np.sort(np.random.default_rng([seed, 2]).choice(len(rows), max_pairs, replace=False))
    threads_before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        seed_everything(seed)
        model = TrainableEncoder(base, pooling="mean", max_length=max_length)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        steps = epochs * -(-len(rows) // batch_size)
        bar = _tqdm(total=steps, desc=f"STS teacher (seed {seed})", unit="step", disable=not progress)
        losses, t0 = [], time.time()
        for epoch in range(1, epochs + 1):
            order = rows[np.random.default_rng([seed, epoch]).permutation(len(rows))]
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                emb = model([pairs.a[i] for i in batch] + [pairs.b[i] for i in batch])
                cos = F.cosine_similarity(emb[:len(batch)], emb[len(batch):], dim=-1)
                loss = cosent_loss(cos, torch.from_numpy(pairs.score[batch]).to(cos))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}")
        bar.close()
    finally:
        torch.set_num_threads(threads_before)
    model.train(False)
    bundle = Bundle(encoder={"model": base, "dim": model.dim},
                    info={"trainer": "relsearch STS teacher (CoSENT fine-tuning)",
                          "config": {"seed": seed, "base": base, "max_pairs": max_pairs, "epochs": epochs, "lr": lr,
                                     "batch_size": batch_size, "max_length": max_length},
                          "data": {"files": [str(pairs_file)], "pairs": int(len(rows))},
                          "training": {"steps": len(losses), "seconds": round(time.time() - t0, 1),
                                       "loss_first": losses[0] if losses else None,
                                       "loss_last": losses[-1] if losses else None}})
    return write_bundle(bundle, out, encoder=model,
                        card=f"# STS teacher (seed {seed})\n\n`{base}` fine-tuned with CoSENT on "
                             f"{len(rows)} pairs of `{pairs_file}` for {epochs} epoch(s).\n")


def distill_card(bundle, *, notes=()) -> str:
    """Markdown model card of a distilled student: teachers, data, hyperparameters, test Spearman."""
    info = bundle.info
    m, tr, data = info.get("metrics"), info.get("training", {}), info.get("data", {})

    def fmt(x):
        return "–" if x is None else f"{x:.4f}"

    lines = ["# relsearch distilled encoder", "",
             "A student encoder trained by `relsearch train --objective distill`: MSE to the mean of its teachers' "
             "raw mean-pooled embeddings on unlabelled sentences. Its weights are in `encoder/`; indexes built "
             "with another encoder must be rebuilt.", "",
             f"- Base (start of the student): `{info.get('base')}`",
             "- Teachers: " + ", ".join(f"`{t}`" for t in info.get("teachers", [])),
             f"- Corpus: {data.get('corpus', {}).get('sentences', 0)} sentences from "
             + ", ".join(data.get("corpus", {}).get("files", [])),
             "- Hyperparameters: " + ", ".join(f"{k} = {v}" for k, v in info.get("config", {}).items()),
             f"- Training: {tr.get('epochs_run')} epoch(s), best epoch {tr.get('best_epoch')} on dev "
             f"{tr.get('dev_metric') or '(none: last epoch kept)'} {fmt(tr.get('dev_best'))}", ""]
    if m:
        lines += ["## Test (STS, Spearman of cosine vs score)", "", f"{m['pairs']} pairs: {', '.join(m['files'])}", "",
                  "| model | Spearman |", "|---|---|"]
        lines += [f"| teacher `{t}` | {fmt(v)} |" for t, v in m["teachers"].items()]
        lines += [f"| mean of the teachers | {fmt(m['teachers_mean'])} |",
                  f"| ensemble (teachers' mean embedding) | {fmt(m['ensemble'])} |",
                  f"| base, before distillation | {fmt(m.get('base'))} |",
                  f"| **student** | **{fmt(m['student'])}** |", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
