"""`relsearch bench train-speed`: the project's trainer vs a minimal hand-written loop, in one process.

design.md §5: trainers must run near the speed of a minimal hand-written loop of the same model.
Both sides here train the same model (all-MiniLM-L6-v2; for ``--regime encoder`` the same
parameters: the tower's default, the whole weights of the top 3 layers, eager attention, no
dropout), on the same triples, in batches of the same size, at the same max length and in the same
dtype (the trainer's own choice, :func:`~relsearch.encoder.precision.bf16_choice`), with the
same torch threads:

- **trainer**: ``train_tower`` / ``train_joint`` as ``relsearch train`` runs it — one epoch, with a
  dev set, so its evaluations count (dev at the epoch's end; step 0's evaluation and the final test
  metrics are reported apart, as setup);
- **hand loop**: a tokenizer, the model under autocast, mean pooling, the softmax over the same
  candidates, ``backward``, AdamW — nothing else (no masks, margins, schedules, checkpoints or
  evaluation). Encoder regime: one forward per distinct query against the frozen table (as the
  trainer); joint regime: heads, tails and one random tail per triple, a translation per relation.

The hand loop runs before and after the trainer and its rate is the mean of the two (load from
other jobs on a shared machine hits both sides alike). The ratio is trainer ÷ hand loop in
triples per second; design target ≥ 0.70.
"""
from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from ..encoder.kinds import kind_of
from .report import machine_info

DEFAULT_DATA = Path(os.environ.get("RELSEARCH_DATA", "../shared/data"))
REGIMES = ("encoder", "joint")
DEFAULT_BATCH = {"encoder": 128, "joint": 64}  # joint: the trainer's default batch
TARGET = 0.70


def _read(path, n: int | None = None) -> list[dict]:
    from ..encoder.training.data import read_triples

    triples = [{"head": t.head, "relation": t.relation, "tail": t.tail} for t in read_triples(path)]
    return triples[:n] if n else triples


def default_files(data_dir: Path = DEFAULT_DATA) -> tuple[Path, Path]:
    """MSRP paraphrase triples (train, dev): real sentences, nearly every head distinct."""
    train, dev = data_dir / "msrp" / "triples" / "train.jsonl", data_dir / "msrp" / "triples" / "dev.jsonl"
    if not train.is_file():
        raise ValueError(f"{train} does not exist; give TRAIN (and --dev) or set RELSEARCH_DATA")
    return train, dev


# ------------------------------------------------------------------------------ hand loops
def _hand_model(lora_rank: int | None, layers: int | None = None):
    """all-MiniLM-L6-v2 in fp32 (train mode), with the tower's LoRA deltas when ``lora_rank``; with
    ``layers``, the query tower's defaults instead: the whole weights of the top ``layers`` layers
    tuned, eager attention, no dropout."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from ..encoder.model import resolve_model_path

    path = resolve_model_path("all-MiniLM-L6-v2")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    if layers:
        from ..encoder.training.tower_weights import tune_whole_weights, tuned_layers

        tune_whole_weights(model, tuned_layers(model, layers))
        model.set_attn_implementation("eager")
        return tok, model.eval()
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        from ..encoder.training.tower_weights import LORA_TARGETS

        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                 target_modules=list(LORA_TARGETS)))
    return tok, model.train()


def _pooled(tok, model, texts: list[str], max_length: int, dtype):
    import contextlib

    import torch

    batch = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    ctx = contextlib.nullcontext() if dtype == torch.float32 else torch.autocast("cpu", dtype=dtype)
    with ctx:
        hidden = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    return (hidden.float() * m).sum(1) / m.sum(1)


def hand_tower(triples: list[dict], table_texts: list[str], table: np.ndarray, *, batch_size: int, max_length: int,
               dtype, lora_rank: int = 0, layers: int = 3, lr: float = 3e-4, seed: int = 13) -> tuple[float, float]:
    """(wall, CPU) seconds of one epoch of the minimal query-tower loop over ``triples`` (``table``: unit vectors)."""
    import torch
    import torch.nn.functional as F

    from ..encoder.tower import MARKER, marked

    torch.manual_seed(seed)
    tok, model = _hand_model(lora_rank, None if lora_rank else layers)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    col = {t: i for i, t in enumerate(table_texts)}
    table_t = torch.from_numpy(table)
    order = np.random.default_rng(seed).permutation(len(triples))
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(order), batch_size):
        rows = [triples[i] for i in order[start:start + batch_size]]
        queries, inverse = np.unique([marked(MARKER, r["relation"], [r["head"]])[0] for r in rows],
                                     return_inverse=True)
        q = F.normalize(_pooled(tok, model, queries.tolist(), max_length, dtype), dim=-1)[torch.from_numpy(inverse)]
        gold = torch.tensor([col[r["tail"]] for r in rows])
        loss = F.cross_entropy(q @ table_t.T / 0.05, gold)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, time.process_time() - c0


def hand_joint(triples: list[dict], *, batch_size: int, max_length: int, dtype, lr: float = 2e-5,
               relation_lr: float = 1e-2, seed: int = 13) -> tuple[float, float]:
    """(wall, CPU) seconds of one epoch of the minimal joint loop: heads, tails and a random tail per triple through
    the whole encoder, a translation vector per relation, softmax over the batch's tails and negatives."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    tok, model = _hand_model(None)
    rels = sorted({t["relation"] for t in triples})
    r = {name: (torch.randn(model.config.hidden_size) * 0.02).requires_grad_() for name in rels}
    opt = torch.optim.AdamW([{"params": list(model.parameters()), "lr": lr},
                             {"params": list(r.values()), "lr": relation_lr}], weight_decay=0.0)
    tails = [t["tail"] for t in triples]
    rng = random.Random(seed)
    order = list(range(len(triples)))
    rng.shuffle(order)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(order), batch_size):
        rows = [triples[i] for i in order[start:start + batch_size]]
        h = _pooled(tok, model, [x["head"] for x in rows], max_length, dtype)
        t = _pooled(tok, model, [x["tail"] for x in rows], max_length, dtype)
        n = _pooled(tok, model, [rng.choice(tails) for _ in rows], max_length, dtype)
        q = F.normalize(h + torch.stack([r[x["relation"]] for x in rows]), dim=-1)
        loss = F.cross_entropy(q @ F.normalize(torch.cat([t, n]), dim=-1).T / 0.05, torch.arange(len(rows)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, time.process_time() - c0


# ------------------------------------------------------------------------------ the run
def run(*, regime: str = "encoder", train: str | os.PathLike | None = None, dev: str | os.PathLike | None = None,
        triples: int = 512, dev_triples: int = 128, batch_size: int | None = None, max_length: int = 32,
        threads: int | None = None,
        data_dir: Path = DEFAULT_DATA, cache_dir: str | None = None) -> dict:
    """Train ``triples`` triples for one epoch with the trainer and with the hand loop; rates and ratio."""
    import torch


    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; choose one of {', '.join(REGIMES)}")
    batch_size = batch_size or DEFAULT_BATCH[regime]
    if train is None:
        train, default_dev = default_files(data_dir)
        dev = default_dev if dev is None else dev
    if threads:
        torch.set_num_threads(threads)
    rows = _read(train, triples)
    if len(rows) < batch_size:
        raise ValueError(f"{train}: {len(rows)} triples, fewer than one batch of {batch_size}")
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp) / "train.jsonl"
        import json

        sub.write_text("".join(json.dumps(r) + "\n" for r in rows))
        devs, dev_n = [], 0
        if dev and dev_triples:
            dev_rows = _read(dev, dev_triples)
            (Path(tmp) / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev_rows))
            devs, dev_n = [str(Path(tmp) / "dev.jsonl")], len(dev_rows)
        cache = cache_dir or str(Path(tmp) / "cache")
        trainer_fn = _trainer_tower if regime == "encoder" else _trainer_joint
        setup = _setup_tower if regime == "encoder" else _setup_joint
        hand = setup(sub, devs, rows, batch_size=batch_size, max_length=max_length, cache=cache)
        hand_before = hand()
        t = time.perf_counter()
        info = trainer_fn(sub, devs, batch_size=batch_size, max_length=max_length, cache=cache)
        trainer_wall = time.perf_counter() - t
        hand_after = hand()
    hand_s, hand_cpu = (hand_before[0] + hand_after[0]) / 2, (hand_before[1] + hand_after[1]) / 2
    n = len(rows)
    trainer_loop_rate = n / info["loop_seconds"] if info["loop_seconds"] else float("nan")
    hand_rate = n / hand_s
    return {
        "machine": machine_info(), "regime": regime, "train": str(train), "dev": str(dev) if dev else None,
        "dev_triples": dev_n, "triples": n, "batch_size": batch_size, "max_length": max_length,
        "precision": info["precision"], "precision_reason": info["precision_reason"],
        "torch_threads": torch.get_num_threads(), "steps": info["steps"],
        "trainer_steps_per_s": n / info["train_seconds"] if info["train_seconds"] else float("nan"),
        "trainer_per_s": trainer_loop_rate, "trainer_loop_seconds": info["loop_seconds"],
        "trainer_setup_seconds": trainer_wall - info["loop_seconds"],
        "hand_per_s": hand_rate, "hand_seconds": [hand_before[0], hand_after[0]],
        "ratio": trainer_loop_rate / hand_rate, "target": TARGET,
        "trainer_cpu_seconds": info["loop_cpu_seconds"], "hand_cpu_seconds": [hand_before[1], hand_after[1]],
        "cpu_ratio": hand_cpu / info["loop_cpu_seconds"] if info["loop_cpu_seconds"] else float("nan"),
    }


def _tower_config(batch_size: int, max_length: int, cache: str):
    from ..encoder.training.tower import TowerConfig

    return TowerConfig(epochs=1, batch_size=batch_size, max_length=max_length, progress=False, cache_dir=cache)


def _trainer_tower(sub, devs, *, batch_size: int, max_length: int, cache: str) -> dict:
    from ..encoder.training.tower import train_tower

    bundle = train_tower([str(sub)], dev_files=devs, config=_tower_config(batch_size, max_length, cache))
    return _timings(next(op for op in bundle.operators.values() if op.needs_text).info["training"])  # the tower


def _trainer_joint(sub, devs, *, batch_size: int, max_length: int, cache: str) -> dict:
    from ..encoder.training.rse_joint import JointConfig, train_joint

    config = JointConfig(epochs=1, batch_size=batch_size, max_length=max_length, progress=False, cache_dir=cache)
    bundle, _ = train_joint([str(sub)], dev_files=devs, config=config)
    return _timings(next(op for op in bundle.operators.values() if not kind_of(op.kind).plain).info["training"])


def _timings(training: dict) -> dict:
    # rounded to 0.1 s in the bundle: fine for runs of tens of seconds
    return {k: training[k] for k in ("loop_seconds", "loop_cpu_seconds", "train_seconds", "steps", "precision",
                                     "precision_reason")}


def _setup_tower(sub, devs, rows, *, batch_size: int, max_length: int, cache: str):
    """The hand loop's inputs, built once (not timed): the trainer's frozen table, same texts and cache."""
    from ..encoder.bundle import load_bundle
    from ..encoder.model import Encoder, EncoderConfig
    from ..encoder.relations import normalize
    from ..encoder.training.cache import encode_cached
    from ..encoder.training.data import load_triple_splits
    from ..encoder.training.finetune import TrainableEncoder
    from ..encoder.training.splits import text_ids

    loaded, _ = load_triple_splits([str(sub)], devs, [])
    texts = list(text_ids(loaded))
    base = load_bundle(None).encoder
    table = normalize(encode_cached(Encoder(EncoderConfig(model=base["model"], max_length=base.get("max_length"))),
                                    texts, cache_dir=cache, progress=False))
    dtype = TrainableEncoder("all-MiniLM-L6-v2", max_length=max_length).autocast_dtype  # the trainer's choice
    return lambda: hand_tower(rows, texts, table, batch_size=batch_size, max_length=max_length, dtype=dtype)


def _setup_joint(sub, devs, rows, *, batch_size: int, max_length: int, cache: str):
    from ..encoder.training.finetune import TrainableEncoder

    dtype = TrainableEncoder("all-MiniLM-L6-v2", max_length=max_length).autocast_dtype
    return lambda: hand_joint(rows, batch_size=batch_size, max_length=max_length, dtype=dtype)


def format_table(r: dict) -> str:
    m = r["machine"]
    verdict = "meets" if r["ratio"] >= r["target"] else "below"
    return "\n".join([
        f"machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch threads {r['torch_threads']}",
        f"train-speed, regime {r['regime']}: {r['triples']} triples of {r['train']}, batch {r['batch_size']}, "
        f"max length {r['max_length']}, {r['precision']} ({r['precision_reason']})",
        f"  trainer, steps only              {r['trainer_steps_per_s']:8.1f} triples/s   ({r['steps']} steps)",
        f"  trainer, steps + dev evaluations {r['trainer_per_s']:8.1f} triples/s   "
        f"({r['dev_triples']} dev triples; setup {r['trainer_setup_seconds']:.1f} s apart)",
        f"  hand-written loop                {r['hand_per_s']:8.1f} triples/s   "
        f"(mean of runs before and after: {r['hand_seconds'][0]:.1f} s, {r['hand_seconds'][1]:.1f} s)",
        f"  ratio trainer / hand loop        {r['ratio']:8.2f}   ({verdict} the {r['target']:.2f} target; "
        f"by CPU time {r['cpu_ratio']:.2f}: hand {r['hand_cpu_seconds'][0]:.1f} / {r['hand_cpu_seconds'][1]:.1f} s, "
        f"trainer {r['trainer_cpu_seconds']:.1f} s)",
    ])
