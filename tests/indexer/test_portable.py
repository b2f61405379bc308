"""Issue 28 item 5: an index is one folder (``DIR/current``, ``DIR/generations/``, ``DIR/history.json``,
``DIR/lock``): copies made with ``cp -r``, ``shutil.copytree`` (links followed or not), ``tar`` and a
move answer and take writes; an index of the old layout (``DIR`` a symlink to ``.DIR.generations/<gen>``)
opens as it is and becomes one folder on its next write, snapshots included."""
import os
import shutil
import subprocess
import tarfile

import pytest

from relsearch.indexer import migration, mutations, snapshots, store

from synthetic_index import answers, build, searcher_answers


@pytest.fixture
def index(tmp_path):
    target = tmp_path / "src" / "idx"
    build(target, n=300)
    mutations.delete(str(target), ["d7"])  # two generations: a snapshot to carry along
    return target


def test_an_index_is_one_folder_and_litters_nothing_beside_it(index):
    assert os.listdir(index.parent) == ["idx"] and index.is_dir() and not index.is_symlink()
    assert {"current", "generations", "history.json", "lock", "rejected.jsonl"} >= set(os.listdir(index))
    assert (index / "current").is_file() and not (index / "current").is_symlink()
    assert (index / "current").read_text().strip() == store.current_generation(index).name
    assert len(os.listdir(index / "generations")) == 2


def _cp_r(src, dest):
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)


def _tar(src, dest):
    archive = dest.parent.parent / "idx.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname=dest.name)
    with tarfile.open(archive) as tar:
        tar.extractall(dest.parent, filter="tar")


def _rsync(src, dest):
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed")
    subprocess.run(["rsync", "-r", f"{src}/", str(dest)], check=True)  # -r alone: no links, no hard links kept


COPIES = {"copytree": lambda s, d: shutil.copytree(s, d), "copytree-symlinks": lambda s, d: shutil.copytree(s, d, symlinks=True),
          "cp -r": _cp_r, "tar": _tar, "rsync -r": _rsync, "move": lambda s, d: shutil.move(s, d)}


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copied_or_moved_index_answers_and_takes_writes(index, tmp_path, how):
    before, published = answers(index), store.current_generation(index).name
    dest = tmp_path / "elsewhere" / "copy"
    dest.parent.mkdir()
    COPIES[how](index, dest)
    assert answers(dest) == before and store.current_generation(dest).name == published
    assert [s.name for s in snapshots.list_snapshots(dest)][0] == published
    report = mutations.delete(str(dest), ["d1"])
    assert report.published and report.deleted == 1
    assert "d1" not in [i for row in answers(dest, ids=()) for i, _ in row]
    assert os.listdir(dest.parent) == ["copy"]  # nothing written beside the copy
    if how != "move":
        assert answers(index) == before  # the original is untouched
    snapshots.rollback(dest)
    assert answers(dest) == before


def _to_old_layout(target):
    """Rewrite a one-folder index the way relsearch laid indexes out before: DIR a symlink to
    .DIR.generations/<gen>, with .DIR.history.json beside it."""
    name = store.current_generation(target).name
    gens, history = target.parent / f".{target.name}.generations", target.parent / f".{target.name}.history.json"
    os.rename(target / "generations", gens)
    os.rename(target / "history.json", history)
    shutil.rmtree(target)
    os.symlink(os.path.relpath(gens / name, target.parent), target)


def test_an_old_layout_index_opens_and_is_migrated_by_its_next_write(index):
    from relsearch.retrieval.search import Searcher

    _to_old_layout(index)
    before, old = answers(index), [s.name for s in snapshots.list_snapshots(index)]
    assert index.is_symlink() and len(old) == 2 and store.current_generation(index).name == old[0]
    reader = Searcher(str(index))  # opened on the old layout, before the migration
    report = mutations.delete(str(index), ["d1"])
    assert report.published and index.is_dir() and not index.is_symlink()
    assert os.listdir(index.parent) == ["idx"]  # .idx.generations, .idx.history.json, .idx.lock gone
    assert searcher_answers(reader) == before  # a reader keeps the generation it opened
    listed = [s.name for s in snapshots.list_snapshots(index)]
    assert listed[1:] == old and listed[0] == store.current_generation(index).name
    assert snapshots.rollback(index)[0] == old[0] and answers(index) == before
    assert snapshots.rollback(index, to=old[1])[0] == old[1]  # the snapshot from before the migration


def test_a_migration_killed_between_its_two_renames_is_finished_by_the_next_writer(index, monkeypatch):
    from relsearch import faults

    _to_old_layout(index)
    before = answers(index)

    class Killed(BaseException):
        pass

    real = faults.point

    def point(name):
        if name == "migrate.link-removed":
            raise Killed(name)
        real(name)

    monkeypatch.setattr(migration, "_exchange", lambda a, b: False)  # where renameat2 is missing
    monkeypatch.setattr(faults, "point", point)
    with pytest.raises(Killed):
        mutations.delete(str(index), ["d1"])
    assert not os.path.lexists(index) and list(index.parent.glob(".idx.migrating-*"))
    monkeypatch.setattr(faults, "point", real)
    assert mutations.delete(str(index), ["d1"]).published
    assert os.listdir(index.parent) == ["idx"] and index.is_dir()
    assert snapshots.rollback(index)[0] and answers(index) == before


def test_a_folder_that_is_no_index_is_refused(tmp_path):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="not a relsearch index"):
        build(other, n=20)
    assert os.listdir(other) == ["cat.jpg"]
    with pytest.raises(FileNotFoundError, match="no index at"):
        mutations.delete(str(tmp_path / "missing"), ["x"])
    assert not (tmp_path / "missing").exists()
