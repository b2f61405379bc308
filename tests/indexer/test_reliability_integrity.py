"""Index integrity and safe loading: checksums in the manifest, damaged files named in clear errors
(never a segfault or wrong results), manifest paths confined to the index, no pickles anywhere."""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer import integrity, store
from relsearch.indexer.integrity import IndexCorruptError
from relsearch.indexer.reader import open_index

from synthetic_index import answers, build
from conftest import gen_of

REPO = Path(__file__).resolve().parents[2]
DATA_FILES = [store.FAISS_FILE, store.VECTORS_FILE, store.DOCSTORE_FILE, store.DELETED_FILE]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(integrity.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(integrity.ENV_VERIFY, raising=False)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A published index with every kind of file (a delete adds deleted.npy)."""
    from relsearch.indexer import mutations

    target = tmp_path_factory.mktemp("pristine") / "idx"
    build(target, n=300)
    mutations.delete(str(target), ["d5", "d6"])
    return target


@pytest.fixture
def index(pristine, tmp_path):
    """A private copy of ``pristine`` (an index is one folder)."""
    shutil.copytree(pristine, tmp_path / "idx", symlinks=True)
    return tmp_path / "idx"


def query_cli(target):
    return CliRunner().invoke(cli, ["query", "--id", "d1", "--index", str(target), "-k", "3", "--json"])


def test_manifest_lists_every_file_with_size_and_sha256(index):
    root = Path(gen_of(index))
    files = store.read_manifest(root).files
    on_disk = sorted(p.name for p in root.iterdir() if p.name != store.MANIFEST)
    assert sorted(files) == on_disk and set(DATA_FILES) <= set(files)
    for name, entry in files.items():
        assert entry == {"size": (root / name).stat().st_size, "sha256": integrity.sha256_file(root / name)}


@pytest.mark.parametrize("name", DATA_FILES)
@pytest.mark.parametrize("damage", ["truncate", "flip", "flip-keep-mtime"])
def test_damaged_file_is_a_clear_error_naming_it(index, name, damage):
    expected = answers(index)  # also fills the verification cache: damage must invalidate it
    path = Path(gen_of(index)) / name
    size = path.stat().st_size
    st = path.stat()
    if damage == "truncate":
        os.truncate(path, size // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x55]))
        if damage == "flip-keep-mtime":  # `touch -d`: the ctime in the cache key still changes
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(IndexCorruptError, match=name):
        open_index(index)
    out = query_cli(index)  # the CLI: exit 1 with the message (a ClickException), no traceback
    assert out.exit_code == 1 and name in out.output and "rebuild the index" in out.output
    assert isinstance(out.exception, SystemExit) and "Traceback" not in out.output
    assert expected and len(expected) == 15  # the undamaged copy answered every query


def test_size_mode_trades_the_hash_for_speed_full_mode_rehashes(index, monkeypatch):
    path = Path(gen_of(index)) / store.VECTORS_FILE
    answers(index)
    calls = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: calls.append(Path(p).name) or real(p))
    open_index(index)
    assert calls == []  # verified once, remembered: an ordinary open hashes nothing
    monkeypatch.setenv(integrity.ENV_VERIFY, "full")
    open_index(index)
    assert sorted(calls) == sorted(store.read_manifest(path.parent).files)
    with open(path, "r+b") as f:  # same size, different bytes
        f.seek(200)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(IndexCorruptError, match=store.VECTORS_FILE):
        open_index(index)
    monkeypatch.setenv(integrity.ENV_VERIFY, "size")  # documented: sizes only
    open_index(index)


def test_a_fresh_build_is_verified_without_hashing(tmp_path, monkeypatch):
    """The writer seeds the cache when it publishes, so the first query after a build is cheap."""
    build(tmp_path / "idx", n=50)
    calls = []
    monkeypatch.setattr(integrity, "sha256_file", lambda p: calls.append(p))
    open_index(tmp_path / "idx")
    assert calls == []


def _rewrite_manifest(index, change):
    root = Path(gen_of(index))
    manifest = json.loads((root / store.MANIFEST).read_text())
    change(manifest, root)
    (root / store.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["../outside.npy", "/etc/passwd", "sub/deleted.npy", "..", "", "a\\b"])
def test_manifest_paths_cannot_leave_the_index(index, name):
    (index.parent / "outside.npy").write_bytes(b"x")
    _rewrite_manifest(index, lambda m, root: m["files"].update({name: {"size": 1, "sha256": "0" * 64}}))
    with pytest.raises(IndexCorruptError, match="not a file inside the index"):
        open_index(index)
    assert query_cli(index).exit_code == 1


def test_a_symlink_out_of_the_index_is_refused(index, tmp_path):
    root = Path(gen_of(index))
    outside = tmp_path / "elsewhere.sqlite"
    shutil.move(root / store.DOCSTORE_FILE, outside)
    os.symlink(outside, root / store.DOCSTORE_FILE)  # same bytes, same size: only the link is wrong
    with pytest.raises(IndexCorruptError, match="is a symlink"):
        open_index(index)


def test_a_file_missing_from_the_manifest_or_the_disk(index):
    root = Path(gen_of(index))
    os.remove(root / store.FAISS_FILE)
    with pytest.raises(IndexCorruptError, match=f"{store.FAISS_FILE} is missing"):
        open_index(index)
    _rewrite_manifest(index, lambda m, root: m["files"].pop(store.FAISS_FILE))
    with pytest.raises(IndexCorruptError, match=f"does not list {store.FAISS_FILE}"):
        open_index(index)


def test_a_damaged_manifest_is_named(index):
    (Path(gen_of(index)) / store.MANIFEST).write_bytes(b'{"format": "relsearch-index/1", "files": {')
    with pytest.raises(IndexCorruptError, match="manifest.json is not valid JSON"):
        open_index(index)
    out = query_cli(index)
    assert out.exit_code == 1 and "manifest.json" in out.output


def test_a_pickled_array_is_refused_not_unpickled(index, tmp_path):
    """A crafted deleted.npy holding an object array (with a matching checksum, as an attacker who
    can write the manifest would make it) is refused before anything is unpickled."""
    sentinel = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (Path.touch, (sentinel,))

    root = Path(gen_of(index))
    np.save(root / store.DELETED_FILE, np.array([Boom()], dtype=object), allow_pickle=True)
    _rewrite_manifest(index, lambda m, root: m["files"].update(
        {store.DELETED_FILE: {"size": (root / store.DELETED_FILE).stat().st_size,
                              "sha256": integrity.sha256_file(root / store.DELETED_FILE)}}))
    with pytest.raises(IndexCorruptError, match="not a plain numeric .npy"):
        open_index(index)
    assert not sentinel.exists()


def test_vectors_that_disagree_with_the_manifest_are_refused(index):
    _rewrite_manifest(index, lambda m, root: m["counts"].update(positions=m["counts"]["positions"] + 1))
    with pytest.raises(IndexCorruptError, match="vectors.npy holds float32|segments hold 300 positions, the counts"):
        open_index(index)
    _rewrite_manifest(index, lambda m, root: m.update(segments=[{"prefix": "", "start": 0, "positions": 301}]))
    with pytest.raises(IndexCorruptError, match="vectors.npy holds float32"):
        open_index(index)


def _open_within(index, seconds=20):
    """open_index in a thread: a FIFO opened for reading would block forever, so fail instead."""
    import threading

    outcome = []

    def run():
        try:
            outcome.append(open_index(index))
        except Exception as e:  # noqa: BLE001
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, "open_index blocked"
    return outcome[0]


def test_files_the_manifest_does_not_list_are_never_opened(index, tmp_path):
    """deleted.npy is opened only when listed; unlisted (here a symlink to a FIFO outside), refused."""
    root = Path(gen_of(index))
    _rewrite_manifest(index, lambda m, root: m["files"].pop(store.DELETED_FILE))
    os.remove(root / store.DELETED_FILE)
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "fifo", root / store.DELETED_FILE)
    error = _open_within(index)
    assert isinstance(error, IndexCorruptError) and "does not list 'deleted.npy'" in str(error)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_the_manifest_itself_must_be_a_regular_file(index, tmp_path, kind):
    root = Path(gen_of(index))
    shutil.move(root / store.MANIFEST, tmp_path / "manifest.json")
    if kind == "symlink":  # the same bytes elsewhere: only the link is wrong
        os.symlink(tmp_path / "manifest.json", root / store.MANIFEST)
    else:
        os.mkfifo(root / store.MANIFEST)
    error = _open_within(index)
    assert isinstance(error, IndexCorruptError), error
    assert f"manifest.json is {'a symlink' if kind == 'symlink' else 'not a regular file'}" in str(error)
    with pytest.raises(IndexCorruptError, match="manifest.json is"):
        store.read_manifest(root)  # writers read it the same way


def test_a_listed_file_that_is_not_a_regular_file_is_refused(index):
    root = Path(gen_of(index))
    os.remove(root / store.FAISS_FILE)
    os.mkfifo(root / store.FAISS_FILE)
    error = _open_within(index)
    assert isinstance(error, IndexCorruptError) and "index.faiss is not a regular file" in str(error)


@pytest.mark.parametrize("change, named", [
    (lambda m: m.pop("files"), "has no 'files' field"),  # would turn verification off
    (lambda m: m.update(counts="x"), "'counts' is 'x', not a JSON object"),
    (lambda m: m.pop("encoder"), "has no 'encoder' field"),
    (lambda m: m.update(dim="384"), "'dim' is '384', not a JSON integer"),
    (lambda m: m["counts"].update(positions=None), "'counts.positions' is None, not a JSON integer"),
    (lambda m: m["fields"].update(metadata="group"), "'fields.metadata' is 'group', not a JSON array"),
    (lambda m: m.update(projections=[]), "'projections' is [], not a JSON object"),
])
def test_a_manifest_field_edited_into_nonsense_is_named(index, change, named):
    _rewrite_manifest(index, lambda m, root: change(m))
    with pytest.raises(IndexCorruptError, match=re.escape(named)):
        open_index(index)
    out = query_cli(index)
    assert out.exit_code == 1 and out.output.count("\n") == 1 and named in out.output, out.output


def test_pickles_in_place_of_weights_are_refused_in_one_line(index, tmp_path):
    """A pickle named operators.safetensors, or a model folder whose only weights are
    pytorch_model.bin: refused by name; the pickle never runs."""
    from relsearch.encoder.bundle import Bundle, load_bundle
    from relsearch.encoder.model import Encoder, EncoderConfig

    sentinel = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (Path.touch, (sentinel,))

    import pickle  # the attack under test

    bundle = Bundle(encoder={"model": "all-MiniLM-L6-v2", "dim": 384}).save(tmp_path / "bundle")
    (bundle / "operators.safetensors").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(ValueError, match="operators.safetensors is not a safetensors file .*; refusing to load"):
        load_bundle(str(bundle))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(RuntimeError, match="only as pytorch_model.bin, which is not a safetensors file; refusing"):
        Encoder(EncoderConfig(model=str(model)))
    out = CliRunner().invoke(cli, ["query", "--id", "d1", "--index", str(index), "--model", str(bundle)])
    assert out.exit_code == 1 and out.output.count("\n") == 1 and "refusing to load" in out.output, out.output
    assert not sentinel.exists()


def test_the_verified_cache_forgets_files_that_are_gone(tmp_path):
    """A publish removes the generations no longer retained (snapshots); their markers go with them."""
    from relsearch.indexer import mutations, snapshots

    target = tmp_path / "idx"
    build(target, n=50)
    mutations.delete(str(target), ["d1"])
    snapshots.set_keep(target, 1)
    mutations.compact(str(target))
    root = Path(gen_of(target))
    [folder] = integrity._cache_dir().iterdir()  # one folder per index
    markers = [m for m in folder.iterdir() if m.name != integrity.INDEX_FILE]
    remembered = [Path(m.read_text().split("\n")[0]) for m in markers]
    assert sorted(remembered) == sorted(root / name for name in store.read_manifest(root).files)
    open_index(target)  # and the ones kept still spare the hash
    assert len(list(folder.iterdir())) == len(remembered) + 1


def test_a_publish_reads_its_own_index_markers_and_drops_those_of_deleted_indexes(tmp_path, monkeypatch):
    """Pruning used to read every marker of every index on the machine at each publish (1,830 on a
    developer's machine: 0.1 s per publish, growing with every index kept)."""
    from relsearch.indexer import mutations

    kept, deleted = tmp_path / "kept", tmp_path / "deleted"
    build(kept, n=20)
    build(deleted, n=20)
    old_layout = integrity._cache_root() / "verified"  # the flat markers of earlier versions
    old_layout.mkdir()
    (old_layout / "0123abcd").write_text("/nowhere\n00\n")
    folders = {p.name for p in integrity._cache_dir().iterdir() if p.is_dir()}
    assert len(folders) == 2
    shutil.rmtree(deleted)  # by hand: no relsearch command sees it go
    read = []
    real = integrity._prune_markers
    monkeypatch.setattr(integrity, "_prune_markers", lambda folder: read.append(folder) or real(folder))
    mutations.delete(str(kept), ["d1"])
    assert read == [integrity._index_markers(Path(gen_of(kept)))]
    assert [p for p in integrity._cache_dir().iterdir()] == read  # the deleted index's folder went
    assert not old_layout.exists()
    monkeypatch.setattr(integrity, "sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    open_index(kept)  # the new generation's files were remembered: opening hashes nothing


# ---------------------------------------------------------------- static audit of loaders

PACKAGE_DIRS = ["relsearch", "encoder", "indexer", "retrieval", "pipelines", "bench", "tools"]


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            kwargs = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            yield node, name, kwargs


def test_no_unsafe_deserialisation_anywhere_in_the_package():
    """Weights only through safetensors or torch.load(weights_only=True); no pickle, no
    allow_pickle, no remote code, no eval of data."""
    problems = []
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                    if {"pickle", "cPickle", "dill", "joblib", "cloudpickle", "marshal", "shelve"} & set(names):
                        problems.append(f"{path}:{node.lineno} imports a pickle-like module")
            for node, name, kwargs in _calls(tree):
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                if name.endswith("torch.load") and kwargs.get("weights_only") != "True":
                    problems.append(f"{where} torch.load without weights_only=True")
                if kwargs.get("allow_pickle") == "True":
                    problems.append(f"{where} allow_pickle=True")
                if kwargs.get("trust_remote_code") == "True":
                    problems.append(f"{where} trust_remote_code=True")
                if name in ("eval", "exec") or name.endswith(("yaml.load", "yaml.unsafe_load")):
                    problems.append(f"{where} {name}")
    assert problems == []


def test_the_installed_transformers_loads_bin_weights_with_weights_only():
    """Hugging Face folders may hold pytorch_model.bin: the installed transformers reads those with
    torch.load(weights_only=True), so even that path unpickles no code."""
    import importlib.util
    import re

    folder = importlib.util.find_spec("transformers").submodule_search_locations[0]
    source = Path(folder, "modeling_utils.py").read_text(encoding="utf-8")  # read, not imported: no torch start-up
    load_state_dict = source[source.index("def load_state_dict("):]
    load_state_dict = load_state_dict[:load_state_dict.index("\ndef ")]
    assert re.search(r"weights_only: bool = True", load_state_dict)
    assert "weights_only=weights_only" in load_state_dict


def _rehash(m, root, name):
    m["files"][name] = {"size": (root / name).stat().st_size, "sha256": integrity.sha256_file(root / name)}


def test_a_faiss_file_claiming_more_vectors_than_the_manifest_is_refused_before_faiss_reads_it(index):
    """A recomputed checksum does not help: the header's ntotal (2^37) and d are checked against the
    segment's positions and the manifest's dim first, in one line (before: a bad_alloc traceback)."""
    root = Path(gen_of(index))
    data = bytearray((root / store.FAISS_FILE).read_bytes())
    data[8:16] = (2**37).to_bytes(8, "little")
    (root / store.FAISS_FILE).write_bytes(bytes(data))
    _rewrite_manifest(index, lambda m, root: _rehash(m, root, store.FAISS_FILE))
    with pytest.raises(IndexCorruptError, match="claims 137,438,953,472 vectors of 384 dimensions"):
        open_index(index).faiss
    out = query_cli(index)
    assert out.exit_code == 1 and out.output.count("\n") == 1 and "claims 137,438,953,472" in out.output, out.output


@pytest.mark.parametrize("prefix", ["s²-", "s٣-", "s" + "9" * 5000 + "-", "s-", "x1-"])
def test_a_segment_prefix_that_is_not_s_digits_is_refused_cleanly(index, prefix):
    """str.isdigit takes "²" and Arabic-Indic digits, which int() refuses: only ASCII s<N>- is a prefix."""
    def change(m, root):
        m["segments"] = [{"prefix": "", "start": 0, "positions": m["counts"]["positions"] - 1},
                         {"prefix": prefix, "start": m["counts"]["positions"] - 1, "positions": 1}]
    _rewrite_manifest(index, change)
    with pytest.raises(IndexCorruptError, match="is not '' or s<N>-"):
        open_index(index)
    out = query_cli(index)
    assert out.exit_code == 1 and out.output.count("\n") == 1 and "is not '' or s<N>-" in out.output, out.output


def test_a_symlinked_writer_lock_is_refused_and_nothing_is_created_outside(index, tmp_path):
    """`DIR/lock` as a symlink would make `delete` create (and lock) a file anywhere: it is opened
    with O_NOFOLLOW, so the write is refused in one line and the index is unchanged."""
    outside = tmp_path / "elsewhere" / "planted"
    outside.parent.mkdir()
    (tmp_path / "idx" / "lock").unlink(missing_ok=True)  # the copied index's own lock file
    os.symlink(outside, tmp_path / "idx" / "lock")
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n")
    before = gen_of(index)
    out = CliRunner().invoke(cli, ["delete", "--index", str(index), "--ids", str(ids)])
    assert out.exit_code == 1 and "idx/lock is a symbolic link" in out.output and out.output.count("\n") == 1
    assert not outside.exists() and gen_of(index) == before
