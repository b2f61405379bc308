"""Adapter trainer: loss masking, triple parsing, vector cache, and a tiny real training run."""
import hashlib
import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from relsearch.encoder.training import rse as training
from relsearch.encoder.bundle import load_bundle
from relsearch.encoder.model import EncodeResult
from relsearch.encoder.training import TrainConfig, encode_cached, read_triples, rse_loss, train_adapter

from conftest import shared



class FakeEncoder:
    """Deterministic text → vector (from a hash), counting how many texts it encoded."""

    dim = 16
    identity = {"model": "fake", "pooling": "mean", "max_length": 8, "dim": 16, "weights_sha256": "fake0"}

    def __init__(self):
        self.encoded = 0

    def encode(self, texts, *, progress=None):
        self.encoded += len(texts)
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=self.dim)
                for t in texts]
        if progress:
            progress(len(texts))
        return EncodeResult(np.array(rows, dtype=np.float32).reshape(-1, self.dim), 0)


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


# ------------------------------------------------------------------------------------ loss masking
def test_rse_loss_masks_false_negatives_exactly():
    q = torch.tensor([[1.0, 0.0]])
    cands = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # col 1 = same text as the positive
    pos = torch.tensor([0])
    none = torch.zeros(1, 3, dtype=torch.bool)
    masked = torch.tensor([[False, True, False]])
    e = math.exp(1 / 0.05)
    unmasked_loss = rse_loss(q, cands, pos, none, 0.05).item()
    masked_loss = rse_loss(q, cands, pos, masked, 0.05).item()
    assert unmasked_loss == pytest.approx(-math.log(e / (2 * e + 1)), rel=1e-5)  # ≈ log 2: penalised for a true tail
    assert masked_loss == pytest.approx(-math.log(e / (e + 1)), abs=1e-6)  # ≈ 0
    # gradients only flow from unmasked candidates
    qg = q.clone().requires_grad_()
    rse_loss(qg, cands, pos, masked, 0.05).backward()
    assert torch.isfinite(qg.grad).all()


def test_exclusions_cover_other_true_tails_group_and_head_but_never_the_tail():
    # text ids: A=0 B=1 C=2 X=3 Y=4 Z=5
    split = training._Split(head=np.array([0, 0, 3, 5]), tail=np.array([1, 2, 4, 3]),
                            neg=np.array([-1, -1, -1, -1]), group=np.array([-1, -1, 7, 7]))
    ex = [set(e.tolist()) for e in training._exclusions(split)]
    assert ex[0] == {0, 2}  # (A, B): A's other true tail C, and A itself
    assert ex[1] == {0, 1}
    assert ex[2] == {3, 5}  # (X, Y, g): X itself and Z, which shares group g
    assert ex[3] == {4, 5}  # (Z, X, g): Y shares the group, Z is the head
    pos = np.full(6, -1)
    cand = np.array([1, 2, 5])  # candidates B, C, Z
    pos[cand] = np.arange(3)
    mask = training._mask(np.array([0, 2]), training._exclusions(split), pos, 3)
    assert mask.tolist() == [[False, True, False], [False, False, True]]


@pytest.mark.parametrize("negatives", ["all", "batch"])
def test_training_loop_masks_other_true_tails_group_members_and_the_head(tmp_path, monkeypatch, negatives):
    """Capture every softmax the trainer builds: a candidate that is another true tail of the row's
    head, shares its group, or is the head itself is masked; the positive never is."""
    rows = [{"head": "A", "relation": "r", "tail": "B"}, {"head": "A", "relation": "r", "tail": "C"},
            {"head": "B", "relation": "r", "tail": "A"}, {"head": "D", "relation": "r", "tail": "E", "group": "g"},
            {"head": "F", "relation": "r", "tail": "G", "group": "g"}, {"head": "H", "relation": "r", "tail": "I"}]
    train = _write(tmp_path / "t.jsonl", rows)
    calls = []
    real_loss = training.rse_loss

    def spy(queries, candidates, positive, mask, temperature):
        calls.append((candidates.detach().clone(), positive.clone(), mask.clone()))
        return real_loss(queries, candidates, positive, mask, temperature)

    monkeypatch.setattr(training, "rse_loss", spy)
    enc = FakeEncoder()
    train_adapter([train], encoder=enc, config=TrainConfig(epochs=3, batch_size=4, negatives=negatives,
                                                           progress=False, cache_dir=str(tmp_path / "c")))
    texts = "ABCDEFGHI"
    unit = torch.nn.functional.normalize(torch.from_numpy(enc.encode(list(texts)).vectors), dim=-1)
    false_neg = {("A", "B"): {"A", "C"}, ("A", "C"): {"A", "B"}, ("B", "A"): {"B"},
                 ("D", "E"): {"D", "F", "G"}, ("F", "G"): {"F", "D", "E"}, ("H", "I"): {"H"}}
    checked = 0
    for cands, positive, mask in calls:
        names = [texts[int(torch.cdist(c[None], unit).argmin())] for c in cands]
        for row in range(len(positive)):
            key = next(k for k in false_neg if k[1] == names[int(positive[row])])  # tails are unique here
            masked = {names[j] for j in range(len(names)) if mask[row, j]}
            assert not mask[row, positive[row]]
            assert masked == false_neg[key] & set(names), (key, masked)
            checked += 1
    assert checked == 3 * len(rows)


# --------------------------------------------------------------------------------- triples input
def test_read_triples_errors_name_file_and_line(tmp_path):
    p = _write(tmp_path / "a.jsonl", [{"head": "h", "relation": "r", "tail": "t"}, {"head": "h", "relation": "r"}])
    with pytest.raises(ValueError, match=r"a\.jsonl:2: missing field\(s\) tail"):
        read_triples(p)
    p = _write(tmp_path / "b.jsonl", ["{not json"])
    with pytest.raises(ValueError, match=r"b\.jsonl:1: not valid JSON"):
        read_triples(p)
    p = _write(tmp_path / "c.jsonl", [{"head": "", "relation": "r", "tail": "t"}])
    with pytest.raises(ValueError, match=r"c\.jsonl:1: field 'head'"):
        read_triples(p)
    (tmp_path / "d.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"d\.jsonl: no triples"):
        read_triples(str(tmp_path / "d.jsonl"))
    with pytest.raises(FileNotFoundError):
        read_triples(str(tmp_path / "missing.jsonl"))
    ok = read_triples(_write(tmp_path / "e.jsonl", [{"head": "h", "relation": "r", "tail": "t", "negative": "n",
                                                   "group": 3}]))
    assert ok[0].negative == "n" and ok[0].group == "3" and ok[0].where.endswith("e.jsonl:1")


def test_unknown_dev_relation_is_an_error_naming_known_ones(tmp_path):
    train = _write(tmp_path / "train.jsonl", [{"head": "a", "relation": "r1", "tail": "b"},
                                               {"head": "c", "relation": "r2", "tail": "d"}])
    dev = _write(tmp_path / "dev.jsonl", [{"head": "a", "relation": "nope", "tail": "b"}])
    with pytest.raises(ValueError, match=r"dev\.jsonl:1: relation 'nope'.*known: r1, r2"):
        train_adapter([train], dev_files=[dev], encoder=FakeEncoder(), config=TrainConfig(progress=False))
    with pytest.raises(ValueError, match="relation 'x' is not in the training data; known: r1, r2"):
        train_adapter([train], encoder=FakeEncoder(), config=TrainConfig(relations=("x",), progress=False))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="operator"):
        TrainConfig(operator="mlp")
    with pytest.raises(ValueError, match="negatives"):
        TrainConfig(negatives="some")


# ----------------------------------------------------------------------------------- vector cache
def test_vector_cache_skips_encoded_texts(tmp_path):
    enc = FakeEncoder()
    first = encode_cached(enc, ["a", "b", "a"], cache_dir=tmp_path, progress=False)
    assert enc.encoded == 2  # duplicates encoded once
    again = encode_cached(enc, ["b", "a"], cache_dir=tmp_path, progress=False)
    assert enc.encoded == 2
    np.testing.assert_array_equal(again, first[[1, 0]])
    encode_cached(enc, ["c", "a"], cache_dir=tmp_path, progress=False)
    assert enc.encoded == 3  # only the new text
    (next(tmp_path.glob("*/")) / "broken.npz").write_bytes(b"not a zip")  # a damaged shard is a miss, not a crash
    assert encode_cached(enc, ["a"], cache_dir=tmp_path, progress=False).shape == (1, 16)
    other = FakeEncoder()
    other.identity = dict(FakeEncoder.identity, weights_sha256="fake1")
    encode_cached(other, ["a"], cache_dir=tmp_path, progress=False)
    assert other.encoded == 1  # another encoder's vectors are never reused


def test_training_is_deterministic_and_round_trips(tmp_path):
    rows = [{"head": f"q{i}", "relation": "r", "tail": f"a{i}"} for i in range(40)]
    train = _write(tmp_path / "t.jsonl", rows[:30])
    test = _write(tmp_path / "s.jsonl", rows[30:])
    cfg = TrainConfig(operator="translation", epochs=3, progress=False, cache_dir=str(tmp_path / "c"))
    b1 = train_adapter([train], test_files=[test], config=cfg, encoder=FakeEncoder())
    b2 = train_adapter([train], test_files=[test], config=cfg, encoder=FakeEncoder())
    np.testing.assert_array_equal(b1.operators["r"].params["r"], b2.operators["r"].params["r"])
    loaded = load_bundle(str(b1.save(tmp_path / "bundle")))
    assert loaded.operators["r"].kind == "translation"
    assert loaded.operators["r"].info["metrics"]["identity"] == b1.operators["r"].info["metrics"]["identity"]


# ------------------------------------------------------------------------- real encoder, real data
@pytest.fixture(scope="module")
def trecqa(tmp_path_factory):
    """(train: first 200 TrecQA train triples, dev, test, a vector cache shared by this module's tests)."""
    folder = shared("trecqa", "triples")
    tmp = tmp_path_factory.mktemp("trecqa")
    rows = [json.loads(line) for line in open(folder / "train.jsonl")][:200]
    return (_write(tmp / "train200.jsonl", rows), str(folder / "dev.jsonl"), str(folder / "test.jsonl"),
            str(tmp / "cache"))


def test_tiny_trecqa_linear_beats_identity_and_round_trips(tmp_path, encoder, trecqa):
    train, dev, test, cache = trecqa
    bundle = train_adapter([train], dev_files=[dev], test_files=[test], encoder=encoder,
                           config=TrainConfig(progress=False, cache_dir=cache))
    op = bundle.operators["qa-entailment"]
    m = op.info["metrics"]
    assert m["queries"] == 284
    assert m["trained"]["mrr"] > m["identity"]["mrr"] + 0.02, m
    assert bundle.encoder == encoder.identity
    loaded = load_bundle(str(bundle.save(tmp_path / "b")))
    h = np.random.default_rng(0).normal(size=(3, encoder.dim)).astype(np.float32)
    np.testing.assert_allclose(loaded.operators["qa-entailment"].apply(h), op.apply(h), atol=1e-6)
    assert loaded.operators["qa-entailment"].info["data"]["train"]["triples"] == 200


def test_cli_train_writes_bundle_card_and_table(tmp_path, encoder, trecqa, monkeypatch):
    from relsearch import cli_train
    from relsearch.encoder import model

    monkeypatch.setattr(model, "Encoder", lambda config: encoder)
    train, _, test, cache = trecqa
    out = tmp_path / "bundle"
    extra = tmp_path / "entities.jsonl"
    extra.write_text('{"text": "An unrelated sentence about boats."}\n')
    res = CliRunner().invoke(cli_train.train, [train, "--out", str(out), "--test", test, "--candidates", str(extra),
                                               "--epochs", "2", "--quiet", "--cache-dir", cache,
                                               "--card-note", "TrecQA: public domain",
                                               "--description", "qa-entailment=tail answers the head"])
    assert res.exit_code == 0, res.output
    assert "qa-entailment" in res.output and "(identity" in res.output
    card = (out / "MODEL_CARD.md").read_text()
    assert "TrecQA: public domain" in card and "200 triples" in card and "| qa-entailment | linear |" in card
    # issue 28: the card records the command as given, --test, --out and all (not only DATA and --objective)
    assert f"Trained with `relsearch train {train} --out {out} --test {test} --candidates {extra} --epochs 2" in card
    assert load_bundle(str(out)).operators["qa-entailment"].description == "tail answers the head"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"head": "x", "relation": "r"}\n')
    res = CliRunner().invoke(cli_train.train, [str(bad), "--out", str(tmp_path / "o"), "--quiet"])
    assert res.exit_code != 0 and "bad.jsonl:1: missing field(s) tail" in res.output
    res = CliRunner().invoke(cli_train.train, [train, "--out", str(tmp_path / "o"), "--aspect", "x"])
    assert res.exit_code == 2 and "--aspect does not apply to --objective rse" in res.output


def test_adapter_resumes_after_the_last_finished_relation(tmp_path, encoder, trecqa, monkeypatch):
    train, _, _, cache = trecqa
    rows = [json.loads(line) for line in open(train)][:80]
    for i, r in enumerate(rows):
        r["relation"] = "a" if i % 2 else "b"
    data = _write(tmp_path / "two.jsonl", rows)
    config = TrainConfig(progress=False, cache_dir=cache, epochs=2)
    whole = train_adapter([data], config=config, encoder=encoder)
    real, trained = training._train_operator, []

    def dies_on_b(name, *args, **kwargs):
        if name == "b":
            raise KeyboardInterrupt
        trained.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(training, "_train_operator", dies_on_b)
    with pytest.raises(KeyboardInterrupt):
        train_adapter([data], config=config, encoder=encoder, out=tmp_path / "out")
    monkeypatch.setattr(training, "_train_operator", lambda name, *a, **k: (trained.append(name), real(name, *a, **k))[1])
    resumed = train_adapter([data], config=config, encoder=encoder, out=tmp_path / "out")
    assert trained == ["a", "b"]  # "a" came from the checkpoint, not a second training run
    for name in ("a", "b"):
        np.testing.assert_allclose(resumed.operators[name].params["W"], whole.operators[name].params["W"], atol=1e-6)


# ------------------------------------------------------------------------------------ devices
class DeviceAudit(torch.overrides.TorchFunctionMode):
    """Records what a trainer (code in encoder/training/) does that breaks on a GPU though it runs on
    a CPU: a tensor created without an explicit ``device=`` naming the encoder's device (it lands on
    the CPU beside CUDA activations), and ``.numpy()`` of a tensor not moved by ``.cpu()`` first."""

    FACTORIES = {"zeros", "ones", "full", "empty", "arange", "eye", "randn", "rand", "randint", "randperm",
                 "tensor", "as_tensor", "linspace"}

    def __init__(self, device: str):
        super().__init__()
        self.device, self.problems, self.calls, self._last = torch.device(device).type, [], 0, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import sys
        from pathlib import Path

        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        caller = sys._getframe(1).f_code.co_filename
        if f"{Path('encoder', 'training')}" not in caller and not caller.endswith(f"{Path('encoder', 'kinds.py')}"):
            return result  # the trainers' own calls, and the kinds' torch init / forward (encoder/kinds.py)
        self.calls += 1
        name, where = getattr(func, "__name__", str(func)), f"{Path(caller).name}:{sys._getframe(1).f_lineno}"
        if name in self.FACTORIES and ("device" not in kwargs or torch.device(kwargs["device"]).type != self.device):
            self.problems.append(f"{where}: torch.{name} without device={self.device!r}")
        if name == "numpy" and not (self._last is not None and self._last[0] == "cpu" and self._last[1] is args[0]):
            self.problems.append(f"{where}: .numpy() of a tensor not moved to the CPU")
        self._last = (name, result)
        return result


def _joint_step_problems(train, **kw):
    audit = DeviceAudit("cuda" if torch.cuda.is_available() else "cpu")  # what TrainableEncoder picks
    with audit:
        train(**kw)
    assert audit.calls > 50  # the audit saw the trainer's own calls
    return audit.problems


def test_joint_training_steps_create_every_tensor_on_the_encoders_device(tmp_path):
    """`train --regime joint` crashed on CUDA at its first step (a CPU false-negative mask and labels,
    .numpy() of CUDA relation parameters): one tiny step of each joint trainer, audited on the CPU."""
    from relsearch.encoder.training.aspect import AspectConfig, train_aspects
    from relsearch.encoder.training.rse_joint import JointConfig, train_joint

    pairs = [("A cat sits.", "A cat is sitting."), ("Dogs run.", "The dogs are running."),
             ("It rains.", "Rain is falling."), ("He eats.", "He is eating.")]
    triples = _write(tmp_path / "t.jsonl", [{"head": h, "relation": "r", "tail": t} for h, t in pairs])
    assert _joint_step_problems(train_joint, train_files=[triples], base="all-MiniLM-L6-v2", out=tmp_path / "rse",
                                candidates=["A bird flies.", "Snow is white."],  # --candidates: extra negatives
                                config=JointConfig(batch_size=4, max_length=8, progress=False,
                                                   cache_dir=str(tmp_path / "cache"))) == []
    from relsearch.encoder.training.tower import TowerConfig, train_tower

    assert _joint_step_problems(train_tower, train_files=[triples], out=tmp_path / "tower", candidates=["A bird flies."],
                                config=TowerConfig(batch_size=4, max_length=8, progress=False, negatives="batch",
                                                   pre_batch=1, cache_dir=str(tmp_path / "cache"))) == []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with DeviceAudit(device) as audit:  # the linear operator's start (the step above trains a translation)
        assert training._init_params("linear", 4, torch.Generator(device=device), device)["W"].device.type == device
    assert audit.problems == [] and audit.calls
    docs = _write(tmp_path / "d.jsonl", [{"text": t, "label": str(i % 2)} for i, t in enumerate(sum(pairs, ()))])
    assert _joint_step_problems(train_aspects, train_files=[docs], base="all-MiniLM-L6-v2", out=tmp_path / "aspect",
                                config=AspectConfig(aspects=("label",), regime="joint", epochs=1, batch_size=8,
                                                    max_length=8, progress=False)) == []
