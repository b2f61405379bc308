"""The contract every operator kind (encoder/relations.py KINDS) and head kind (encoder/heads.py
HEAD_KINDS) keeps: shapes, the document side, the flags, determinism, and a bundle round trip.

The kinds are read from those registries, so a new kind fails here until it has an example below
and meets the same contract.
"""
import hashlib

import numpy as np
import pytest

from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.heads import HEAD_KINDS, PairHead
from relsearch.encoder.kinds import INVERTIBLE, TRAINABLE, kind_of, trained_kind
from relsearch.encoder.relations import KINDS, Operator, normalize

D, N = 8, 5


def _fake_tower(texts):
    """Deterministic text → raw vector (what a query tower returns), from a hash of the text."""
    return np.array([np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=D)
                     for t in texts], dtype=np.float32)


def _operator(kind: str) -> Operator:
    rng = np.random.default_rng(7)
    params = {
        "identity": {},
        "translation": {"r": rng.normal(0, 0.1, D)},
        "linear": {"W": np.eye(D) + rng.normal(0, 0.1, (D, D)), "b": rng.normal(0, 0.1, D)},
        "projection": {"P": np.eye(D) + rng.normal(0, 0.1, (D, D))},
        "encoder": {"layer.0.query.lora_A": rng.normal(0, 0.05, (2, D)),
                    "layer.0.query.lora_B": rng.normal(0, 0.05, (D, 2))},
    }
    if kind not in params:
        pytest.fail(f"operator kind {kind!r} has no example in tests/encoder/test_operator_contract.py: add one")
    info = {"tower": {"name": "t", "marker": "relation: {relation}; ", "scale": 2.0, "base": "fake0"}} \
        if kind == "encoder" else {}
    op = Operator(name=f"op-{kind}", kind=kind, description=f"a {kind} operator", info=info,
                  params={k: v.astype(np.float32) for k, v in params[kind].items()})
    if op.needs_text:
        op.query_tower = _fake_tower
    return op


def _head(kind: str) -> PairHead:
    rng = np.random.default_rng(11)
    if kind != "pair-classifier":
        pytest.fail(f"head kind {kind!r} has no example in tests/encoder/test_operator_contract.py: add one")
    params = {"P": np.eye(D) + rng.normal(0, 0.1, (D, D)), "W1": rng.normal(0, 0.3, (6, 4 * D)),
              "b1": rng.normal(0, 0.1, 6), "W2": rng.normal(0, 0.3, (3, 6)), "b2": rng.normal(0, 0.1, 3)}
    return PairHead(name=f"head-{kind}", kind=kind, labels=("a", "b", "c"), positive="b", params=params,
                    description="a pair head", info={"metrics": {"accuracy": 0.5}})


def _inputs():
    rng = np.random.default_rng(3)
    h = rng.normal(size=(N, D)).astype(np.float32)
    texts = [f"query number {i}" for i in range(N)]
    return h, texts


# ------------------------------------------------------------------------------------ operators
@pytest.mark.parametrize("kind", KINDS)
def test_apply_maps_n_queries_to_n_unit_vectors(kind):
    op = _operator(kind)
    h, texts = _inputs()
    q = op.apply(h, texts)
    assert q.shape == (N, D) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert op.dim in (None, D)


@pytest.mark.parametrize("kind", KINDS)
def test_an_inverse_undoes_the_map_and_plain_changes_nothing(kind):
    """What bench linkpred's head prediction asks of a kind (encoder/kinds.py): ``plain`` maps h to h
    (its own inverse); ``inverse`` gives the params whose map takes q back to h, before normalising."""
    entry, op = kind_of(kind), _operator(kind)
    h, _ = _inputs()
    if entry.plain:
        np.testing.assert_array_equal(entry.map(op.params, h), h)
    if entry.inverse is not None:
        back = entry.map(entry.inverse(op.params), entry.map(op.params, h))
        np.testing.assert_allclose(back, h, atol=1e-5)
        assert set(entry.inverse(op.params)) == set(entry.params)
    assert (kind in INVERTIBLE) == (entry.plain or entry.inverse is not None)


def test_a_trained_operators_parameters_name_its_kind():
    for kind in TRAINABLE:
        assert trained_kind(_operator(kind).params) is kind_of(kind)
    with pytest.raises(ValueError, match="no trainable operator kind has parameters \\['P'\\]; translation: r"):
        trained_kind(_operator("projection").params)


def test_the_trainers_take_each_kinds_default_learning_rate_and_choices_from_the_registry():
    from relsearch.encoder.training.rse import TrainConfig
    from relsearch.encoder.training.rse_joint import JointConfig

    for kind in TRAINABLE:
        assert TrainConfig(operator=kind).learning_rate == JointConfig(operator=kind).operator_lr == kind_of(kind).lr
    assert (kind_of("translation").lr, kind_of("linear").lr) == (1e-2, 3e-3)
    with pytest.raises(ValueError, match="choose translation or linear"):
        JointConfig(operator="projection")


@pytest.mark.parametrize("kind", KINDS)
def test_needs_text_says_whether_apply_reads_the_text_or_the_vector(kind):
    op = _operator(kind)
    h, texts = _inputs()
    if op.needs_text:
        with pytest.raises(ValueError, match="query text"):
            op.apply(h)
        other = np.random.default_rng(99).normal(size=h.shape).astype(np.float32)
        np.testing.assert_array_equal(op.apply(other, texts), op.apply(h, texts))  # the vector is not read
    else:
        np.testing.assert_array_equal(op.apply(h), op.apply(h, texts))  # the text is not read
        assert not np.array_equal(op.apply(h), op.apply(h[::-1].copy()))


@pytest.mark.parametrize("kind", KINDS)
def test_documents_are_unchanged_unless_both_sides(kind):
    op = _operator(kind)
    unit = normalize(_inputs()[0])
    docs = op.documents(unit)
    assert docs.shape == unit.shape
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    if op.both_sides:
        assert not np.allclose(docs, unit)
        # normalize(P t̂) does not depend on the norm of the raw vector: any index of unit vectors serves it
        np.testing.assert_allclose(op.documents(unit), op.documents(normalize(3.0 * unit)), atol=1e-6)
    else:
        np.testing.assert_array_equal(docs, unit)


@pytest.mark.parametrize("kind", KINDS)
def test_apply_and_documents_are_deterministic(kind):
    h, texts = _inputs()
    first, second = _operator(kind), _operator(kind)
    np.testing.assert_array_equal(first.apply(h, texts), first.apply(h, texts))
    np.testing.assert_array_equal(first.apply(h, texts), second.apply(h, texts))
    np.testing.assert_array_equal(first.documents(normalize(h)), second.documents(normalize(h)))


@pytest.mark.parametrize("kind", KINDS)
def test_bundle_round_trip_keeps_kind_parameters_flags_and_scores(kind, tmp_path):
    op = _operator(kind)
    Bundle(encoder={"model": "fake", "dim": D}, operators={op.name: op}).save(tmp_path / "b")
    loaded = load_bundle(str(tmp_path / "b")).operators[op.name]
    assert (loaded.kind, loaded.description, loaded.info) == (op.kind, op.description, op.info)
    assert (loaded.needs_text, loaded.both_sides, loaded.dim) == (op.needs_text, op.both_sides, op.dim)
    assert sorted(loaded.params) == sorted(op.params)
    for key, value in op.params.items():
        np.testing.assert_array_equal(loaded.params[key], value)
    if loaded.needs_text:  # a tower is attached at run time from the base transformer; the fake one here
        loaded.query_tower = _fake_tower
    h, texts = _inputs()
    np.testing.assert_allclose(loaded.apply(h, texts), op.apply(h, texts), atol=1e-6)
    np.testing.assert_allclose(loaded.documents(normalize(h)), op.documents(normalize(h)), atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_parameters_are_refused_with_the_operator_named(kind):
    op = _operator(kind)
    if not op.params:
        return  # nothing to leave out
    with pytest.raises(ValueError, match=op.name):
        Operator(name=op.name, kind=kind, params={}, info=op.info)


# ---------------------------------------------------------------------------------------- heads
@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_head_scores_pairs_with_consistent_shapes(kind):
    head = _head(kind)
    h_a, h_b = _inputs()[0], np.random.default_rng(5).normal(size=(N, D)).astype(np.float32)
    assert head.logits(h_a, h_b).shape == (N, len(head.labels))
    probs = head.probabilities(h_a, h_b)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(head.score(h_a, h_b), probs[:, head.positive_index])
    assert len(head.predict(h_a, h_b)) == N and set(head.predict(h_a, h_b)) <= set(head.labels)
    assert head.score(h_a[0], h_b).shape == (N,)  # one query row against N documents
    np.testing.assert_array_equal(head.logits(h_a, h_b), _head(kind).logits(h_a, h_b))  # deterministic


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_head_bundle_round_trip(kind, tmp_path):
    head = _head(kind)
    Bundle(encoder={"model": "fake", "dim": D}, heads={head.name: head}).save(tmp_path / "b")
    loaded = load_bundle(str(tmp_path / "b")).heads[head.name]
    assert loaded.manifest_entry() == head.manifest_entry()
    h_a, h_b = _inputs()[0], np.random.default_rng(5).normal(size=(N, D)).astype(np.float32)
    np.testing.assert_array_equal(loaded.logits(h_a, h_b), head.logits(h_a, h_b))
    with pytest.raises(ValueError, match="expects 8-d"):
        loaded.logits(np.zeros((1, D + 1), np.float32), np.zeros((1, D + 1), np.float32))
