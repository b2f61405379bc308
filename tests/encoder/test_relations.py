"""Relation operators, mixtures and the bundle format."""
import numpy as np
import pytest

from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.relations import IDENTITY, Operator, mixture_query, normalize, parse_relation_args

rng = np.random.default_rng(0)
D = 8


def ops():
    return {
        "identity": IDENTITY,
        "t": Operator(name="t", kind="translation", params={"r": rng.normal(size=D).astype(np.float32)}),
        "l": Operator(name="l", kind="linear", params={"W": rng.normal(size=(D, D)).astype(np.float32),
                                                       "b": rng.normal(size=D).astype(np.float32)}),
    }


def test_translation_adds_to_raw_vector_before_normalising():
    o = ops()["t"]
    h = rng.normal(size=(3, D)).astype(np.float32) * 5
    np.testing.assert_allclose(o.apply(h), normalize(h + o.params["r"]), rtol=1e-6)
    assert not np.allclose(o.apply(h), normalize(normalize(h) + o.params["r"]))


def test_mixture_is_the_weighted_sum_of_cosines():
    o = ops()
    h = rng.normal(size=(4, D)).astype(np.float32)
    docs = normalize(rng.normal(size=(10, D)).astype(np.float32))
    weights = {"t": 0.7, "l": 0.3}
    q = mixture_query(o, h, weights)
    expected = sum(w * (o[n].apply(h) @ docs.T) for n, w in weights.items())
    np.testing.assert_allclose(q @ docs.T, expected, rtol=1e-5, atol=1e-6)


def test_parse_relation_args():
    assert parse_relation_args([]) == {"identity": 1.0}
    assert parse_relation_args(["a=0.7", "b=0.3"]) == {"a": 0.7, "b": 0.3}
    with pytest.raises(ValueError, match="not a number"):
        parse_relation_args(["a=x"])


def test_unknown_relation_lists_available():
    with pytest.raises(KeyError, match="available: identity, l, t"):
        mixture_query(ops(), np.ones((1, D), np.float32), {"nope": 1.0})


def test_operator_validates_kind_and_params():
    with pytest.raises(ValueError, match="unknown kind"):
        Operator(name="x", kind="rotation")
    with pytest.raises(ValueError, match="lacks parameters"):
        Operator(name="x", kind="linear", params={"W": np.eye(D)})


def test_bundle_round_trip_keeps_names_and_params(tmp_path):
    o = ops()
    o["t"].info = {"metrics": {"test": {"mrr": 0.5}}}
    Bundle(encoder={"model": "m", "dim": D}, operators=o).save(tmp_path / "b")
    loaded = load_bundle(str(tmp_path / "b"))
    assert set(loaded.operators) == {"identity", "t", "l"}
    h = rng.normal(size=(2, D)).astype(np.float32)
    for name in o:
        np.testing.assert_allclose(loaded.operators[name].apply(h), o[name].apply(h), rtol=1e-6)
    assert loaded.operators["t"].info["metrics"]["test"]["mrr"] == 0.5


def test_bundle_rejects_dimension_mismatch(tmp_path):
    with pytest.raises(ValueError, match="dimension"):
        Bundle(encoder={"model": "m", "dim": D + 1}, operators=ops())
    Bundle(encoder={"model": "m", "dim": D}, operators=ops()).save(tmp_path / "b")
    with pytest.raises(ValueError, match="expects a 8-d encoder"):
        load_bundle(str(tmp_path / "b"), dim=16)


def test_an_operator_carries_its_kind_and_pickles_by_its_name(monkeypatch):
    """The kind is looked up once, at construction: apply, needs_text, both_sides and dim never ask the
    registry again (a query crosses no encoder/kinds.py for an identity operator); a pickled operator
    comes back with the registry's own Kind."""
    import pickle

    from relsearch.encoder import kinds, relations

    o = ops()
    h = rng.normal(size=(3, D)).astype(np.float32)
    want = {name: op.apply(h) for name, op in o.items()}
    back = {name: pickle.loads(pickle.dumps(op)) for name, op in o.items()}
    monkeypatch.setattr(relations, "kind_of", lambda name: pytest.fail(f"kind {name} looked up again"))
    for name, op in o.items():
        np.testing.assert_array_equal(op.apply(h), want[name])
        np.testing.assert_array_equal(back[name].apply(h), want[name])
        assert (back[name].name, back[name].kind) == (name, op.kind) and back[name]._kind is kinds.REGISTRY[op.kind]
        assert (op.needs_text, op.both_sides, op.dim) == (False, False, None if name == "identity" else D)
    np.testing.assert_array_equal(o["identity"].apply(h), normalize(h))  # plain: q = ĥ
