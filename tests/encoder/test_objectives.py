"""Aspect (AspectCSE) and joint RSE training: sampler, resume, bundle round trips, and the issue's checks (slow)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.encoder.bundle import load_bundle
from relsearch.encoder.training import aspect as aspect_mod
from relsearch.encoder.training.aspect import AspectConfig, relevance, train_aspects
from relsearch.encoder.training.data import Labelled
from relsearch.encoder.training.rse_joint import JointConfig, group_aware_batches, train_joint

from conftest import shared, write_jsonl


def test_group_aware_batches_use_every_item_once_and_never_share_a_key():
    rng = random.Random(0)
    keys = [{("g", i % 7), ("t", f"head{i % 11}")} for i in range(200)]
    batches = group_aware_batches(keys, 16, rng)
    assert sorted(i for b in batches for i in b) == list(range(200))
    for b in batches:
        assert len(b) <= 16
        seen = [k for i in b for k in keys[i]]
        assert len(seen) == len(set(seen))


def test_relevance_union_and_intersection_with_multi_valued_labels():
    docs = [Labelled("a", {"s": ("x",), "i": ("1", "2")}), Labelled("b", {"s": ("x",), "i": ("3",)}),
            Labelled("c", {"s": ("y",), "i": ("2",)})]
    union = relevance(docs, ("s", "i"), "union")
    inter = relevance(docs, ("s", "i"), "intersection")
    assert union(0).tolist() == [True, True, True]  # b shares s, c shares industry 2
    assert inter(0).tolist() == [True, False, False]
    assert relevance(docs, ("i",), "union")(2).tolist() == [True, False, True]


@pytest.fixture(scope="module")
def companies(tmp_path_factory):
    """A small Russell 3000 corpus (real descriptions, GICS labels, its own train/dev/test split)."""
    rows = [json.loads(line) for line in open(shared("russell3000_companies", "corpus.jsonl"))]
    keep = {"train": 240, "dev": 80, "test": 80}
    picked = []
    for split, n in keep.items():
        picked += [r for r in rows if r["split"] == split and r.get("text")][:n]
    tmp = tmp_path_factory.mktemp("companies")
    return write_jsonl(tmp / "companies.jsonl", picked), str(tmp / "cache")


def test_aspect_adapter_trains_tests_and_resumes_after_interruption(tmp_path, companies, monkeypatch):
    corpus, cache = companies
    config = AspectConfig(aspects=("gics_sector",), split_field="split", epochs=3, patience=5, progress=False,
                          cache_dir=cache, batch_size=64)
    full, _ = train_aspects([corpus], config=config, out=tmp_path / "full")
    op = full.operators["aspect:gics_sector"]
    m = op.info["metrics"]
    assert op.kind == "linear" and m["metric"] == "p@10" and m["candidates"] == 80
    assert set(m["trained"]) >= {"p@10", "r@10", "mrr@10"} and m["identity"]["p@10"] > 0
    assert [h["epoch"] for h in op.info["training"]["history"]] == [1, 2, 3]

    calls = {"n": 0}
    real = aspect_mod._metrics

    def dies_in_epoch_2(*args, **kwargs):  # dev evaluation: start, epoch 1, then the kill
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(aspect_mod, "_metrics", dies_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train_aspects([corpus], config=config, out=tmp_path / "resumed")
    monkeypatch.setattr(aspect_mod, "_metrics", real)
    resumed, _ = train_aspects([corpus], config=config, out=tmp_path / "resumed")
    np.testing.assert_allclose(resumed.operators["aspect:gics_sector"].params["W"], op.params["W"], atol=1e-6)
    changed = AspectConfig(aspects=("gics_sector",), split_field="split", epochs=4, progress=False, cache_dir=cache)
    with pytest.raises(ValueError, match="checkpoint of a run with other settings"):
        train_aspects([corpus], config=changed, out=tmp_path / "resumed")


def test_aspect_errors_are_clear(tmp_path, companies):
    corpus, cache = companies
    with pytest.raises(ValueError, match="no record has the aspect field"):
        train_aspects([corpus], config=AspectConfig(aspects=("colour",), split_field="split", progress=False))
    with pytest.raises(ValueError, match="needs at least two"):
        AspectConfig(aspects=("gics_sector",), combine="union")
    res = CliRunner().invoke(__import__("relsearch.cli_train", fromlist=["train"]).train,
                             [str(corpus), "--objective", "aspect", "--out", str(tmp_path / "o"), "--quiet"])
    assert res.exit_code != 0 and "--aspect FIELD" in res.output


def test_joint_rse_writes_a_fine_tuned_encoder_that_indexes_must_match(tmp_path, small_index, encoder):
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.training.loop import write_bundle
    from relsearch.retrieval.search import Searcher

    folder = shared("trecqa", "triples")
    rows = [json.loads(line) for line in open(folder / "train.jsonl")][:24]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    dev = write_jsonl(tmp_path / "dev.jsonl", [json.loads(line) for line in open(folder / "dev.jsonl")][:12])
    config = JointConfig(batch_size=8, max_length=16, chunk=8, progress=False, cache_dir=str(tmp_path / "cache"))
    bundle, trained = train_joint([train], dev_files=[dev], config=config, out=tmp_path / "b")
    history = bundle.operators["qa-entailment"].info["training"]["history"]
    assert history[0]["step"] == 0 and history[-1]["step"] >= 1
    path = write_bundle(bundle, tmp_path / "b", encoder=trained)
    loaded = load_bundle(str(path))
    assert loaded.encoder["path"] == "encoder" and (path / "encoder" / "model.safetensors").is_file()
    assert loaded.encoder["weights_sha256"] != encoder.identity["weights_sha256"]
    texts = ["What is the capital of France ?", "Paris is the capital of France ."]
    inference = Encoder(EncoderConfig(model=loaded.encoder["model"], precision="fp32")).encode(texts).vectors
    np.testing.assert_allclose(inference, trained.embed(texts), atol=0.05)  # bf16 autocast vs fp32
    with pytest.raises(Exception, match="(?i)encoder"):
        Searcher(str(small_index), model=str(path))


# ------------------------------------------------------------------- the checks (slow)
@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["trecqa", "meta_se_dupq"])
def test_joint_rse_beats_identity_and_improves_dev(tmp_path, dataset):
    folder = shared(dataset, "triples")
    config = JointConfig(batch_size=64, eval_every=3, progress=False, cache_dir=str(tmp_path / "cache"))
    bundle, _ = train_joint([folder / "train.jsonl"], dev_files=[folder / "dev.jsonl"],
                            test_files=[folder / "test.jsonl"], config=config)
    for name, op in bundle.operators.items():
        if name == "identity":
            continue
        m, tr = op.info["metrics"], op.info["training"]
        print(dataset, name, m["trained"]["mrr"], m["identity"]["mrr"], tr["dev_mrr_start"], tr["dev_mrr"])
        assert m["trained"]["mrr"] > m["identity"]["mrr"]
        assert tr["dev_mrr"] > tr["dev_mrr_start"]


@pytest.mark.slow
def test_aspect_sector_beats_identity_on_russell3000(tmp_path):
    corpus = shared("russell3000_companies", "corpus.jsonl")
    config = AspectConfig(aspects=("gics_sector",), split_field="split", progress=False,
                          cache_dir=str(tmp_path / "cache"))
    bundle, _ = train_aspects([corpus], config=config)
    m = bundle.operators["aspect:gics_sector"].info["metrics"]
    print(m)
    assert m["trained"]["p@10"] > m["identity"]["p@10"]


def test_gradient_caching_gives_the_full_batch_gradient():
    import torch

    from relsearch.encoder.training.finetune import TrainableEncoder, chunked_backward

    enc = TrainableEncoder("all-MiniLM-L6-v2", max_length=16, precision="fp32")
    enc.train(False)  # no dropout: the two passes are then comparable bit for bit in fp32
    heads = ["a cat sits", "stocks fell", "rain tomorrow", "the bank raised rates"]
    tails = ["a kitten rests", "markets dropped", "showers expected", "interest rates went up"]

    def loss_fn(h, t):
        logits = torch.nn.functional.normalize(h, dim=-1) @ torch.nn.functional.normalize(t, dim=-1).T / 0.05
        return torch.nn.functional.cross_entropy(logits, torch.arange(len(h)))

    weight = enc.model.encoder.layer[0].attention.self.query.weight
    loss_fn(enc(heads), enc(tails)).backward()
    full = weight.grad.clone()
    weight.grad = None
    chunked_backward(enc, [heads, tails], loss_fn, chunk=1)
    torch.testing.assert_close(weight.grad, full, rtol=1e-4, atol=1e-6)


def test_projection_aspect_is_searched_exactly_in_its_projected_index(tmp_path, companies, small_index, small_corpus,
                                                                     encoder):
    from relsearch.encoder.bundle import Bundle
    from relsearch.encoder.relations import normalize
    from relsearch.retrieval.search import Query, QueryError, Searcher

    corpus, cache = companies
    config = AspectConfig(aspects=("gics_sector",), split_field="split", epochs=2, project=True, progress=False,
                          cache_dir=cache)
    trained, _ = train_aspects([corpus], config=config)
    op = trained.operators["aspect:gics_sector"]
    assert op.kind == "projection" and op.both_sides and set(op.params) == {"P"}
    assert op.info["metrics"]["trained"]["p@10"] > 0
    path = Bundle(encoder=dict(encoder.identity), operators={op.name: op}).save(tmp_path / "proj")
    searcher = Searcher(str(small_index), model=str(path))
    hits = searcher.search([Query(doc_id="MMM", relations={op.name: 1.0})], k=5, explain=True)[0]
    # brute force over every stored document: cos(P h_q, P t), the query document excluded
    unit = np.asarray(searcher.files.vectors)
    docs = searcher.files.docstore.get(list(range(len(unit))))
    q = op.apply(unit[[p for p in range(len(unit)) if docs[p]["id"] == "MMM"]])[0]
    scores = normalize(unit @ op.params["P"].T) @ q
    order = [docs[p]["id"] for p in np.argsort(-scores) if docs[p]["id"] != "MMM"][:5]
    assert [h.id for h in hits] == order
    assert hits[0].score == pytest.approx(float(np.sort(scores)[-2]), abs=1e-5)
    assert hits[0].explain[op.name] == pytest.approx(hits[0].score, abs=1e-5)
    with pytest.raises(QueryError, match="alone"):
        searcher.search([Query(doc_id="MMM", relations={op.name: 0.5, "identity": 0.5})], k=5)

    # `relsearch index` with this bundle writes the projected copy; queries then read it from disk
    from relsearch.pipelines.index import IndexJob, run_index

    target = tmp_path / "projected-index"
    run_index(IndexJob(input=str(small_corpus), index=str(target), model=str(path), progress=False))
    indexed = Searcher(str(target), model=str(path))
    stored = indexed.files.manifest.projections[op.name]
    assert (indexed.files.root / stored["file"]).is_file() and stored["file"] in indexed.files.manifest.files
    assert isinstance(indexed._projected_vectors(op.name), np.memmap)
    again = indexed.search([Query(doc_id="MMM", relations={op.name: 1.0})], k=5)[0]
    assert [h.id for h in again] == [h.id for h in hits]


def _sector_corpus(path):
    sectors = {"bank": ["A bank that lends money", "A retail bank with branches", "An investment bank"],
               "chips": ["A maker of semiconductors", "A designer of graphics chips", "A memory chip foundry"]}
    return write_jsonl(path, [{"text": t, "theme": s} for s, texts in sectors.items() for t in texts])


def _triples(path):
    pairs = [("A cat sits.", "A cat is sitting."), ("Dogs run.", "The dogs are running."),
             ("It rains.", "Rain is falling."), ("He eats.", "He is eating.")]
    return write_jsonl(path, [{"head": h, "relation": "restates", "tail": t} for h, t in pairs])


@pytest.mark.parametrize("objective", ["aspect", "transition"])
def test_adapter_training_on_a_bundle_keeps_its_heads(tmp_path, objective):
    """An operator may say "re-rank with --rerank pu-head": a bundle trained on top of a bundle with
    heads keeps its operators, so it keeps the heads they refer to."""
    from relsearch.cli_train import train
    from relsearch.encoder.bundle import default_bundle_path, load_bundle
    from relsearch.encoder.heads import PairHead

    pack = load_bundle(default_bundle_path())
    rng = np.random.default_rng(0)
    d = pack.encoder["dim"]
    pack.heads["pu-head"] = PairHead(name="pu-head", labels=("0", "1"), positive="1", params={
        "W1": rng.standard_normal((128, 4 * d)), "b1": np.zeros(128), "W2": rng.standard_normal((2, 128)),
        "b2": np.zeros(2)})
    base = str(pack.save(tmp_path / "base"))
    data = _sector_corpus(tmp_path / "c.jsonl") if objective == "aspect" else _triples(tmp_path / "t.jsonl")
    extra = ["--aspect", "theme"] if objective == "aspect" else []
    out = CliRunner().invoke(train, [str(data), "--objective", objective, *extra, "--base", base,
                                     "--epochs", "1", "--out", str(tmp_path / "b"), "--quiet",
                                     "--cache-dir", str(tmp_path / "cache")])
    assert out.exit_code == 0, out.output
    trained = load_bundle(str(tmp_path / "b"))
    assert set(trained.operators) - set(pack.operators) == {"aspect:theme" if objective == "aspect" else "restates"}
    assert set(trained.heads) == {"pu-head"}
    for key, value in pack.heads["pu-head"].tensors().items():
        np.testing.assert_array_equal(trained.heads["pu-head"].tensors()[key], value)
