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
