"""PU learning (PAUSE): nnPU maths, annealing on the global step, label subsampling, resumable
training, the pair head in a bundle and as a query-time re-ranker."""
import hashlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.heads import PairHead
from relsearch.encoder.model import EncodeResult
from relsearch.encoder.training import loop
from relsearch.encoder.training.data import Pair
from relsearch.encoder.training.pu import (PUConfig, class_priors, nnpu_risk, pu_term, pu_weight_at,
                                           subsample_labels, train_pu)
from relsearch.retrieval.rerank import rerank
from relsearch.retrieval.search import Hit, Query, QueryError, Searcher

from conftest import shared, write_jsonl


class FakeEncoder:
    """Deterministic text → vector (from a hash): training tests need no transformer."""

    dim = 16
    identity = {"model": "fake", "pooling": "mean", "max_length": 8, "dim": 16, "weights_sha256": "fakepu"}

    def encode(self, texts, *, progress=None):
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=self.dim)
                for t in texts]
        if progress:
            progress(len(texts))
        return EncodeResult(np.array(rows, dtype=np.float32).reshape(-1, self.dim), 0)


def _pairs(n, seed, unlabelled=0):
    """Learnable toy pairs: label "yes" when a and b share their topic word."""
    rng = np.random.default_rng(seed)
    topics = ["cat", "dog", "car", "tree", "boat", "lamp"]
    rows = []
    for i in range(n + unlabelled):
        ta = topics[rng.integers(len(topics))]
        same = rng.random() < 0.4
        tb = ta if same else topics[(topics.index(ta) + 1 + rng.integers(len(topics) - 1)) % len(topics)]
        row = {"a": f"{ta} {i} a", "b": f"{tb} {i} b"}
        if i < n:
            row["label"] = "yes" if same else "no"
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("pu")
    return {s: str(write_jsonl(root / f"{s}.jsonl", _pairs(n, seed, unl)))
            for s, n, seed, unl in (("train", 60, 1, 60), ("dev", 30, 2, 0), ("test", 40, 3, 0))}


def _config(tmp_path, **kw):
    base = dict(positive="yes", epochs=3, batch_size=16, progress=False, cache_dir=str(tmp_path / "cache"), seed=5)
    base.update(kw)
    return PUConfig(**base)


# ------------------------------------------------------------------------------------ the maths
def test_nnpu_risk_hand_example_and_non_negativity_correction():
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    # ordinary case: R = π·mean_P σ(−z) + mean_U σ(z) − π·mean_P σ(z)
    z = torch.tensor([2.0, -1.0, 3.0, 0.5])
    pos = torch.tensor([True, False, False, False])
    unl = ~pos
    r_p, r_n = 0.3 * sig(-2.0), np.mean([sig(-1.0), sig(3.0), sig(0.5)]) - 0.3 * sig(2.0)
    assert r_n > 0
    assert nnpu_risk(z, pos, unl, 0.3).item() == pytest.approx(r_p + r_n, rel=1e-5)
    # unlabelled scored far below the positive: the unbiased R_n⁻ goes negative → the risk is −R_n⁻
    z = torch.tensor([3.0, -4.0, -4.0], requires_grad=True)
    pos, unl = torch.tensor([True, False, False]), torch.tensor([False, True, True])
    r_p, r_n = 0.3 * sig(-3.0), sig(-4.0) - 0.3 * sig(3.0)
    assert r_n < 0 and r_p + r_n < 0  # the unbiased PU risk would be negative
    risk = nnpu_risk(z, pos, unl, 0.3)
    assert risk.item() == pytest.approx(-r_n, rel=1e-5) and risk.item() >= 0
    risk.backward()  # the correction pushes the positive's logit down and the unlabelled ones up
    assert z.grad[0] > 0 and (z.grad[1:] < 0).all()


def test_pu_term_skips_classes_without_positives_and_batches_without_unlabelled():
    logits = torch.zeros(4, 3, requires_grad=True)
    priors = np.array([0.2, 0.3, 0.5])
    y = torch.tensor([0, 0, -1, -1])
    expected = nnpu_risk(logits[:, 0], y == 0, y < 0, 0.2) / 3  # classes 1 and 2: no positives in the batch
    assert pu_term(logits, y, priors, [0, 1, 2]).item() == pytest.approx(expected.item())
    assert pu_term(logits, torch.tensor([0, 1, 2, 0]), priors, [0, 1, 2]).item() == 0.0


def test_class_priors_default_and_override():
    y = np.array([0] * 6 + [1] * 3 + [2] * 1)
    assert class_priors(y, 3, 1, None) == pytest.approx([0.6, 0.3, 0.1])
    assert class_priors(y, 3, 1, 0.5) == pytest.approx([0.5 * 6 / 7, 0.5, 0.5 / 7])


def test_pu_weight_uses_the_global_step(tmp_path, toy):
    cfg = _config(tmp_path, epochs=3, patience=5)
    assert pu_weight_at(0, 10, cfg) == 0 and pu_weight_at(10, 10, cfg) == 1.0
    assert pu_weight_at(5, 10, cfg) == pytest.approx(0.125)  # (t/T)^3
    bundle, _ = train_pu(toy["train"], config=cfg, encoder=FakeEncoder())
    history = bundle.heads["pu-head"].info["training"]["history"]
    per_epoch = 120 // 16 + 1  # 8 steps per epoch, T = 24
    assert [h["step"] for h in history] == [8, 16, 24]
    # not reset per epoch: the weight at each epoch's end is ((epoch·8)/24)^3
    assert [h["pu_weight"] for h in history] == pytest.approx([(e * per_epoch / 24) ** 3 for e in (1, 2, 3)], abs=1e-5)


def test_label_fraction_is_seeded_and_exact():
    pairs = [Pair(f"a{i}", f"b{i}", "x" if i % 3 else "y") for i in range(200)] + [Pair("u", "v", None)] * 7
    kept = subsample_labels(pairs, 0.1, seed=1)
    assert sum(p.label is not None for p in kept) == 20  # exactly round(0.1 × 200)
    assert kept == subsample_labels(pairs, 0.1, seed=1)
    assert kept != subsample_labels(pairs, 0.1, seed=2)
    assert all(p.label is None for p in kept[200:])
    assert all(k.label in (None, p.label) and (k.a, k.b) == (p.a, p.b) for k, p in zip(kept, pairs))
    assert subsample_labels(pairs, None, seed=1) == pairs


# ------------------------------------------------------------------------------ training and bundle
def test_training_is_deterministic_and_the_bundle_round_trips(tmp_path, toy):
    cfg = _config(tmp_path)
    bundle, trainable = train_pu(toy["train"], dev_files=toy["dev"], test_files=toy["test"], config=cfg,
                                 encoder=FakeEncoder())
    assert trainable is None
    again, _ = train_pu(toy["train"], dev_files=toy["dev"], test_files=toy["test"], config=cfg, encoder=FakeEncoder())
    head = bundle.heads["pu-head"]
    for k, v in head.params.items():
        assert np.array_equal(v, again.heads["pu-head"].params[k])
    metrics = head.info["metrics"]
    assert 0 <= metrics["accuracy"] <= 1 and "macro_f1" in metrics and metrics["pairs"] == 40
    op = bundle.operators["pu"]
    P = head.params["P"]
    assert op.kind == "linear" and np.allclose(op.params["W"], P.T @ P, atol=1e-6)
    m = op.info["metrics"]
    assert m["split"] == "test" and set(m["trained"]) == set(m["identity"]) == {"mrr", "hits@1", "hits@10"}
    assert m["queries"] > 0 and m["candidates"] > m["queries"]

    bundle.save(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    entry = manifest["heads"][0]
    assert entry["name"] == "pu-head" and entry["kind"] == "pair-classifier" and entry["labels"] == ["no", "yes"]
    assert entry["positive"] == "yes" and entry["projection"] == "linear" and "accuracy" in entry["info"]["metrics"]
    loaded = load_bundle(str(tmp_path / "b"))
    h = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    assert np.array_equal(loaded.heads["pu-head"].score(h, h[::-1]), head.score(h, h[::-1]))
    assert np.array_equal(loaded.operators["pu"].apply(h), op.apply(h))
    assert loaded.fingerprint == bundle.fingerprint
    from relsearch.cli import cli

    listing = CliRunner().invoke(cli, ["relations", "--model", str(tmp_path / "b")]).output
    assert "pu-head" in listing and f"test accuracy {metrics['accuracy']:.3f}" in listing
    # a bundle without heads still saves and loads as before
    Bundle(encoder=FakeEncoder.identity).save(tmp_path / "plain")
    assert "heads" not in json.loads((tmp_path / "plain" / "bundle.json").read_text())
    assert load_bundle(str(tmp_path / "plain")).heads == {}


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, toy, monkeypatch):
    cfg = _config(tmp_path, epochs=4, patience=10)
    kw = dict(dev_files=toy["dev"], config=cfg)
    straight, _ = train_pu(toy["train"], out=tmp_path / "straight", encoder=FakeEncoder(), **kw)

    original, saves = loop.Checkpoint.save, []

    def interrupted(self, *args, **kwargs):
        original(self, *args, **kwargs)
        saves.append(1)
        if len(saves) == 2:
            raise KeyboardInterrupt  # killed right after the epoch-2 checkpoint

    monkeypatch.setattr(loop.Checkpoint, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_pu(toy["train"], out=tmp_path / "resumed", encoder=FakeEncoder(), **kw)
    monkeypatch.setattr(loop.Checkpoint, "save", original)
    state = json.loads((tmp_path / "resumed.checkpoint" / "state.json").read_text())["progress"]
    assert state["epoch"] == 2 and state["step"] == 16
    resumed, _ = train_pu(toy["train"], out=tmp_path / "resumed", encoder=FakeEncoder(), **kw)
    a, b = straight.heads["pu-head"], resumed.heads["pu-head"]
    assert [h["step"] for h in b.info["training"]["history"]] == [8, 16, 24, 32]
    for k in a.params:
        assert np.array_equal(a.params[k], b.params[k]), k
    # another configuration refuses the checkpoint instead of mixing two runs
    with pytest.raises(ValueError, match="other settings"):
        train_pu(toy["train"], out=tmp_path / "resumed", encoder=FakeEncoder(),
                 dev_files=toy["dev"], config=_config(tmp_path, epochs=4, patience=10, pu_weight=0.5))


def test_bad_input_is_a_clear_error(tmp_path, toy):
    enc = FakeEncoder()
    unlabelled = write_jsonl(tmp_path / "u.jsonl", [{"a": "x", "b": "y"}, {"a": "p", "b": "q"}])
    with pytest.raises(ValueError, match="no labelled pairs"):
        train_pu(unlabelled, config=_config(tmp_path), encoder=enc)
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"a": "x", "b": "y", "label": "maybe"}])
    with pytest.raises(ValueError, match=r"odd.jsonl:1: label 'maybe' of the dev pairs is not in the training data"):
        train_pu(toy["train"], dev_files=odd, config=_config(tmp_path), encoder=enc)
    with pytest.raises(ValueError, match="positive label 'entailment' is not among the training labels no, yes"):
        train_pu(toy["train"], config=_config(tmp_path, positive="entailment"), encoder=enc)
    three = write_jsonl(tmp_path / "three.jsonl", [{"a": "x", "b": "y", "label": c} for c in ("e", "n", "c")])
    with pytest.raises(ValueError, match="name the positive label"):
        train_pu(three, config=_config(tmp_path, positive=None), encoder=enc)
    with pytest.raises(ValueError, match="unknown regime"):
        PUConfig(regime="both")
    with pytest.raises(ValueError, match="label_fraction"):
        PUConfig(label_fraction=0)
    with pytest.raises(ValueError, match="has dimension 16, encoder has 384"):
        Bundle(encoder={"model": "x", "dim": 384},
               heads={"h": PairHead(name="h", labels=("0", "1"), positive="1", params=_probe_head(16, 0).params)})


# ------------------------------------------------------------------------------------ re-ranking
def _probe_head(d: int, j: int) -> PairHead:
    """A head whose P(positive) grows with coordinate j of the *document* vector (v block)."""
    w1 = np.zeros((1, 4 * d), np.float32)
    w1[0, d + j] = 1.0
    return PairHead(name="probe", labels=("0", "1"), positive="1",
                    params={"W1": w1, "b1": np.zeros(1, np.float32), "W2": np.array([[-1.0], [1.0]], np.float32),
                            "b2": np.zeros(2, np.float32)})


class _FakeFiles:
    def __init__(self, vectors, ids):
        self.manifest = SimpleNamespace(dim=vectors.shape[1])
        norms = np.linalg.norm(vectors, axis=1)
        self.vectors = vectors / norms[:, None]
        self.positions = len(vectors)
        docs = {p: {"id": i, "text": f"text {i}", "norm": float(n), "metadata": {}}
                for p, (i, n) in enumerate(zip(ids, norms))}

        class Store:
            def positions(self, wanted):
                return {i: p for p, d in docs.items() for i in wanted if d["id"] == i}

            def get(self, positions):
                return {p: docs[p] for p in positions}

        self.docstore = Store()


def test_rerank_orders_hits_by_head_score_from_stored_raw_vectors():
    rng = np.random.default_rng(3)
    raw = rng.normal(size=(6, 8)).astype(np.float32)
    ids = [f"d{i}" for i in range(6)]
    head = _probe_head(8, 2)
    searcher = type("S", (), {"files": _FakeFiles(raw, ids), "bundle": Bundle(encoder={"dim": 8},
                                                                                 heads={"probe": head})})()
    hits = [Hit(i, 1.0 - 0.1 * n, f"text {i}", {}) for n, i in enumerate(ids)]
    h = rng.normal(size=(1, 8)).astype(np.float32)
    out = rerank(searcher, "probe", h, [hits], k=4)[0]
    expected = head.score(h, raw)  # raw = stored unit vector × norm
    order = np.argsort(-expected)[:4]
    assert [x.id for x in out] == [ids[i] for i in order]
    assert [x.score for x in out] == pytest.approx(expected[order].tolist(), rel=1e-5)
    assert all(x.reranker is not None and x.ann_score == hits[x.ann_rank - 1].score for x in out)
    assert out[0].to_json(1)["ann_rank"] == order[0] + 1
    with pytest.raises(QueryError, match="no re-ranking head 'nope'; heads available: probe"):
        rerank(searcher, "nope", h, [hits], k=4)


def test_cli_query_rerank_reorders_the_ann_top_k(small_index, encoder, tmp_path):
    from relsearch.cli import cli as main

    bundle_dir = tmp_path / "bundle"
    Bundle(encoder=encoder.identity, heads={"probe": _probe_head(384, 7)}).save(bundle_dir)
    runner = CliRunner()
    base = ["query", "software for hospitals", "--index", str(small_index), "--model", str(bundle_dir), "--json"]
    plain = [json.loads(x) for x in runner.invoke(main, base + ["-k", "50"], catch_exceptions=False).output.splitlines()]
    result = runner.invoke(main, base + ["-k", "5", "--rerank", "probe"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    got = [json.loads(x) for x in result.output.splitlines()]
    searcher = Searcher(str(small_index), str(bundle_dir))
    h = searcher.raw_vectors([Query(text="software for hospitals")])
    docs = searcher.files.docstore.get(searcher.files.docstore.positions([x["id"] for x in plain]).values())
    by_id = {d["id"]: searcher.files.vectors[p] * d["norm"] for p, d in docs.items()}
    scores = _probe_head(384, 7).score(h, np.stack([by_id[x["id"]] for x in plain]))
    expected = [plain[i]["id"] for i in np.argsort(-scores, kind="stable")[:5]]
    assert [x["id"] for x in got] == expected  # the head's order over the ANN top 50
    assert [x["id"] for x in got] != [x["id"] for x in plain[:5]]
    assert all(x["ann_score"] == pytest.approx(plain[x["ann_rank"] - 1]["score"], abs=1e-5) for x in got)
    table = runner.invoke(main, base[:-1] + ["-k", "3", "--rerank", "probe"]).output
    assert "ann" in table.splitlines()[0]
    missing = runner.invoke(main, base + ["--rerank", "pu-head"])
    assert missing.exit_code != 0 and "no re-ranking head 'pu-head'" in missing.output
    assert runner.invoke(main, base + ["--rerank", "0"]).exit_code == 0  # a number is still FAISS's rerank depth


# ------------------------------------------------------------------------------------ joint regime
@pytest.mark.slow  # loads and fine-tunes the transformer (~25 s on 2 cores)
def test_joint_regime_fine_tunes_the_encoder(tmp_path, encoder):
    from relsearch.encoder.training.loop import write_bundle

    rows = _pairs(12, 7, unlabelled=4)
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = _config(tmp_path, regime="joint", epochs=1, batch_size=8, max_length=8, device="cpu")
    bundle, trainable = train_pu(train, config=cfg, encoder=encoder)
    assert trainable is not None and bundle.heads["pu-head"].dim == 384
    out = write_bundle(bundle, tmp_path / "joint", encoder=trainable)
    loaded = load_bundle(str(out))
    assert loaded.encoder["path"] == "encoder" and loaded.encoder["weights_sha256"] != encoder.identity["weights_sha256"]
    assert "pu-head" in loaded.heads and "pu" in loaded.operators


# ------------------------------------------------------------------------------------ the issue check
@pytest.mark.slow
def test_sick_ten_percent_labels_pu_at_least_cross_entropy(encoder, tmp_path):
    """Issue 3: SICK, 10% of the train labels, adapter regime: PU accuracy ≥ cross-entropy alone."""
    torch.set_num_threads(1)
    files = {s: str(shared("sick", "pairs", f"{s}.jsonl")) for s in ("train", "dev", "test")}
    acc = {}
    for weight in (0.0, 1.0):
        cfg = PUConfig(positive="entailment", label_fraction=0.1, pu_weight=weight, progress=False, seed=13)
        bundle, _ = train_pu(files["train"], dev_files=files["dev"], test_files=files["test"], config=cfg,
                             encoder=encoder)
        acc[weight] = bundle.heads["pu-head"].info["metrics"]["accuracy"]
    print(f"SICK test accuracy with 10% labels: cross-entropy {acc[0.0]:.4f}, PU {acc[1.0]:.4f}")
    assert acc[1.0] >= acc[0.0]
