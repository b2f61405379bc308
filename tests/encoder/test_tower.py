"""Query towers (operators of kind ``encoder``): the recipe's pieces, the LoRA merge, the bundle, one
contract over every operator kind, serving through an index built with the plain base encoder
(text, --id, mixtures, --explain, score, the Elasticsearch backend), and a tiny real training run."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.relations import KINDS, Operator, mixture_query, normalize
from relsearch.encoder.tower import MARKER, attach_towers, marked
from relsearch.encoder.training.loop import write_bundle
from relsearch.encoder.training.tower import (TowerConfig, _Data, even_batches, lr_factor, query_groups, tower_loss,
                                              train_tower)
from relsearch.encoder.training.tower_weights import tune_whole_weights, tuned_layers, whole_deltas
from relsearch.retrieval.pair import score_pair
from relsearch.retrieval.search import Query, Searcher

from conftest import write_jsonl

MODULE = "encoder.layer.0.attention.self.query"
PAIRS = [("A cat sits on the mat.", "A cat is sitting on a mat."), ("Dogs run in the park.", "The dogs are running."),
         ("It rains all day.", "Rain is falling."), ("He eats an apple.", "He is eating fruit."),
         ("She sings a song.", "She is singing."), ("The car is red.", "A red automobile.")]


def tower_op(encoder, name="para", scale=4.0, seed=0) -> Operator:
    """A query encoder with random LoRA deltas on one attention matrix of the base encoder."""
    rng = np.random.default_rng(seed)
    params = {f"{MODULE}.lora_A": rng.normal(0, 0.05, (2, encoder.dim)).astype(np.float32),
              f"{MODULE}.lora_B": rng.normal(0, 0.05, (encoder.dim, 2)).astype(np.float32)}
    tower = {"name": "t", "marker": MARKER, "scale": scale, "base": encoder.identity["weights_sha256"]}
    return Operator(name=name, kind="encoder", params=params, info={"tower": tower})


# ------------------------------------------------------------------------------ recipe pieces
def test_even_batches_merge_a_tiny_last_batch_and_keep_every_item():
    for n, size in ((10, 4), (9, 4), (1025, 1024), (3, 8), (2048, 1024)):
        batches = even_batches(n, size, np.random.default_rng(0))
        assert sorted(np.concatenate(batches).tolist()) == list(range(n))
        assert all(len(b) >= min(n, size / 2) for b in batches)
    assert [len(b) for b in even_batches(1025, 1024, np.random.default_rng(0))] == [1025]
    assert [len(b) for b in even_batches(10, 4, np.random.default_rng(0))] == [4, 4, 2]


def test_learning_rate_warms_up_linearly_then_decays_to_zero():
    factors = [lr_factor(s, 10, 2) for s in range(10)]
    assert factors[:2] == [0.5, 1.0] and factors[2] == 1.0 and factors[-1] == pytest.approx(1 / 8)
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))
    assert lr_factor(0, 5, 0) == 1.0


def test_tower_loss_is_margin_infonce_with_false_negatives_left_out():
    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0]]), dim=-1)
    c = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), dim=-1)
    gold, mask = torch.tensor([0, 1]), torch.tensor([[False, False, True], [False, False, False]])
    loss = tower_loss(q, c, gold, mask, torch.tensor(20.0), 0.1)
    cos = (q @ c.T).double().numpy()
    row0 = np.array([cos[0, 0] - 0.1, cos[0, 1]]) * 20
    row1 = np.array([cos[1, 0], cos[1, 1] - 0.1, cos[1, 2]]) * 20
    expected = np.mean([np.log(np.exp(row0).sum()) - row0[0], np.log(np.exp(row1).sum()) - row1[1]])
    assert float(loss) == pytest.approx(expected, rel=1e-4)


# ------------------------------------------------------------------------------ operator and bundle
def test_zero_deltas_give_the_base_encoder_on_the_marked_text_and_deltas_change_it(encoder):
    texts = ["How do I reset my password?", "Cloud software for enterprises"]
    zero = tower_op(encoder)
    zero.params[f"{MODULE}.lora_B"][:] = 0
    attach_towers({"para": zero}, encoder)
    np.testing.assert_allclose(zero.apply(None, texts), normalize(encoder.encode(marked(MARKER, "para", texts)).vectors),
                               atol=1e-5)
    op = tower_op(encoder)
    attach_towers({"para": op}, encoder)
    moved = op.apply(None, texts)
    assert np.allclose(np.linalg.norm(moved, axis=1), 1, atol=1e-5)
    assert not np.allclose(moved, zero.apply(None, texts), atol=1e-3)
    # the merge is W + scale · B A on that one module; the base encoder itself is untouched
    base_w = encoder.model.get_submodule(MODULE).weight.float()
    assert torch.equal(base_w, encoder.model.get_submodule(MODULE).weight.float())


def test_query_groups_give_one_forward_per_distinct_relation_and_head():
    data = _Data(["r", "r", "s", "r", "s"], np.array([1, 2, 1, 1, 1]), np.array([5, 6, 7, 8, 9]))
    assert [g.tolist() for g in query_groups(data)] == [[0, 3], [1], [2, 4]]


def test_top_layer_whole_weights_are_served_exactly_by_their_lora_pairs(encoder):
    """Tuning the whole weights of the top layers freezes everything else, and the bundle's full-rank
    pairs (scale 1) make the served tower compute what the tuned model computes."""
    from relsearch.encoder.training.finetune import TrainableEncoder

    tuned = TrainableEncoder(encoder.config.model, max_length=64, precision="fp32")
    layers = tuned_layers(tuned.model, 2)
    assert layers == [4, 5] and tuned_layers(tuned.model, 0) is None and tuned_layers(tuned.model, 6) is None
    weights = tune_whole_weights(tuned.model, layers)
    assert len(weights) == 2 * 6 and all(".layer.4." in k or ".layer.5." in k for k in weights)
    assert {n for n, p in tuned.model.named_parameters() if p.requires_grad} == {f"{k}.weight" for k in weights}
    base = {k: v.detach().clone() for k, v in weights.items()}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for v in weights.values():
            v.add_(torch.randn(v.shape, generator=gen) * 0.02)
    params = whole_deltas(weights, base)
    for k, w in weights.items():  # W0 + B A is the tuned weight, for square, widening and narrowing layers
        np.testing.assert_allclose(base[k].numpy() + params[f"{k}.lora_B"] @ params[f"{k}.lora_A"], w.detach().numpy(),
                                   atol=1e-6)
    tower = {"name": "t", "marker": MARKER, "scale": 1.0, "base": encoder.identity["weights_sha256"]}
    op = Operator(name="para", kind="encoder", params=params, info={"tower": tower})
    attach_towers({"para": op}, encoder)
    texts = ["How do I reset my password?", "Cloud software for enterprises"]
    served, want = op.apply(None, texts), normalize(tuned.embed(marked(MARKER, "para", texts)))
    plain = normalize(encoder.encode(marked(MARKER, "para", texts)).vectors)
    # the serving encoder may run in bf16 (fp32 on CPUs without it); the tuned model here runs in fp32
    assert np.all((served * want).sum(1) > 0.9995) and np.all((served * plain).sum(1) < 0.99)


def test_encoder_operators_refuse_clearly_without_text_tower_or_matching_base(encoder):
    op = tower_op(encoder)
    with pytest.raises(ValueError, match="needs its base transformer"):
        op.apply(np.zeros((1, encoder.dim), np.float32), ["x"])
    attach_towers({"para": op}, encoder)
    with pytest.raises(ValueError, match="needs the query text"):
        op.apply(np.zeros((1, encoder.dim), np.float32))
    other = tower_op(encoder)
    other.info["tower"]["base"] = "0123456789abcdef"
    with pytest.raises(ValueError, match="trained on encoder weights 0123456789abcdef"):
        attach_towers({"para": other}, encoder)
    with pytest.raises(ValueError, match="lacks its query tower"):
        Operator(name="x", kind="encoder", params=op.params, info={})


def test_bundle_stores_a_shared_tower_once_and_round_trips(tmp_path, encoder):
    a, b = tower_op(encoder, "a"), tower_op(encoder, "b")
    bundle = Bundle(encoder=dict(encoder.identity), operators={"a": a, "b": b})
    bundle.save(tmp_path / "b")
    from safetensors.numpy import load_file

    assert sorted(load_file(str(tmp_path / "b" / "operators.safetensors"))) == [
        f"tower:t/{MODULE}.lora_A", f"tower:t/{MODULE}.lora_B"]
    loaded = load_bundle(str(tmp_path / "b"))
    assert loaded.operators["b"].kind == "encoder" and loaded.fingerprint == bundle.fingerprint
    np.testing.assert_array_equal(loaded.operators["a"].params[f"{MODULE}.lora_A"], a.params[f"{MODULE}.lora_A"])
    clash = tower_op(encoder, "c", seed=1)
    with pytest.raises(ValueError, match="different values"):
        Bundle(encoder=dict(encoder.identity), operators={"a": a, "c": clash}).save(tmp_path / "clash")


# ------------------------------------------------------------------------------ one contract, every kind
def _every_kind(encoder) -> dict[str, Operator]:
    d, rng = encoder.dim, np.random.default_rng(3)
    ops = {
        "identity": Operator(name="identity", kind="identity"),
        "translation": Operator(name="translation", kind="translation", params={"r": rng.normal(0, .3, d).astype("f")}),
        "linear": Operator(name="linear", kind="linear", params={"W": (np.eye(d) + rng.normal(0, .05, (d, d))).astype("f"),
                                                                 "b": rng.normal(0, .1, d).astype("f")}),
        "projection": Operator(name="projection", kind="projection",
                               params={"P": (np.eye(d) + rng.normal(0, .05, (d, d))).astype("f")}),
        "encoder": tower_op(encoder, "encoder"),
    }
    assert set(ops) == set(KINDS), "a new operator kind needs a case in this contract"
    return ops


def test_every_operator_kind_keeps_the_operator_contract(tmp_path, encoder):
    """Unit query vectors; a bundle round trip gives the same vectors; a query-side operator mixed with
    identity is the weighted sum of unit vectors (design.md §3); documents stay put unless both-sided."""
    texts = ["Where is ACL 2023?", "ACL 2023 takes place in Toronto."]
    h = encoder.encode(texts).vectors
    ops = _every_kind(encoder)
    Bundle(encoder=dict(encoder.identity), operators=dict(ops)).save(tmp_path / "all")
    loaded = load_bundle(str(tmp_path / "all")).operators
    attach_towers(ops, encoder)
    attach_towers(loaded, encoder)
    unit = normalize(h)
    for kind, op in ops.items():
        q = op.apply(h, texts)
        assert q.shape == h.shape and np.allclose(np.linalg.norm(q, axis=1), 1, atol=1e-5), kind
        np.testing.assert_allclose(loaded[kind].apply(h, texts), q, atol=1e-5, err_msg=kind)
        assert np.array_equal(op.documents(unit), unit) != op.both_sides, kind
        if not op.both_sides and kind != "identity":
            mix = mixture_query({**ops, "identity": ops["identity"]}, h, {kind: 0.3, "identity": 0.7}, texts)
            np.testing.assert_allclose(mix, 0.3 * q + 0.7 * unit, atol=1e-5, err_msg=kind)
        assert op.needs_text == (kind == "encoder")


# ------------------------------------------------------------------------------ serving
@pytest.fixture(scope="module")
def tower_bundle(tmp_path_factory, encoder):
    """A query tower next to the plain default encoder: real LoRA, deltas large enough to move queries."""
    path = tmp_path_factory.mktemp("tower") / "bundle"
    op = tower_op(encoder, "similar")
    write_bundle(Bundle(encoder=dict(encoder.identity), operators={"similar": op}), path)
    return path


def test_an_existing_index_serves_a_query_encoder_for_text_id_mixture_and_explain(small_index, tower_bundle):
    searcher = Searcher(str(small_index), str(tower_bundle))
    text = "cloud software for enterprises"
    hits = searcher.search([Query(text=text, relations={"similar": 1.0})], k=5, explain=True)[0]
    q = searcher.operators["similar"].apply(None, [text])[0]
    t = normalize(np.asarray(searcher.files.vectors))
    order = np.argsort(-(t @ q))[:5]
    docs = searcher.files.docstore.get(order.tolist())
    assert [h.id for h in hits] == [docs[p]["id"] for p in order]  # the index's own vectors, searched exactly
    assert all(h.explain["similar"] == pytest.approx(h.score, abs=1e-4) for h in hits)
    assert all("identity" in h.explain for h in hits)
    # --id re-encodes the stored text through the tower (not the stored vector)
    doc = searcher.files.docstore.get([0])[0]
    qv = searcher.query_vectors([Query(doc_id=doc["id"], relations={"similar": 1.0})]).q
    np.testing.assert_allclose(qv[0], searcher.operators["similar"].apply(None, [doc["text"]])[0], atol=1e-5)
    # a mixture is still one query vector: w · tower + w' · identity
    h, qv, _ = searcher.query_vectors([Query(text=text, relations={"similar": 0.6, "identity": 0.4})])
    np.testing.assert_allclose(qv[0], 0.6 * q + 0.4 * normalize(h)[0], atol=1e-5)


def test_score_and_the_elasticsearch_backend_use_the_tower(small_index, tower_bundle, encoder, monkeypatch):
    bundle = load_bundle(str(tower_bundle))
    scores = score_pair(bundle, encoder, "cloud software", "enterprise software company")
    op = bundle.operators["similar"]
    t = normalize(encoder.encode(["enterprise software company"]).vectors)[0]
    assert scores["similar"] == pytest.approx(float(op.apply(None, ["cloud software"])[0] @ t), abs=1e-5)
    from relsearch.retrieval import es_backend

    sent = []
    monkeypatch.setattr(es_backend, "knn_search", lambda client, name, qv, **kw: sent.append(qv) or [[]])
    searcher = Searcher(str(small_index), str(tower_bundle))
    es = es_backend.EsSearcher(searcher, es_backend.EsQueryOptions(url="http://unused", index="x"), client=object())
    es.search([Query(text="cloud software", relations={"similar": 1.0})], k=3)
    np.testing.assert_allclose(sent[0][0], searcher.operators["similar"].apply(None, ["cloud software"])[0], atol=1e-5)


# ------------------------------------------------------------------------------ training
def test_train_tower_tiny_run_writes_a_bundle_the_cli_queries(tmp_path, small_index):
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    out = tmp_path / "model"
    result = CliRunner().invoke(cli, ["train", str(data), "--regime", "encoder", "--out", str(out), "--test", str(data),
                                      "--epochs", "1", "--batch-size", "4", "--max-length", "16", "--inverse",
                                      "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(str(out))
    assert {n: op.kind for n, op in bundle.operators.items()} == {"identity": "identity", "para": "encoder",
                                                                    "para^-1": "encoder"}
    info = bundle.operators["para"].info
    assert info["training"]["steps"] == 3  # 12 triples (6 + 6 inverse) in batches of 4, none tiny
    assert info["training"]["triples_per_second"] > 0 and info["metrics"]["queries"] == 6
    assert not (tmp_path / "model.checkpoint").exists()
    assert "`query-tower`: whole weights of query, key, value, dense in layers 3, 4, 5" in (
        out / "MODEL_CARD.md").read_text()
    answer = CliRunner().invoke(cli, ["query", "cloud software", "--index", str(small_index), "--model", str(out),
                                      "--relation", "para", "-k", "3", "--json"])
    assert answer.exit_code == 0, answer.output
    assert len([line for line in answer.output.splitlines() if line.startswith("{")]) == 3


def test_train_tower_resumes_after_its_last_checkpoint(tmp_path, monkeypatch):
    from relsearch.encoder.training import finetune, loop

    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = TowerConfig(epochs=1, batch_size=2, max_length=12, eval_every=1, progress=False,
                         cache_dir=str(tmp_path / "cache"))
    real_save, steps = loop.Checkpoint.save, []

    def dies_after_the_first(self, progress, *args, **kw):
        real_save(self, progress, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.Checkpoint, "save", dies_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        train_tower([data], config=config, out=tmp_path / "out")
    monkeypatch.setattr(loop.Checkpoint, "save", real_save)
    real_backward = finetune.chunked_backward
    monkeypatch.setattr(finetune, "chunked_backward", lambda *a, **k: steps.append(1) or real_backward(*a, **k))
    bundle = train_tower([data], config=config, out=tmp_path / "out")
    assert len(steps) == 2 and bundle.operators["para"].info["training"]["steps"] == 3
    assert [h["step"] for h in bundle.operators["para"].info["training"]["history"]] == [0, 1, 2, 3]


def test_train_tower_options_are_checked():
    with pytest.raises(ValueError, match="unknown negatives"):
        TowerConfig(negatives="all")
    with pytest.raises(ValueError, match="warmup"):
        TowerConfig(warmup=1.0)
    result = CliRunner().invoke(cli, ["train", __file__, "--objective", "transition", "--out", "/tmp/x",
                                      "--margin", "0.1"])
    assert result.exit_code != 0 and "--margin does not apply to --objective transition" in result.output


def test_trainer_scores_queries_at_the_length_the_index_reads_them(tmp_path, encoder):
    """Trained on 4-token queries, the tower is served at the base encoder's length: the trainer's test
    MRR must be what the served operator gives, not what 4-token queries give."""
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = TowerConfig(epochs=1, batch_size=3, max_length=4, progress=False, cache_dir=str(tmp_path / "cache"))
    bundle = train_tower([data], test_files=[data], config=config)
    reported = bundle.operators["para"].info["metrics"]["trained"]["mrr"]
    attach_towers(bundle.operators, encoder)
    texts = list(dict.fromkeys(x for pair in PAIRS for x in pair))
    table = normalize(encoder.encode(texts).vectors)
    queries = normalize(bundle.operators["para"].apply(None, [h for h, _ in PAIRS]))
    ranks = []
    for (head, tail), q in zip(PAIRS, queries):
        scores = {t: float(v @ q) for t, v in zip(texts, table) if t != head}  # the query itself is excluded
        ranks.append(1 + sum(s > scores[tail] for s in scores.values()))
    assert reported == pytest.approx(np.mean([1 / r for r in ranks]), abs=1e-4)


def test_training_masks_only_training_answers_never_held_out_ones(tmp_path, monkeypatch):
    """A test triple (head, para, other) must stay a negative for the training row (head, para, tail):
    masking it would spare a held-out answer the push down every other wrong answer gets."""
    from relsearch.encoder.training import tower

    head, other = PAIRS[0][0], PAIRS[1][1]
    train = write_jsonl(tmp_path / "train.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    test = write_jsonl(tmp_path / "test.jsonl", [{"head": head, "relation": "para", "tail": other}])
    masked = []
    real = tower._false_negatives
    monkeypatch.setattr(tower, "_false_negatives", lambda data, rows, cols, known, n: masked.append(
        (data, rows, known)) or real(data, rows, cols, known, n))
    config = TowerConfig(epochs=1, batch_size=6, max_length=12, progress=False, cache_dir=str(tmp_path / "cache"))
    train_tower([train], test_files=[test], config=config)
    data, rows, known = next(m for m in masked if len(m[1]) == len(PAIRS))  # the training step's call
    assert known[("para", int(data.head[0]))] == {int(data.tail[0])}  # row 0 is (head, para, tail)


def test_bundle_json_describes_the_tower(tmp_path, encoder):
    Bundle(encoder=dict(encoder.identity), operators={"p": tower_op(encoder, "p")}).save(tmp_path / "b")
    entry = next(e for e in json.loads((tmp_path / "b" / "bundle.json").read_text())["operators"] if e["name"] == "p")
    assert entry["kind"] == "encoder" and entry["tower"]["marker"] == MARKER


def test_the_python_api_and_http_server_batch_answers_tower_queries(small_index, tower_bundle):
    from relsearch.api import Index, SearchRequest

    index = Index(str(small_index), str(tower_bundle))
    doc = index.searcher().files.docstore.get([0])[0]
    answer = index.search_batch([SearchRequest(text="cloud software", relations={"similar": 1.0}, k=3),
                                 SearchRequest(id=doc["id"], relations={"similar": 0.5, "identity": 0.5}, k=3)])
    searcher = index.searcher()
    one = searcher.search([Query(text="cloud software", relations={"similar": 1.0})], k=3)[0]
    assert [h.id for h in answer.results[0]] == [h.id for h in one]
    assert len(answer.results[1]) == 3 and doc["id"] not in [h.id for h in answer.results[1]]
    assert {r["name"]: r["kind"] for r in index.relations()}["similar"] == "encoder"
