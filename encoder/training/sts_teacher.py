"""STS teachers: the encoder fine-tuned on STS pairs with CoSENT, one per seed.

Two seeds give two teachers that share architecture and initialisation, the setting ensemble
distillation (:mod:`.distill`) assumes; the tests and the distillation benchmark build theirs here.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from .cache import _tqdm
from .distill_data import read_sts
from .loop import seed_everything, write_bundle


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
