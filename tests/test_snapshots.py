"""Snapshots and rollback (indexer/snapshots.py, store.publish's history): retention across
mutations, rollback to identical answers and back again, sizes with shared hard links, errors,
and generations that were never published never offered."""
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer import integrity, mutations, snapshots, store

from synthetic_index import answers, build


@pytest.fixture
def index(tmp_path):
    target = tmp_path / "idx"
    build(target, n=300)
    return target


def names(target):
    return [g.name for g in store.retained(target)]


def test_the_last_three_published_generations_are_retained(index):
    built = os.path.realpath(index)
    for i in range(4):
        mutations.delete(str(index), [f"d{i}"])
    kept = names(index)
    assert len(kept) == 3 and kept[0] == os.path.basename(os.path.realpath(index))
    assert sorted(os.listdir(store.generations_dir(index.absolute()))) == sorted(kept)
    assert not os.path.exists(built)
    assert store.read_history(index)["published"][-3:] == kept[::-1]

    snapshots.set_keep(index, 1)  # applied at once
    assert os.listdir(store.generations_dir(index.absolute())) == [kept[0]]
    snapshots.set_keep(index, 5)
    mutations.delete(str(index), ["d10"])
    assert len(names(index)) == 2


def test_rollback_restores_the_previous_answers_and_can_be_undone(index):
    before, first = answers(index), os.path.basename(os.path.realpath(index))
    mutations.delete(str(index), ["d1", "d2"])
    mutations.append(str(index), [], n=0, run={"read": 0})
    after = answers(index)
    latest = os.path.basename(os.path.realpath(index))
    assert after != before

    name, manifest = snapshots.rollback(index, to=first)
    assert name == first and manifest["counts"]["documents"] == 300
    assert answers(index) == before
    assert names(index)[:2] == [first, latest]  # the generation rolled back from is still retained
    snapshots.rollback(index, to=latest)  # undo
    assert answers(index) == after
    assert snapshots.rollback(index)[0] == first  # default: the previously published one
    mutations.delete(str(index), ["d3"])  # mutations continue from the restored generation
    assert store.open_index(index).manifest["counts"]["documents"] == 299


def test_sizes_count_shared_hard_links_once(index):
    mutations.delete(str(index), ["d1"])
    listed = snapshots.list_snapshots(index)
    assert [s.current for s in listed] == [True, False] and [s.op for s in listed] == ["delete", "build"]
    current, built = listed
    assert current.documents == 299 and built.documents == 300
    vectors = os.path.getsize(os.path.realpath(index) + "/vectors.npy")
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
    previous = os.path.realpath(index)
    mutations.delete(str(index), ["d1"])
    current, before = os.path.realpath(index), answers(index)
    (store.Path(previous) / "rejected.jsonl").write_text("tampered\n")  # not a hard link of the current one
    monkeypatch.setenv(integrity.ENV_VERIFY, "full")
    with pytest.raises(store.IndexCorruptError, match="rejected.jsonl"):
        snapshots.rollback(index)
    assert os.path.realpath(index) == current and answers(index) == before


def test_a_generation_never_published_is_never_a_snapshot(index):
    mutations.delete(str(index), ["d1"])
    gens = store.generations_dir(index.absolute())
    orphan = gens / "20990101T000000-1-abcdef"  # what a writer killed after its manifest leaves
    shutil.copytree(os.path.realpath(index), orphan)
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
    assert api.searcher().files.manifest["counts"]["documents"] == 299
    restored = api.rollback()
    assert api.searcher().files.root.name == restored
    assert api.searcher().files.manifest["counts"]["documents"] == 300
    assert [s.name for s in api.snapshots()][0] == restored
