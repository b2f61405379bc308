"""The encoder dtype of an index is decided once, at build, and recorded in its manifest
(``encoder.precision``); every query encoder of the index runs it, whatever the bf16 probe of the
querying process says (the query-plan issue: answers moved with machine load)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import DEMO_CORPUS, copy_published, gen_of
from relsearch.encoder import model as model_mod
from relsearch.encoder import precision
from relsearch.encoder.model import EncoderConfig
from relsearch.indexer import store
from relsearch.indexer.integrity import IndexCorruptError
from relsearch.indexer.manifest import LEGACY_PRECISION, Manifest
from relsearch.pipelines.index import IndexInputError, IndexJob, run_index
from relsearch.retrieval.search import Searcher

ENERGY = {"APA", "XEC", "COP", "DVN", "EOG", "MRO", "OXY", "SWN"}
QUERY = "oil and gas exploration and production company"


def forced(use: bool):
    """A stand-in for the bf16 probe (encoder/precision.py bf16_choice): bf16 faster here, or not."""
    return lambda *a, **k: precision.Bf16Choice(use, f"{'bf16' if use else 'fp32'}: forced by the test")


@pytest.fixture(scope="module")
def bf16_index(tmp_path_factory) -> Path:
    """A 24-document index built with `auto` precision while the probe says bf16 (texts cut short:
    bf16 runs emulated, slowly, on a CPU without bf16 instructions)."""
    rows = [json.loads(line) for line in DEMO_CORPUS.read_text().splitlines()]
    rows = [r for r in rows if r["id"] in ENERGY] + rows[:16]
    corpus = tmp_path_factory.mktemp("corpus") / "energy.jsonl"
    corpus.write_text("".join(json.dumps({"id": r["id"], "text": r["text"][:200]}) + "\n" for r in rows))
    target = tmp_path_factory.mktemp("idx") / "energy"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(precision, "bf16_choice", forced(True))
        report = run_index(IndexJob(input=str(corpus), index=str(target), progress=False))
    assert report.indexed == 24 and report.published
    assert report.encoder.startswith("cpu, bfloat16 (bf16: forced by the test")
    return target


QUERY_SCRIPT = """
import sys
from relsearch.encoder import precision
precision.bf16_choice = lambda *a, **k: precision.Bf16Choice(sys.argv[1] == "bf16", "forced by the test")
from relsearch.cli import cli
cli.main(args=["query", sys.argv[2], "--index", sys.argv[3], "--json", "-k", "8"], prog_name="relsearch")
"""


def _query_in_processes(index: Path, *probes: str) -> list[list[tuple[str, float]]]:
    """The (id, score) hits of ``relsearch query --json`` in one new process per probe answer, run side by side."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    procs = [subprocess.Popen([sys.executable, "-c", QUERY_SCRIPT, probe, QUERY, str(index)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for probe in probes]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        hits = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(hits) == 8, out
        answers.append([(h["id"], h["score"]) for h in hits])
    return answers


def test_two_processes_whose_probes_disagree_give_identical_answers(bf16_index):
    """One process's probe says fp32, the other's bf16 (load, or another CPU): both encode the query
    in the index's recorded bf16, so ids and scores are identical, not a near tie that swaps."""
    as_fp32, as_bf16 = _query_in_processes(bf16_index, "fp32", "bf16")
    assert as_fp32 == as_bf16
    assert {i for i, _ in as_fp32[:5]} <= ENERGY


def test_the_manifest_records_the_precision_and_the_searcher_encodes_in_it(bf16_index, monkeypatch, caplog):
    manifest = store.read_manifest(gen_of(bf16_index))
    assert manifest.encoder["precision"] == "bf16" and manifest.precision == "bf16"
    monkeypatch.setattr(precision, "bf16_choice", forced(False))  # this process would choose fp32
    searcher = Searcher(str(bf16_index))
    assert searcher.encoder.dtype == torch.bfloat16 and searcher.encoder.precision == "bf16"
    assert searcher.encoder.precision_reason == "bf16: recorded in the index"
    assert not [r for r in caplog.records if "asked for" in r.getMessage()]
    # an explicit other precision is possible, and says that its answers may differ from the index's
    with caplog.at_level(logging.WARNING, logger="relsearch.encoder.precision"):
        explicit = Searcher(str(bf16_index), precision="fp32")
        assert explicit.encoder.dtype == torch.float32
    assert "the index was encoded in bf16" in caplog.text
    assert explicit.encoder.precision_reason == "fp32: asked for (the index records bf16)"


def test_a_manifest_without_precision_reads_as_fp32_and_a_bad_one_is_refused(bf16_index):
    data = json.loads((Path(gen_of(bf16_index)) / "manifest.json").read_text())
    del data["encoder"]["precision"]
    assert LEGACY_PRECISION == "fp32" and Manifest.from_json(data).precision == "fp32"
    data["encoder"]["precision"] = "int8"
    with pytest.raises(IndexCorruptError, match="encoder.precision"):
        Manifest.from_json(data)


def test_append_keeps_the_recorded_precision_and_refuses_another(bf16_index, tmp_path, monkeypatch):
    index = copy_published(bf16_index, tmp_path / "copy")
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "NEW", "text": "An offshore oil and gas driller."}) + "\n")
    monkeypatch.setattr(precision, "bf16_choice", forced(False))  # `auto` would be fp32 here
    with pytest.raises(IndexInputError, match="encoded in bf16"):
        run_index(IndexJob(input=str(more), index=str(index), append=True, precision="fp32", progress=False))
    report = run_index(IndexJob(input=str(more), index=str(index), append=True, progress=False))
    assert report.indexed == 1 and report.encoder == "cpu, bfloat16 (bf16: recorded in the index)"
    assert store.read_manifest(gen_of(index)).precision == "bf16"


@pytest.mark.parametrize("use", [True, False])
def test_settle_precision_decides_auto_once_from_the_probe(monkeypatch, use):
    """The build's driver turns `auto` into the concrete dtype its workers then run (no worker probes)."""
    monkeypatch.setattr(precision, "bf16_choice", forced(use))
    config, line = model_mod.settle_precision(EncoderConfig(device="cpu"))
    assert config.precision == ("bf16" if use else "fp32")
    assert line == f"cpu, {'bfloat16' if use else 'float32'} ({'bf16' if use else 'fp32'}: forced by the test)"
    config, line = model_mod.settle_precision(EncoderConfig(device="cpu"), recorded="bf16")
    assert config.precision == "bf16" and line == "cpu, bfloat16 (bf16: recorded in the index)"


def test_query_precision_follows_the_index_unless_asked_otherwise(caplog):
    for asked in (None, "auto", "bf16"):
        assert precision.query_precision("bf16", asked) == ("bf16", "bf16: recorded in the index")
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="relsearch.encoder.precision"):
        assert precision.query_precision("bf16", "fp32") == ("fp32", "fp32: asked for (the index records bf16)")
    assert len(caplog.records) == 1
    with pytest.raises(ValueError, match="unknown precision"):
        precision.query_precision("fp32", "int4")


def test_a_dtype_without_cpu_instructions_is_run_anyway_and_said_once(monkeypatch, caplog):
    """Both CPU paths: with bf16 instructions nothing is said; without them bf16 still runs, and the
    note comes once per process."""
    monkeypatch.setattr(precision, "_SLOW_SAID", set())
    assert precision.slow_dtype_note("cpu", torch.bfloat16, flags={"avx512_bf16"}) is None
    assert precision.slow_dtype_note("cpu", torch.bfloat16, flags={"amx_bf16", "avx2"}) is None
    assert precision.slow_dtype_note("cpu", torch.float32, flags=set()) is None
    assert precision.slow_dtype_note("cuda", torch.float16, flags=set()) is None
    with caplog.at_level(logging.WARNING, logger="relsearch.encoder.precision"):
        first = precision.slow_dtype_note("cpu", torch.bfloat16, flags={"avx2"})
        again = precision.slow_dtype_note("cpu", torch.bfloat16, flags={"avx2"})
        fp16 = precision.slow_dtype_note("cpu", torch.float16, flags={"avx2"})
    assert first == again and "without bf16 instructions" in first and "fp16 instructions" in fp16
    assert [r.getMessage() for r in caplog.records] == [first, fp16]  # each said once
