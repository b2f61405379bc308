"""Crash at any point: `relsearch index`, `index --append`, `delete`, `compact` and `rollback` are SIGKILLed at
named points of their write (RELSEARCH_FAULT, relsearch/faults.py). Afterwards the last good index
loads and answers exactly as before (or, killed after the swap, exactly as the finished run's),
no debris is taken for an index, and the same command run again completes and cleans up.

The default suite runs a few points of the fast (model-free) commands; the whole matrix is marked
``killpoints``: ``make test-kill``.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from relsearch import faults
from relsearch.indexer import mutations, reader, store

from conftest import DEMO_CORPUS
from synthetic_index import answers, build, run_cli, write_ids
from conftest import copy_published, gen_of

kill = pytest.mark.killpoints
COMPANIES = ("MMM", "ABT", "ABBV", "ACN", "ATVI")
AFTER_SWAP = {"publish.swapped", "commit.published"}


def published_copy(src: Path, dest: Path) -> Path:
    """``dest`` publishing a copy of ``src``'s generation, named as if its writer were long gone."""
    return copy_published(src, dest, "20000101T000000-999999-abcdef")


def killed(*args, point: str) -> subprocess.CompletedProcess:
    proc = run_cli(*args, env={faults.ENV: point})
    assert proc.returncode == -9, f"not killed at {point}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def assert_clean(target: Path) -> None:
    """Only the retained generations are left (the published one first): no debris of the killed
    run, no build shards, no temporary links."""
    retained = [g.name for g in store.retained(target)]
    assert retained[0] == os.path.basename(gen_of(target))
    assert sorted(os.listdir(store.generations_dir(target.absolute()))) == sorted(retained)
    assert not list(target.glob(".current-*")) and not list(target.parent.glob(f".{target.name}*"))


def assert_only_published_is_an_index(target: Path, before_gen: str | None) -> None:
    """The link is intact and points at a complete, verified generation; any other folder beside it
    is debris that nothing opens (the next writer removes it)."""
    if before_gen is None:
        assert not os.path.lexists(target / store.CURRENT)
        out = run_cli("query", "--id", "x", "--index", target)
        assert out.returncode == 1 and "no index at" in out.stderr and "Traceback" not in out.stderr
        return
    assert target.is_dir() and (target / store.CURRENT).is_file()
    files = reader.open_index(target)  # verifies every file against the manifest's checksums
    assert str(files.root) == gen_of(target)


# ---------------------------------------------------------------- delete and compact (no model)

DELETE_POINTS = ["delete.tombstones-written", "commit.manifest-written", "publish.link-created", "publish.swapped"]
COMPACT_POINTS = ["compact.rows-copied", "build.faiss-written", "commit.manifest-written", "publish.link-created",
                  "publish.swapped"]
FAST_POINTS = {("delete", "publish.link-created"), ("compact", "commit.manifest-written")}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A synthetic index with tombstones (so compact has work) and its answers."""
    target = tmp_path_factory.mktemp("base") / "idx"
    build(target, n=400)
    mutations.delete(str(target), ["d7", "d8", "d9"])
    return target


def _cases():
    for op, points in (("delete", DELETE_POINTS), ("compact", COMPACT_POINTS)):
        for point in points:
            yield pytest.param(op, point, marks=() if (op, point) in FAST_POINTS else kill, id=f"{op}-{point}")


@pytest.mark.parametrize("op, point", list(_cases()))
def test_mutation_killed_at_any_point(base, tmp_path, op, point):
    target = published_copy(base, tmp_path / "idx")
    before, before_gen = answers(target), gen_of(target)
    args = ["delete", "--index", target, "--ids", write_ids(tmp_path / "ids.txt", ["d1", "d20", "d21"])] \
        if op == "delete" else ["compact", "--index", target]
    # what the finished command leaves, from an untouched copy
    reference = published_copy(base, tmp_path / "ref")
    if op == "delete":
        mutations.delete(str(reference), ["d1", "d20", "d21"])
    else:
        mutations.compact(str(reference))
    after = answers(reference)

    killed(*args, point=point)
    assert_only_published_is_an_index(target, before_gen)
    if point in AFTER_SWAP:
        assert gen_of(target) != before_gen and answers(target) == after
    else:
        assert gen_of(target) == before_gen and answers(target) == before
    out = run_cli(*args)  # the same command again completes
    assert out.returncode == 0, out.stderr
    assert answers(target) == after
    assert_clean(target)


@pytest.mark.parametrize("point", ["rollback.verified", pytest.param("publish.link-created", marks=kill),
                                   "publish.swapped"])
def test_rollback_killed_at_any_point(base, tmp_path, point):
    target = published_copy(base, tmp_path / "idx")
    restored = answers(target)
    mutations.delete(str(target), ["d1", "d20"])
    before, before_gen = answers(target), gen_of(target)
    killed("rollback", "--index", target, point=point)
    assert_only_published_is_an_index(target, before_gen)
    if point in AFTER_SWAP:
        assert answers(target) == restored
    else:
        assert gen_of(target) == before_gen and answers(target) == before
        assert run_cli("rollback", "--index", target).returncode == 0
    assert answers(target) == restored
    assert_clean(target)


# ---------------------------------------------------------------- the Elasticsearch mirror

@pytest.mark.parametrize("point", [pytest.param("commit.mirrors-loaded", marks=kill), "commit.published"])
def test_mirror_killed_between_the_two_switches(base, tmp_path, point):
    """Killed before the manifest: the alias still serves the old index. Killed after the local
    swap but before the alias swap: the alias serves the old index (stale by one mutation) and the
    re-run brings both up to date; an orphan ES index may remain (documented)."""
    from es_server import EsTestServer

    target = published_copy(base, tmp_path / "idx")
    with EsTestServer(lifetime_s=300) as server:
        es = ["--es-url", server.url, "--es-index", "docs", "--es-index-type", "flat"]
        assert run_cli("compact", "--index", target, *es).returncode == 0
        alias_before = set(server.aliases["docs"])
        args = ["delete", "--index", target, "--ids", write_ids(tmp_path / "ids.txt", ["d1"]), *es]
        killed(*args, point=point)
        assert set(server.aliases["docs"]) == alias_before  # the alias never points at a half-loaded index
        assert_only_published_is_an_index(target, gen_of(target))
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
        manifest = reader.open_index(target).manifest
        assert set(server.aliases["docs"]) == {manifest.backends["elasticsearch"]["index"]}
        assert manifest.counts.documents == 396 == manifest.backends["elasticsearch"]["read"]


@kill
def test_rollback_with_a_mirror_killed_after_marking_it(base, tmp_path):
    """Killed after the restored generation's manifest marks its Elasticsearch entry stale, before
    the swap: the newer generation still answers (its files and alias untouched) and the rollback
    run again completes."""
    from es_server import EsTestServer

    target = published_copy(base, tmp_path / "idx")
    with EsTestServer(lifetime_s=300) as server:
        es = ["--es-url", server.url, "--es-index", "docs", "--es-index-type", "flat"]
        assert run_cli("compact", "--index", target, *es).returncode == 0
        restored = answers(target)
        ids = write_ids(tmp_path / "ids.txt", ["d1"])
        assert run_cli("delete", "--index", target, "--ids", ids, *es).returncode == 0
        before, before_gen, alias = answers(target), gen_of(target), set(server.aliases["docs"])
        killed("rollback", "--index", target, point="rollback.mirrors-marked")
        assert_only_published_is_an_index(target, before_gen)
        assert gen_of(target) == before_gen and answers(target) == before
        assert run_cli("rollback", "--index", target).returncode == 0
        assert answers(target) == restored and set(server.aliases["docs"]) == alias
        assert reader.open_index(target).manifest.backends["elasticsearch"]["stale"] is True
        assert_clean(target)


# ---------------------------------------------------------------- index and index --append (the model)

INDEX_POINTS = ["index.shard-written:2", "build.rows-written", "build.faiss-written", "commit.manifest-written",
                "publish.link-created", "publish.swapped"]
APPEND_POINTS = ["index.shard-written:1", "append.faiss-written", "commit.manifest-written", "publish.link-created",
                 "publish.swapped"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    lines = DEMO_CORPUS.read_text().splitlines()
    (root / "rebuild.jsonl").write_text("\n".join(lines[200:230]) + "\n")
    (root / "more.jsonl").write_text("\n".join(lines[:3] + lines[300:320]) + "\n")  # 3 replace, 20 new
    return root


def _index_args(corpora, target, op):
    corpus = corpora / ("rebuild.jsonl" if op == "index" else "more.jsonl")
    append = ["--append"] if op == "append" else []
    return ["index", corpus, "--index", target, "--chunk-lines", "10", "--quiet", *append]


@pytest.fixture(scope="module")
def reference(small_index, corpora, tmp_path_factory):
    """Answers of uninterrupted runs of the two commands."""
    out = {}
    for op in ("index", "append"):
        target = published_copy(small_index, tmp_path_factory.mktemp(op) / "idx")
        assert run_cli(*_index_args(corpora, target, op)).returncode == 0
        out[op] = answers(target, ids=COMPANIES)
    return out


@kill
@pytest.mark.parametrize("op, point", [("index", p) for p in INDEX_POINTS] + [("append", p) for p in APPEND_POINTS])
def test_index_killed_at_any_point(small_index, corpora, reference, tmp_path, op, point):
    target = published_copy(small_index, tmp_path / "idx")
    before, before_gen = answers(target, ids=COMPANIES), gen_of(target)
    args = _index_args(corpora, target, op)
    killed(*args, point=point)
    assert_only_published_is_an_index(target, before_gen)
    if point in AFTER_SWAP:
        assert answers(target, ids=COMPANIES) == reference[op]
    else:
        assert gen_of(target) == before_gen and answers(target, ids=COMPANIES) == before
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    if point.startswith("index.shard-written"):
        assert "resumed:" in out.stdout  # the shards finished before the kill were kept
    assert answers(target, ids=COMPANIES) == reference[op]
    assert_clean(target)


@kill
def test_index_killed_while_the_workers_fill_ivf_units(small_index, corpora, tmp_path):
    """Killed after the second of three IVF units is written: the old index still answers, and the
    run again resumes from the encoded shards, fills the units anew and gives the uninterrupted answers."""
    reference = published_copy(small_index, tmp_path / "reference" / "idx")
    target = published_copy(small_index, tmp_path / "idx")
    ivf = ["--faiss-index", "IVF4,Flat", "--faiss-add-units", "3"]
    assert run_cli(*_index_args(corpora, reference, "index"), *ivf).returncode == 0
    before, before_gen = answers(target, ids=COMPANIES), gen_of(target)
    killed(*_index_args(corpora, target, "index"), *ivf, point="index.faiss-unit-written:2")
    assert gen_of(target) == before_gen and answers(target, ids=COMPANIES) == before
    out = run_cli(*_index_args(corpora, target, "index"), *ivf)
    assert out.returncode == 0 and "resumed: 3 chunks" in out.stdout, out.stderr
    assert answers(target, ids=COMPANIES) == answers(reference, ids=COMPANIES)
    assert_clean(target)


@kill
def test_append_killed_while_merging_segments(small_index, corpora, tmp_path):
    """A third segment with --max-segments 2 merges the two appended ones inside the new generation."""
    reference = published_copy(small_index, tmp_path / "reference" / "idx")
    target = published_copy(small_index, tmp_path / "idx")
    rebuild, more = _index_args(corpora, target, "index")[1], _index_args(corpora, target, "append")[1]
    for index in (reference, target):
        assert run_cli("index", rebuild, "--index", index, "--append", "--quiet").returncode == 0
    merge = ["index", more, "--index", target, "--append", "--max-segments", "2", "--quiet"]
    before, before_gen = answers(target, ids=COMPANIES), gen_of(target)
    killed(*merge, point="append.segments-merged")
    assert gen_of(target) == before_gen and answers(target, ids=COMPANIES) == before
    assert run_cli(*merge).returncode == 0
    assert run_cli(*[reference if a == target else a for a in merge]).returncode == 0
    assert len(reader.open_index(target).segments) == 2
    assert answers(target, ids=COMPANIES) == answers(reference, ids=COMPANIES)
    assert_clean(target)


@kill
@pytest.mark.parametrize("point", ["build.rows-written", "publish.link-created"])
def test_first_build_killed_leaves_no_index(corpora, tmp_path, point):
    target = tmp_path / "idx"
    killed(*_index_args(corpora, target, "index"), point=point)
    assert_only_published_is_an_index(target, None)
    assert run_cli(*_index_args(corpora, target, "index")).returncode == 0
    assert reader.open_index(target).docstore.count() == 30
    assert_clean(target)


# ------------------------------------------------------------------------------------- train
@kill
def test_killed_train_resumes_from_its_checkpoint_and_never_loses_the_last_bundle(tmp_path):
    """SIGKILL `relsearch train` after its first checkpoint, and again while swapping in the new
    bundle: the rerun resumes (the finished relation is not retrained) and ends with the bundle an
    uninterrupted run writes; the previous bundle is never lost."""
    import json

    from relsearch.encoder.bundle import load_bundle

    from conftest import shared

    rows = [json.loads(line) for line in open(shared("trecqa", "triples", "train.jsonl"))][:60]
    for i, r in enumerate(rows):
        r["relation"] = "a" if i % 2 else "b"
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [data, "--epochs", "2", "--quiet", "--cache-dir", tmp_path / "cache"]
    assert run_cli("train", *common, "--out", tmp_path / "whole").returncode == 0
    out = tmp_path / "resumed"
    killed("train", *common, "--out", out, point="train.checkpoint-saved:1")
    assert not out.exists() and (tmp_path / "resumed.checkpoint").is_dir()
    done = run_cli("train", *common, "--out", out)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "resumed.checkpoint").exists()
    whole, resumed = load_bundle(str(tmp_path / "whole")), load_bundle(str(out))
    for name in ("a", "b"):
        assert (whole.operators[name].params["W"] == resumed.operators[name].params["W"]).all()
    before = (out / "bundle.json").read_text()
    killed("train", *common, "--out", out, "--seed", "14", point="train.bundle-set-aside")
    assert (tmp_path / "resumed.old" / "bundle.json").read_text() == before  # set aside, not lost
    again = run_cli("train", *common, "--out", out, "--seed", "14")
    assert again.returncode == 0, again.stderr
    assert load_bundle(str(out)).info["config"]["seed"] == 14 and before != (out / "bundle.json").read_text()
