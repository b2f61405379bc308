"""Ensemble distillation: readers, teachers' mean targets, student round trip, resume, the STS-B check."""
import json

import numpy as np
import pytest
import torch

from relsearch.encoder.bundle import load_bundle
from relsearch.encoder.model import EncodeResult, Encoder, EncoderConfig
from relsearch.encoder.training.distill import (DistillConfig, distill_card, read_sentences, read_sts,
                                               teacher_targets, train_distill, train_sts_teacher)
from relsearch.encoder.training.loop import write_bundle

from conftest import shared, write_jsonl


class FakeEncoder:
    dim = 4

    def __init__(self, name, scale):
        self.identity = {"model": name, "pooling": "mean", "max_length": 8, "dim": 4, "weights_sha256": name}
        self.scale = scale

    def encode(self, texts, *, progress=None):
        return EncodeResult(np.array([[len(t), self.scale, self.scale * len(t), 1.0] for t in texts],
                                     dtype=np.float32).reshape(-1, 4), 0)


def _sts_rows(split, n):
    rows = [json.loads(line) for line in open(shared("stsb", "pairs", f"{split}.jsonl"))]
    return rows[:n]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A real (1-step) fine-tuned teacher bundle plus tiny corpus / dev / test files."""
    root = tmp_path_factory.mktemp("distill")
    train = write_jsonl(root / "sts-train.jsonl", _sts_rows("train", 16))
    teacher = train_sts_teacher(train, root / "teacher", seed=1, max_pairs=8, batch_size=8, max_length=32,
                                progress=False)
    corpus = write_jsonl(root / "corpus.jsonl", [{"text": r["a"]} for r in _sts_rows("train", 24)[16:]]
                         + [{"a": r["a"], "b": r["b"]} for r in _sts_rows("train", 30)[24:]])
    dev = write_jsonl(root / "dev.jsonl", _sts_rows("dev", 12))
    test = write_jsonl(root / "test.jsonl", _sts_rows("test", 12))
    return {"root": root, "teacher": str(teacher), "corpus": str(corpus), "dev": str(dev), "test": str(test),
            "cache": str(root / "cache")}


def _cfg(tiny, **kw):
    base = dict(epochs=1, batch_size=8, max_length=32, progress=False, cache_dir=tiny["cache"])
    base.update(kw)
    return DistillConfig(**base)


# ---------------------------------------------------------------------------------------- inputs
def test_read_sentences_takes_text_pairs_and_triples(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}, {"a": "y", "b": "x", "score": 3}, {"head": "z", "tail": "w"},
                                          {"body": "v"}])
    with pytest.raises(ValueError, match=r"c\.jsonl:4: no sentence field.*'text' \(set --text-field\)"):
        read_sentences([f])
    h = write_jsonl(tmp_path / "h.jsonl", [{"body": "v"}, {"a": "y", "b": "x", "score": 3}, {"head": "z", "tail": "y"},
                                          {"body": "v"}])
    assert read_sentences([h], text_field="body") == ["v", "y", "x", "z"]  # distinct, first-seen order
    g = write_jsonl(tmp_path / "g.jsonl", [{"text": ""}])
    with pytest.raises(ValueError, match=r"g\.jsonl:1: field 'text' must be a non-empty string"):
        read_sentences([g])
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no sentences"):
        read_sentences([tmp_path / "e.jsonl"])


def test_read_sts_errors_name_file_and_line(tmp_path):
    f = write_jsonl(tmp_path / "s.jsonl", [{"a": "x", "b": "y", "score": 1}, {"a": "x", "b": "y"}])
    with pytest.raises(ValueError, match=r"s\.jsonl:2: missing field\(s\) score"):
        read_sts([f])
    g = write_jsonl(tmp_path / "t.jsonl", [{"a": "x", "b": "y", "score": "high"}])
    with pytest.raises(ValueError, match=r"t\.jsonl:1: field 'score' must be a number"):
        read_sts([g])


def test_targets_are_the_teachers_mean(tmp_path, tiny):
    fakes = [FakeEncoder("t1", 1.0), FakeEncoder("t2", 3.0)]
    got = teacher_targets(fakes, ["ab", "abcd"], cache_dir=str(tmp_path), progress=False)
    np.testing.assert_allclose(got, [[2, 2, 4, 1], [4, 2, 8, 1]])
    # with the real teachers: the mean of what each teacher's own inference encoder gives
    from relsearch.encoder.training.distill import load_teachers

    teachers = load_teachers(["all-MiniLM-L6-v2", tiny["teacher"]], max_length=32)
    texts = read_sentences([tiny["corpus"]])[:6]
    each = [t.encode(texts).vectors for t in teachers]
    assert not np.allclose(each[0], each[1])  # the fine-tuned teacher really differs
    np.testing.assert_allclose(teacher_targets(teachers, texts, cache_dir=tiny["cache"], progress=False),
                               (each[0] + each[1]) / 2, atol=1e-5)


def test_teachers_with_other_dimensions_are_refused(tmp_path, tiny):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from relsearch.encoder.model import resolve_model_path

    small = tmp_path / "small-bert"
    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
              ).save_pretrained(small)
    AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2")).save_pretrained(small)
    with pytest.raises(ValueError, match=r"teachers have different dimensions \(all-MiniLM-L6-v2: 384, .*: 32\)"):
        train_distill([tiny["corpus"]], teachers=["all-MiniLM-L6-v2", str(small)], config=_cfg(tiny))
    with pytest.raises(ValueError, match="at least one teacher"):
        train_distill([tiny["corpus"]], teachers=[], config=_cfg(tiny))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"sentence": "x"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: no sentence field"):
        train_distill([str(bad)], teachers=[tiny["teacher"]], config=_cfg(tiny))


# -------------------------------------------------------------------------------------- training
def test_student_round_trip_and_metrics(tmp_path, tiny):
    bundle, student = train_distill([tiny["corpus"]], teachers=["all-MiniLM-L6-v2", tiny["teacher"]],
                                    dev_files=[tiny["dev"]], test_files=[tiny["test"]], config=_cfg(tiny),
                                    out=tmp_path / "student")
    m = bundle.info["metrics"]
    assert set(m["teachers"]) == {"all-MiniLM-L6-v2", tiny["teacher"]} and m["pairs"] == 12
    assert m["teachers_mean"] == pytest.approx(np.mean(list(m["teachers"].values())), abs=1e-5)
    assert -1 <= m["student"] <= 1 and -1 <= m["ensemble"] <= 1
    assert m["base"] == m["teachers"]["all-MiniLM-L6-v2"]  # the student starts from the first teacher
    tr = bundle.info["training"]
    assert tr["dev_metric"] == "spearman" and tr["epochs_run"] == 1 and bundle.info["base"] == "all-MiniLM-L6-v2"
    assert set(bundle.operators) == {"identity"}
    card = distill_card(bundle)
    assert "| **student** |" in card and "mean of the teachers" in card
    path = write_bundle(bundle, tmp_path / "student", encoder=student, card=card)
    loaded = load_bundle(str(path))
    assert loaded.info["metrics"] == m and (path / "encoder" / "model.safetensors").is_file()
    enc = Encoder(EncoderConfig(model=loaded.encoder["model"]))
    assert enc.max_length == 32 and enc.pooling == "mean"
    texts = read_sentences([tiny["corpus"]])[:8]
    a, b = enc.encode(texts).vectors, student.embed(texts)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.995  # bf16 (where the CPU has it) on both paths
    assert np.abs(np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1) - 1).max() < 0.02


def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path, tiny, monkeypatch):
    from relsearch.encoder.training import distill

    kw = dict(teachers=["all-MiniLM-L6-v2", tiny["teacher"]], config=_cfg(tiny, epochs=2, patience=5),
              dev_files=[tiny["corpus"]])  # unlabelled dev: MSE to the teachers' mean
    _, full = train_distill([tiny["corpus"]], out=tmp_path / "a", **kw)
    real = distill.Checkpoint.save
    saves = {"n": 0}

    def dies_after_first_epoch(self, *a, **k):
        real(self, *a, **k)
        saves["n"] += 1
        raise KeyboardInterrupt

    monkeypatch.setattr(distill.Checkpoint, "save", dies_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        train_distill([tiny["corpus"]], out=tmp_path / "b", **kw)
    monkeypatch.setattr(distill.Checkpoint, "save", real)
    bundle, resumed = train_distill([tiny["corpus"]], out=tmp_path / "b", **kw)
    assert saves["n"] == 1 and bundle.info["training"]["epochs_run"] == 2
    assert bundle.info["training"]["dev_metric"] == "mse"
    sa, sb = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------ the check (slow)
@pytest.mark.slow
def test_stsb_student_matches_or_beats_its_teachers(tmp_path):
    """Two STS-B teachers (seeds 1, 2) → student on unlabelled STS-B train + SICK sentences.

    The student starts from the *base* encoder, not from a teacher: started from teacher 1 the
    student barely moves (the teachers are close to each other) and early stopping keeps epoch 0,
    so "student ≥ mean of teachers" would hold only because teacher 1 is the better teacher.
    """
    torch.set_num_threads(1)
    train = shared("stsb", "pairs", "train.jsonl")
    teachers = [str(train_sts_teacher(train, tmp_path / f"teacher{s}", seed=s, max_pairs=2000, threads=1,
                                      progress=False)) for s in (1, 2)]
    corpus = [str(train), str(shared("sick", "pairs", "train.jsonl"))]
    bundle, student = train_distill(corpus, teachers=teachers, dev_files=[str(shared("stsb", "pairs", "dev.jsonl"))],
                                    test_files=[str(shared("stsb", "pairs", "test.jsonl"))], out=tmp_path / "student",
                                    base="all-MiniLM-L6-v2",
                                    config=DistillConfig(max_sentences=6000, epochs=2, lr=1e-4, threads=1,
                                                         progress=False))
    m = bundle.info["metrics"]
    print("\nSTS-B test Spearman:", json.dumps(m["teachers"]), "teachers' mean", m["teachers_mean"],
          "ensemble", m["ensemble"], "base", m["base"], "student", m["student"], "\ntraining", json.dumps(bundle.info["training"]))
    assert bundle.info["training"]["best_epoch"] > 0  # distillation itself, not the starting point
    assert m["student"] >= m["teachers_mean"]
