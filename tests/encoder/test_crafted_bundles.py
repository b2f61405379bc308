"""Crafted bundles and model folders (issue 27 item 4): loading one is loading code-free data, so it
gets one line naming the file and field, fast, in bounded memory — LoRA shapes are checked before any
product, towers are built only when used, a marker is a plain template, files are read only if they
are regular, bounded and inside their folder, and malformed or NaN values are refused at load."""
from __future__ import annotations

import copy
import json
import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.encoder import tower as tower_module
from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.heads import PairHead
from relsearch.encoder.model import resolve_model_path, weights_fingerprint
from relsearch.encoder.relations import Operator, mixture_query, parse_relation_args
from relsearch.encoder.tower import MARKER, attach_towers, marked

MODULE = "encoder.layer.0.attention.self.query"
DIM = 384
HANG_S = 20  # what a refused file may take at most; the old code hung forever


def _finishes(fn, timeout: float = HANG_S, unblock=None):
    """Run ``fn`` in a thread; (finished, result or exception). ``unblock()`` frees a thread that hung."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["value"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    finished = not thread.is_alive()
    if not finished and unblock is not None:
        unblock()
        thread.join(timeout)
    return finished, out.get("value")


def _feed_fifo(fifo: Path, data: bytes = b"key\n"):
    """Open ``fifo`` for writing (frees a reader blocked in open) and write ``data``."""
    def unblock():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return unblock


def _model_folder(tmp_path: Path) -> Path:
    """A copy of the packaged model folder made of links to its files (the weights too)."""
    source, folder = Path(resolve_model_path("all-MiniLM-L6-v2")), tmp_path / "model"
    folder.mkdir()
    for entry in source.iterdir():
        if entry.is_dir():
            (folder / entry.name).mkdir()
            for inner in entry.iterdir():
                (folder / entry.name / inner.name).symlink_to(inner)
        else:
            (folder / entry.name).symlink_to(entry)
    return folder


def _bundle(tmp_path: Path, name: str = "b", *, w: np.ndarray | None = None, head_w2: np.ndarray | None = None) -> Path:
    """A small valid bundle: a linear operator and a pair head on the default encoder."""
    rng = np.random.default_rng(0)
    linear = Operator(name="lin", kind="linear", description="a linear map",
                      params={"W": np.eye(DIM, dtype=np.float32) if w is None else w, "b": np.zeros(DIM, np.float32)})
    head = PairHead(name="h", labels=("no", "yes"), positive="yes",
                    params={"W1": rng.normal(0, 0.1, (8, 4 * DIM)), "b1": np.zeros(8),
                            "W2": rng.normal(0, 0.1, (2, 8)) if head_w2 is None else head_w2, "b2": np.zeros(2)})
    bundle = Bundle(encoder={"model": "all-MiniLM-L6-v2", "pooling": "mean", "dim": DIM},
                    operators={"lin": linear}, heads={"h": head})
    return bundle.save(tmp_path / name)


def _edit_manifest(path: Path, edit) -> Path:
    manifest = json.loads((path / "bundle.json").read_text())
    edit(manifest)
    (path / "bundle.json").write_text(json.dumps(manifest))
    return path


def _tower_op(encoder, a_shape, b_shape, name="para", marker=MARKER) -> Operator:
    params = {f"{MODULE}.lora_A": np.full(a_shape, 0.01, np.float32),
              f"{MODULE}.lora_B": np.full(b_shape, 0.01, np.float32)}
    tower = {"name": "t", "marker": marker, "scale": 1.0, "base": encoder.identity["weights_sha256"]}
    return Operator(name=name, kind="encoder", params=params, info={"tower": tower})


def _one_line_failure(result, *needles: str) -> None:
    """A refused command: non-zero exit by click (no traceback), one line naming ``needles``."""
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------ query towers
def no_product(*args, **kwargs):
    raise AssertionError("a LoRA product was computed before its shapes were checked")


def test_lora_shapes_are_checked_against_the_base_model_before_any_product(encoder, monkeypatch):
    """lora_A (1, 60000) with lora_B (60000, 1) — a 480 KB file — once made B @ A allocate 14.4 GB."""
    monkeypatch.setattr(torch.Tensor, "__matmul__", no_product)
    evil = _tower_op(encoder, (1, 60000), (60000, 1))
    with pytest.raises(ValueError, match="does not fit its weight"):
        attach_towers({"para": evil}, encoder)
    too_high_rank = _tower_op(encoder, (DIM + 1, DIM), (DIM, DIM + 1))  # B A fits, but the factors outgrow it
    with pytest.raises(ValueError, match="does not fit its weight"):
        attach_towers({"para": too_high_rank}, encoder)


def test_score_on_a_bundle_with_an_oversized_tower_is_one_line(tmp_path, encoder, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "__matmul__", no_product)
    bundle = Bundle(encoder={"model": "all-MiniLM-L6-v2", "pooling": "mean", "dim": DIM},
                    operators={"evil": _tower_op(encoder, (1, 60000), (60000, 1), name="evil")})
    path = bundle.save(tmp_path / "evil")
    result = CliRunner().invoke(cli, ["score", "a", "b", "--model", str(path)])
    _one_line_failure(result, MODULE, "does not fit")


def test_towers_are_built_only_when_a_query_uses_them(encoder, monkeypatch):
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(tower_module.copy, "deepcopy", lambda x, *a: copies.append(x is encoder.model) or real(x, *a))
    ops = {"para": _tower_op(encoder, (2, DIM), (DIM, 2)), "dup": _tower_op(encoder, (2, DIM), (DIM, 2), name="dup")}
    attach_towers(ops, encoder)
    assert copies == []  # checked, not built: nothing has used it yet
    vectors = ops["para"].apply(None, ["a question"])
    assert vectors.shape == (1, DIM) and sum(copies) == 1
    ops["dup"].apply(None, ["another"])
    assert sum(copies) == 1  # one merged model per tower name


# ------------------------------------------------------------------------------ marker templates
@pytest.mark.parametrize("template", ["{text:>50}", "{relation.__class__}", "{text!r}", "{0}{text}", "{}",
                                      "{text}{text}", "{relation}{relation}", "x" * 300 + "{text}", "{text"])
def test_a_marker_accepts_only_the_literal_placeholders(template):
    with pytest.raises(ValueError, match="marker"):
        marked(template, "rel", ["q"])


def test_a_marker_fills_its_placeholders_without_str_format():
    assert marked(MARKER, "{text}", ["a {relation}"]) == ["relation: {text}; a {relation}"]
    assert marked("{{x}} {text}", "r", ["q"]) == ["{x} q"]


def test_a_bundle_with_a_formatting_marker_is_refused_at_load(tmp_path, encoder):
    op = _tower_op(encoder, (2, DIM), (DIM, 2), marker=MARKER)
    path = Bundle(encoder={"model": "all-MiniLM-L6-v2", "dim": DIM}, operators={"para": op}).save(tmp_path / "m")
    index = [o["name"] for o in json.loads((path / "bundle.json").read_text())["operators"]].index("para")
    _edit_manifest(path, lambda m: m["operators"][index]["tower"].update(marker="{text:>1500}"))
    with pytest.raises(ValueError, match=rf"bundle\.json: operators\[{index}\]\.tower\.marker"):
        load_bundle(str(path))


# ------------------------------------------------------------------------------ files
def test_bundle_tensors_must_be_a_regular_file(tmp_path):
    path = _bundle(tmp_path)
    (path / "operators.safetensors").unlink()
    (path / "operators.safetensors").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="operators.safetensors is not a regular file"):
        load_bundle(str(path))


def test_a_model_folder_whose_weights_are_dev_zero_is_refused_fast(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="model.safetensors is not a regular file"):
        load_bundle(str(folder))
    finished, outcome = _finishes(lambda: weights_fingerprint(str(folder)))
    assert finished and isinstance(outcome, ValueError), outcome


def test_a_pooling_config_that_is_a_fifo_does_not_hang(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "1_Pooling" / "config.json").unlink()
    os.mkfifo(folder / "1_Pooling" / "config.json")
    finished, outcome = _finishes(lambda: load_bundle(str(folder)),
                                  unblock=_feed_fifo(folder / "1_Pooling" / "config.json", b"{}"))
    assert finished and isinstance(outcome, ValueError) and "not a regular file" in str(outcome), outcome


def test_modules_json_cannot_point_outside_the_model_folder(tmp_path):
    folder = _model_folder(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith("Pooling"):
            module["path"] = "../outside"
    (folder / "modules.json").unlink()
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="leaves"):
        load_bundle(str(folder))


def test_encoder_path_cannot_leave_the_bundle(tmp_path):
    _model_folder(tmp_path)
    path = _edit_manifest(_bundle(tmp_path), lambda m: m["encoder"].update(path="../model"))
    with pytest.raises(ValueError, match=r"bundle\.json: encoder\.path '\.\./model' leaves"):
        load_bundle(str(path))


def test_serve_refuses_an_api_key_file_that_is_a_fifo_at_once(tmp_path):
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    args = ["serve", "--index", str(tmp_path / "no-index"), "--api-key-file", str(fifo)]
    finished, result = _finishes(lambda: CliRunner().invoke(cli, args), unblock=_feed_fifo(fifo))
    assert finished, "serve hung reading the API key file"
    _one_line_failure(result, "--api-key-file", "not a regular file")


# ------------------------------------------------------------------------------ malformed values
MALFORMED = {  # operators are saved sorted by name: [0] identity, [1] lin
    "operators": lambda m: m.update(operators=5),
    "heads[0].labels": lambda m: m["heads"][0].update(labels=5),
    "operators[0].name": lambda m: m["operators"][0].pop("name"),
    "encoder": lambda m: m.update(encoder=[]),
    "encoder.dim": lambda m: m["encoder"].update(dim="384"),
    "operators[2].name 'lin' is given twice": lambda m: m["operators"].append(dict(m["operators"][1])),
    "heads[0].info": lambda m: m["heads"][0].update(info=5),  # a head is built from it
    "operators[1].recipe": lambda m: m["operators"][1].update(recipe=[1]),
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
def test_a_malformed_bundle_json_value_is_one_line_naming_file_and_field(tmp_path, field):
    path = _edit_manifest(_bundle(tmp_path), MALFORMED[field])
    result = CliRunner().invoke(cli, ["relations", "--model", str(path)])
    _one_line_failure(result, str(path / "bundle.json"), field)


def _metrics(**changes) -> dict:
    base = {"split": "test", "metric": "mrr", "queries": 10, "trained": {"mrr": 0.5}, "identity": {"mrr": 0.3}}
    return {**base, **changes}


# Fields that only describe a relation (shown by the explorer page, `relsearch relations`, model cards; no
# search reads them): one of the wrong type is dropped at load with a warning naming the relation and the
# field, so the bundle, and every index built with it, stays usable. (field shown in the warning, edit)
DESCRIBED = {
    "operator 'lin': metrics.bm25": lambda m: m["operators"][1].update(metrics=_metrics(bm25="mrr-string")),
    "operator 'lin': metrics must": lambda m: m["operators"][1].update(metrics=5),
    "operator 'lin': metrics.trained.mrr": lambda m: m["operators"][1].update(metrics=_metrics(trained={"mrr": "x"})),
    "operator 'lin': metrics.identity must": lambda m: m["operators"][1].update(metrics=_metrics(identity=[0.3])),
    "operator 'lin': metrics.queries": lambda m: m["operators"][1].update(metrics=_metrics(queries=math.nan)),
    "operator 'lin': metrics.hybrid.mrr": lambda m: m["operators"][1].update(metrics=_metrics(hybrid={"mrr": math.inf})),
    "operator 'lin': metrics.metric": lambda m: m["operators"][1].update(metrics=_metrics(metric={"a": 1})),
    "operator 'lin': metrics.note": lambda m: m["operators"][1].update(metrics=_metrics(note=[1, math.nan])),
    "operator 'lin': description": lambda m: m["operators"][1].update(description={"text": 1}),
    "operator 'lin': whole_corpus must": lambda m: m["operators"][1].update(whole_corpus="fitted"),
    "operator 'lin': whole_corpus.test.recipe": lambda m: m["operators"][1].update(
        whole_corpus={"test": {"recipe": "0.5", "identity": 0.4}}),
    "operator 'lin': transfer must": lambda m: m["operators"][1].update(transfer=["WikiQA", 0.6]),
    "operator 'lin': transfer.relation": lambda m: m["operators"][1].update(
        transfer={"dataset": "WikiQA test", "relation": "0.634", "identity": 0.647, "bm25": 0.39, "hybrid": 0.52}),
    "operator 'lin': transfer.dataset": lambda m: m["operators"][1].update(
        transfer={"dataset": {"name": "WikiQA"}, "relation": 0.6, "identity": 0.5}),
    "operator 'lin': transfer.hits@10.identity": lambda m: m["operators"][1].update(
        transfer={"relation": 0.6, "identity": 0.5, "hits@10": {"relation": 0.9, "identity": math.inf}}),
    "head 'h': info.metrics.pairs": lambda m: m["heads"][0]["info"].update(metrics={"accuracy": 0.9, "pairs": "many"}),
    "head 'h': info.metrics.macro_f1": lambda m: m["heads"][0]["info"].update(metrics={"accuracy": 0.9,
                                                                                       "macro_f1": math.nan}),
    "head 'h': description": lambda m: m["heads"][0].update(description=7),
}


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("field", sorted(DESCRIBED))
def test_a_malformed_descriptive_field_is_dropped_with_a_warning_and_the_bundle_loads(tmp_path, field, caplog):
    """metrics {"bm25": "mrr-string"} stopped the explorer page ("The index could not be opened"), a NaN
    made GET /relations fail (JSON has no NaN), a string count made `relsearch relations` a traceback."""
    path = _edit_manifest(_bundle(tmp_path), DESCRIBED[field])
    with caplog.at_level("WARNING", logger="relsearch.encoder.bundle"):
        result = CliRunner().invoke(cli, ["relations", "--model", str(path)])
        listed = CliRunner().invoke(cli, ["relations", "--model", str(path), "--json"])
    assert result.exit_code == 0 and listed.exit_code == 0, (result.output, result.exception, listed.output)
    said = [r.getMessage() for r in caplog.records if r.name == "relsearch.encoder.bundle"]
    assert said and all(line.startswith(f"{path / 'bundle.json'}: ") and "dropped" in line for line in said), said
    assert any(field in line for line in said), (field, said)
    rows = {row["name"]: row for row in map(_strict_json, listed.stdout.splitlines())}
    for row in rows.values():
        json.dumps(row, allow_nan=False)  # what GET /relations sends
    row = rows["h" if field.startswith("head") else "lin"]
    assert isinstance(row["description"], str) and isinstance(row["metrics"], dict)
    kept = load_bundle(str(path))
    assert kept.operators["lin"].params["W"].shape == (DIM, DIM)  # the relation itself is untouched


def test_well_formed_descriptive_fields_are_kept_without_a_warning(tmp_path, caplog):
    metrics = _metrics(bm25={"mrr": 0.2}, hybrid={"mrr": 0.4}, protocol="p", note="free text", extra={"a": [1, 2]})
    corpus = {"test": {"recipe": 0.6, "identity": 0.4, "first_hit": {"recipe": 0.7}}, "not_fitted": "time budget"}
    path = _edit_manifest(_bundle(tmp_path), lambda m: m["operators"][1].update(metrics=metrics, whole_corpus=corpus))
    with caplog.at_level("WARNING", logger="relsearch.encoder.bundle"):
        op = load_bundle(str(path)).operators["lin"]
        load_bundle(None)  # the shipped pack
    assert op.info["metrics"] == metrics and op.info["whole_corpus"] == corpus and op.description == "a linear map"
    assert not [r for r in caplog.records if r.name == "relsearch.encoder.bundle"]


def test_unknown_keys_and_a_recipe_object_in_an_operator_entry_are_kept(tmp_path):
    path = _edit_manifest(_bundle(tmp_path), lambda m: m["operators"][1].update(recipe={"steps": 3}, novel=1))
    op = load_bundle(str(path)).operators["lin"]
    assert op.info["recipe"] == {"steps": 3} and op.info["novel"] == 1


def test_nan_weights_or_shapes_that_do_not_fit_are_refused_at_load(tmp_path):
    w = np.eye(DIM, dtype=np.float32)
    w[3, 4] = np.nan
    with pytest.raises(ValueError, match=r"operators\.safetensors: tensor 'lin/W' holds NaN"):
        load_bundle(str(_bundle(tmp_path, "nan-op", w=w)))
    with pytest.raises(ValueError, match=r"tensor 'head:h/W2' holds NaN"):
        load_bundle(str(_bundle(tmp_path, "nan-head", head_w2=np.full((2, 8), np.nan))))
    path = _bundle(tmp_path, "shape")
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "operators.safetensors"))
    tensors["lin/W"] = np.ones((DIM, 7), np.float32)
    save_file(tensors, str(path / "operators.safetensors"))
    with pytest.raises(ValueError, match=r"bundle\.json: operator 'lin' \(linear\): parameter shapes"):
        load_bundle(str(path))


def test_nan_relation_weights_are_refused():
    with pytest.raises(ValueError, match="not a finite number"):
        parse_relation_args(["identity=nan"])
    with pytest.raises(ValueError, match="not a finite number"):
        mixture_query({"identity": Operator(name="identity", kind="identity")}, np.ones((1, 4), np.float32),
                      {"identity": math.inf})
