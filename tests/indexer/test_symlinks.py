"""Symlinks in and to an index folder: a link inside the index (``generations``, a generation) is
refused in one line and nothing outside the index is ever read, written or removed, also when the
link is put there while a writer runs; a link naming the index folder itself stands for that folder,
for reads and writes. And ``delete --ids`` reads a pipe."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from relsearch import faults
from relsearch.cli import cli
from relsearch.indexer import integrity, mutations, snapshots, store
from relsearch.indexer.integrity import IndexCorruptError
from relsearch.indexer.reader import open_index

from synthetic_index import answers, build
from conftest import gen_of, write_jsonl


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(integrity.ENV_CACHE, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    target = tmp_path_factory.mktemp("pristine") / "idx"
    build(target, n=300)
    return target


@pytest.fixture
def index(pristine, tmp_path):
    """A private copy of ``pristine`` (an index is one folder)."""
    shutil.copytree(pristine, tmp_path / "idx", symlinks=True)
    return tmp_path / "idx"


def invoke(*args) -> tuple[int, str]:
    out = CliRunner().invoke(cli, [str(a) for a in args])
    return out.exit_code, out.output


def ids_file(tmp_path: Path, *ids: str) -> Path:
    path = tmp_path / "ids.txt"
    path.write_text("".join(f"{i}\n" for i in ids))
    return path


def user_data(folder: Path) -> list[Path]:
    """Folders of someone else's files in ``folder``."""
    made = []
    for name in ("photos", "projects"):
        (folder / name).mkdir(parents=True)
        (folder / name / "keep.txt").write_text(name)
        made.append(folder / name / "keep.txt")
    return made


def test_a_symlinked_generations_folder_is_refused_and_nothing_beside_it_is_removed(index, tmp_path):
    """`DIR/generations` a link to a folder that also holds other data (an index folder received
    from someone else can carry one): reads and writes are refused in one line, so no clean-up of
    old generations ever runs there."""
    data = tmp_path / "data"
    shutil.move(index / store.GENERATIONS, data)
    precious = user_data(data)
    os.symlink(data, index / store.GENERATIONS)
    with pytest.raises(IndexCorruptError, match="generations is a symlink"):
        open_index(index)
    code, output = invoke("query", "--id", "d1", "--index", index, "-k", "3", "--json")
    assert code == 1 and output.count("\n") == 1 and "generations is a symlink" in output, output
    for i in range(3):  # the removal of old generations ran at the third write
        code, output = invoke("delete", "--index", index, "--ids", ids_file(tmp_path, f"d{i}"))
        assert code == 1 and output.count("\n") == 1 and "generations is a symlink" in output, output
    assert all(p.exists() for p in precious) and len(os.listdir(data)) == 3  # and the one generation


def test_a_generation_that_is_a_link_is_refused(index, tmp_path):
    """The published generation moved elsewhere and linked back: `current` would lead out of the
    index; refused (reading and writing) rather than followed."""
    gen = Path(gen_of(index))
    elsewhere = tmp_path / "elsewhere" / gen.name
    shutil.move(gen, elsewhere)
    os.symlink(elsewhere, gen)
    with pytest.raises(IndexCorruptError, match=f"{gen.name} is a symlink"):
        open_index(index)
    code, output = invoke("delete", "--index", index, "--ids", ids_file(tmp_path, "d1"))
    assert code == 1 and output.count("\n") == 1 and f"{gen.name} is a symlink" in output, output
    assert (elsewhere / store.MANIFEST).is_file() and gen.is_symlink()


def test_only_generations_a_writer_made_are_removed(index, tmp_path):
    """Retention removes old generations and writers' debris, never a folder someone put in
    `generations` (nor a build folder's look-alike)."""
    gens = store.generations_dir(index)
    precious = user_data(gens)
    (gens / "build-notes").mkdir()  # not a build folder's name: build-<hex>
    debris = gens / "20990101T000000-1-abcdef"  # what a writer killed before publishing leaves
    shutil.copytree(gen_of(index), debris)
    for i in range(4):
        mutations.delete(str(index), [f"d{i}"])
    assert all(p.exists() for p in precious) and (gens / "build-notes").is_dir() and not debris.exists()
    assert len([n for n in os.listdir(gens) if store.GENERATION_NAME.fullmatch(n)]) == store.KEEP_GENERATIONS


def test_a_symlink_to_an_index_folder_reads_and_writes_that_folder(index, tmp_path):
    """`ln -s idx link; relsearch query --index link` answers like the folder, and a write through
    the link publishes in the folder and leaves the link a link."""
    link = tmp_path / "link"
    os.symlink("idx", link)  # relative, as `ln -s` is usually typed
    before = answers(index)
    assert answers(link) == before and store.current_generation(link) == Path(gen_of(index))
    code, output = invoke("query", "--id", "d1", "--index", link, "-k", "3", "--json")
    assert code == 0 and output.count("\n") == 3 and (0, output) == invoke("query", "--id", "d1", "--index", index,
                                                                             "-k", "3", "--json"), output
    code, output = invoke("delete", "--index", link, "--ids", ids_file(tmp_path, "d1"))
    assert code == 0, output
    assert link.is_symlink() and os.readlink(link) == "idx" and not store.legacy(link)
    assert open_index(index).manifest.counts.documents == 299 and answers(link) == answers(index)
    name, _ = snapshots.rollback(link)  # the snapshots of the folder, through the link
    assert store.current_generation(index).name == name and answers(index) == before
    assert sorted(os.listdir(tmp_path)) == sorted(["cache", "idx", "ids.txt", "link"])


def test_a_symlink_to_a_folder_that_is_no_index_is_refused_and_left_alone(tmp_path):
    """A write through a link to someone's folder used to copy that folder into a new index in the
    link's place; it is refused, and the folder and the link stay as they were."""
    precious = user_data(tmp_path / "home")
    link = tmp_path / "link"
    os.symlink(tmp_path / "home", link)
    code, output = invoke("delete", "--index", link, "--ids", ids_file(tmp_path, "d1"))
    assert code == 1 and output.count("\n") == 1 and "is not a relsearch index" in output, output
    assert link.is_symlink() and all(p.exists() for p in precious)
    assert sorted(os.listdir(tmp_path / "home")) == ["photos", "projects"]


def test_delete_reads_the_ids_from_a_pipe(index):
    """`relsearch delete --ids <(echo d1)`: process substitution gives a pipe, /dev/fd/N, which
    cannot seek."""
    read, write = os.pipe()
    try:
        os.write(write, b"d1\n{\"id\": \"d2\"}\n")
        os.close(write)
        code, output = invoke("delete", "--index", index, "--ids", f"/dev/fd/{read}")
    finally:
        os.close(read)
    assert code == 0, output
    assert open_index(index).manifest.counts.documents == 298


def tree(folder: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, dirs, files in os.walk(folder) for name in dirs + files)


@pytest.mark.parametrize("point", ["index.shard-written", "append.faiss-written", "commit.mirrors-loaded"])
def test_generations_swapped_for_a_link_during_an_append_leads_no_write_out(small_index, tmp_path, monkeypatch,
                                                                           point):
    """`generations` moved aside and replaced by a link to someone's folder while `index --append`
    runs: after the first encoded shard (the shards used to follow the link: Beam makes the folders
    of a path it writes), while the new generation is written, and before its manifest. The append
    stops in one line naming the link, the linked folder receives nothing, and with the folder put
    back the index is the one it was."""
    index = tmp_path / "idx"
    shutil.copytree(small_index, index, symlinks=True)
    published, documents = store.current_generation(index).name, open_index(index).manifest.counts.documents
    outside, aside = tmp_path / "outside", tmp_path / "aside"
    user_data(outside)
    before = tree(outside)
    corpus = write_jsonl(tmp_path / "more.jsonl", [{"id": f"new{i}", "text": f"a maker of bicycles, number {i}"}
                                                   for i in range(6)])
    swapped = []

    def swap(name: str) -> None:
        if name == point and not swapped:
            os.rename(index / store.GENERATIONS, aside)
            os.symlink(outside, index / store.GENERATIONS)
            swapped.append(name)

    monkeypatch.setattr(faults, "point", swap)
    code, output = invoke("index", corpus, "--index", index, "--append", "--chunk-lines", 2, "--quiet")
    assert swapped and tree(outside) == before
    assert code == 1 and output.count("\n") == 1, output
    assert f"{index / store.GENERATIONS} is a symlink now" in output and "publishes nothing" in output, output
    os.unlink(index / store.GENERATIONS)
    os.rename(aside, index / store.GENERATIONS)
    assert store.current_generation(index).name == published
    assert open_index(index).manifest.counts.documents == documents
