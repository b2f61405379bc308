"""Snapshots and rollback (indexer/snapshots.py, store.publish's history): retention across
mutations, rollback to identical answers and back again, sizes with shared hard links, errors,
and generations that were never published never offered."""
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer import integrity, mutations, reader, snapshots, store

from synthetic_index import answers, build
from conftest import gen_of


@pytest.fixture
def index(tmp_path):
    target = tmp_path / "idx"
    build(target, n=300)
    return target


def names(target):
    return [g.name for g in store.retained(target)]


def test_the_last_three_published_generations_are_retained(index):
    built = gen_of(index)
    for i in range(4):
        mutations.delete(str(index), [f"d{i}"])
    kept = names(index)
    assert len(kept) == 3 and kept[0] == os.path.basename(gen_of(index))
    assert sorted(os.listdir(store.generations_dir(index.absolute()))) == sorted(kept)
    assert not os.path.exists(built)
    assert store.read_history(index)["published"][-3:] == kept[::-1]

    snapshots.set_keep(index, 1)  # applied at once
    assert os.listdir(store.generations_dir(index.absolute())) == [kept[0]]
    snapshots.set_keep(index, 5)
    mutations.delete(str(index), ["d10"])
    assert len(names(index)) == 2


def test_rollback_restores_the_previous_answers_and_can_be_undone(index):
    before, first = answers(index), os.path.basename(gen_of(index))
    mutations.delete(str(index), ["d1", "d2"])
    mutations.append(str(index), [], n=0, run={"read": 0})
    after = answers(index)
    latest = os.path.basename(gen_of(index))
    assert after != before

    name, manifest = snapshots.rollback(index, to=first)
    assert name == first and manifest.counts.documents == 300
    assert answers(index) == before
    assert names(index)[:2] == [first, latest]  # the generation rolled back from is still retained
    snapshots.rollback(index, to=latest)  # undo
    assert answers(index) == after
    assert snapshots.rollback(index)[0] == first  # default: the previously published one
    mutations.delete(str(index), ["d3"])  # mutations continue from the restored generation
    assert reader.open_index(index).manifest.counts.documents == 299


def test_sizes_count_shared_hard_links_once(index):
    mutations.delete(str(index), ["d1"])
    listed = snapshots.list_snapshots(index)
    assert [s.current for s in listed] == [True, False] and [s.op for s in listed] == ["delete", "build"]
    current, built = listed
    assert current.documents == 299 and built.documents == 300
    vectors = os.path.getsize(gen_of(index) + "/vectors.npy")
    assert current.bytes > vectors and built.bytes > vectors
    # the delete generation shares every segment file: what it alone holds is its tombstones and manifest
    assert current.unique_bytes < 20_000 and built.unique_bytes < 20_000


def test_rollback_errors_name_the_way_out(index):
    with pytest.raises(snapshots.SnapshotError, match="nothing to roll back to"):
        snapshots.rollback(index)
    mutations.delete(str(index), ["d1"])
    with pytest.raises(snapshots.SnapshotError, match="no retained generation 'nope'; retained: "):
        snapshots.rollback(index, to="nope")
    with pytest.raises(snapshots.SnapshotError, match="already the published"):
        snapshots.rollback(index, to=names(index)[0])
    with pytest.raises(FileNotFoundError):
        snapshots.rollback(index.parent / "missing")


def test_a_damaged_snapshot_is_refused_and_the_index_keeps_answering(index, monkeypatch):
    previous = gen_of(index)
    mutations.delete(str(index), ["d1", "unknown"])  # a rejection: rejected.jsonl is written anew, not linked
    current, before = gen_of(index), answers(index)
    (store.Path(previous) / "rejected.jsonl").write_text("tampered\n")  # not a hard link of the current one
    monkeypatch.setenv(integrity.ENV_VERIFY, "full")
    with pytest.raises(store.IndexCorruptError, match=f"cannot roll back to {os.path.basename(previous)}: .*rejected.jsonl"
                       f".* still serves {os.path.basename(current)}"):
        snapshots.rollback(index)
    assert gen_of(index) == current and answers(index) == before


def test_a_generation_never_published_is_never_a_snapshot(index):
    mutations.delete(str(index), ["d1"])
    gens = store.generations_dir(index.absolute())
    orphan = gens / "20990101T000000-1-abcdef"  # what a writer killed after its manifest leaves
    shutil.copytree(gen_of(index), orphan)
    assert orphan.name not in names(index)
    with pytest.raises(snapshots.SnapshotError, match="no retained generation"):
        snapshots.rollback(index, to=orphan.name)
    mutations.delete(str(index), ["d2"])
    assert not orphan.exists()


def test_cli_snapshots_and_rollback(index):
    mutations.delete(str(index), ["d1"])
    runner = CliRunner()
    out = runner.invoke(cli, ["snapshots", "--index", str(index), "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [r["current"] for r in rows] == [True, False] and rows[1]["documents"] == 300
    out = runner.invoke(cli, ["rollback", "--index", str(index)])
    assert out.exit_code == 0 and f"now serves generation {rows[1]['name']} (300 documents)" in out.output
    out = runner.invoke(cli, ["rollback", "--index", str(index), "--to", "nope"])
    assert out.exit_code == 1 and "no retained generation 'nope'" in out.output


def test_an_open_api_index_follows_a_rollback(index):
    from relsearch.api import open_index

    mutations.delete(str(index), ["d1"])
    api = open_index(index)
    assert api.searcher().files.manifest.counts.documents == 299
    restored = api.rollback()
    assert api.searcher().files.root.name == restored
    assert api.searcher().files.manifest.counts.documents == 300
    assert [s.name for s in api.snapshots()][0] == restored


def test_listing_shows_a_damaged_snapshot_and_the_total_on_disk(index):
    mutations.delete(str(index), ["d1"])
    previous = store.retained(index)[1]
    (previous / store.MANIFEST).write_text("{")
    listed = snapshots.list_snapshots(index)
    assert listed[0].damaged is None and "not valid JSON" in listed[1].damaged
    # hard-linked segment files count once: all retained generations together are barely more than one
    assert listed[0].bytes < snapshots.retained_bytes(index) < listed[0].bytes + 20_000
    out = CliRunner().invoke(cli, ["snapshots", "--index", str(index)])
    assert out.exit_code == 0 and "damaged: " in out.output and "2 generations retained (keep 3)" in out.output
    with pytest.raises(store.IndexCorruptError):
        snapshots.rollback(index)


def test_keep_is_bounded_and_persisted_through_the_python_api(index):
    from relsearch.api import open_index

    api = open_index(index)
    for bad in (0, store.MAX_HISTORY + 1):
        with pytest.raises(snapshots.SnapshotError, match="keep must be between 1"):
            api.snapshots(keep=bad)
    assert snapshots.keep_of(index) == 3
    assert len(api.snapshots(keep=2)) == 1
    for i in range(3):
        mutations.delete(str(index), [f"d{i}"])
    assert len(api.snapshots()) == 2 and snapshots.keep_of(index) == 2
    out = CliRunner().invoke(cli, ["snapshots", "--index", str(index), "--keep", "0"])
    assert out.exit_code == 1 and "keep must be between 1" in out.output


# ---------------------------------------------------------------- the Elasticsearch mirror

def test_a_rollback_marks_the_elasticsearch_mirror_stale_and_its_undo_fresh(index, tmp_path):
    from es_server import EsTestServer

    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n")
    runner = CliRunner()
    with EsTestServer(lifetime_s=300) as server:
        es = ["--es-url", server.url, "--es-index", "docs", "--es-index-type", "flat"]
        assert runner.invoke(cli, ["compact", "--index", str(index), *es]).exit_code == 0
        first = os.path.basename(gen_of(index))
        assert runner.invoke(cli, ["delete", "--index", str(index), "--ids", str(ids), *es]).exit_code == 0
        latest = os.path.basename(gen_of(index))
        newer = reader.open_index(index).manifest.backends["elasticsearch"]["index"]
        assert server.aliases["docs"] == {newer}

        out = runner.invoke(cli, ["rollback", "--index", str(index)])
        assert out.exit_code == 0, out.output
        assert f"alias docs still holds index {newer}, not this generation's contents" in out.output
        restored = reader.open_index(index).manifest  # verified: the rewritten manifest lists the same files
        assert restored.backends["elasticsearch"]["stale"] is True
        assert restored.backends["elasticsearch"]["alias_holds"] == newer
        assert server.aliases["docs"] == {newer}  # Elasticsearch itself is not touched
        out = runner.invoke(cli, ["query", "--id", "d2", "--index", str(index), "--json", "--backend", "es", *es[:4]])
        assert out.exit_code == 0 and "marks the Elasticsearch mirror docs stale" in out.output

        out = runner.invoke(cli, ["rollback", "--index", str(index), "--to", latest])  # undo: the alias holds it
        assert out.exit_code == 0 and f"alias docs still holds this generation's mirror ({newer})" in out.output
        assert "stale" not in reader.open_index(index).manifest.backends["elasticsearch"]

        snapshots.rollback(index, to=first)  # a later mutation with --es-url mirrors again
        assert runner.invoke(cli, ["delete", "--index", str(index), "--ids", str(ids), *es]).exit_code == 0
        mirror = reader.open_index(index).manifest.backends["elasticsearch"]
        assert "stale" not in mirror and server.aliases["docs"] == {mirror["index"]} and mirror["read"] == 299


def test_mirrors_after_rollback_cases():
    fresh_a = {"alias": "docs", "index": "docs-a", "read": 3}
    fresh_b = {"alias": "docs", "index": "docs-b", "read": 2}
    after = snapshots.mirrors_after_rollback
    assert after({"elasticsearch": fresh_a}, {"elasticsearch": fresh_b}) == {
        "elasticsearch": {**fresh_a, "stale": True, "alias_holds": "docs-b", "own_index": True}}
    # a generation made without --es-url only copied the entry (stale): docs-a was never its mirror
    copied = {**fresh_a, "stale": True}
    assert after({"elasticsearch": copied}, {"elasticsearch": fresh_a})["elasticsearch"]["stale"] is True
    assert after({"elasticsearch": fresh_a}, {"elasticsearch": copied}) == {"elasticsearch": fresh_a}
    # a restored generation without a mirror learns that the alias holds other contents
    assert after({}, {"elasticsearch": fresh_b}) == {
        "elasticsearch": {**fresh_b, "stale": True, "alias_holds": "docs-b", "own_index": False}}
    # another alias: what it holds now is unknown, so the entry is stale
    other = {"alias": "other", "index": "other-x"}
    assert after({"elasticsearch": other}, {"elasticsearch": fresh_b})["elasticsearch"]["alias_holds"] is None
    assert after({}, {}) == {}


def test_a_rollback_leaves_an_interrupted_build_resumable(index):
    mutations.delete(str(index), ["d1"])
    shards = store.generations_dir(index.absolute()) / "build-0123456789abcdef"
    shards.mkdir()
    (shards / "lock").touch()  # unlocked: what a killed build leaves
    (shards / "0.npz").write_bytes(b"shard")
    snapshots.rollback(index)
    assert (shards / "0.npz").exists()  # a rollback is not a build of other input
    mutations.delete(str(index), ["d2"])
    assert not shards.exists()  # a mutation still clears them, as before


def test_a_reader_of_a_generation_retention_removes_keeps_answering(index):
    from relsearch.retrieval.search import Searcher

    from synthetic_index import searcher_answers

    reader = Searcher(str(index))
    try:
        before, gen = searcher_answers(reader), gen_of(index)
        for i in range(3):  # keep 3: the reader's generation leaves the retained ones
            mutations.delete(str(index), [f"d{i}"])
        assert not os.path.exists(gen)
        assert searcher_answers(reader) == before
    finally:
        reader.files.docstore.close()
