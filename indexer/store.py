"""An index on disk, written aside and published atomically.

``DIR`` is one folder, so ``cp -r``, ``tar``, ``rsync`` and ``mv`` of it make a working index::

    DIR/current          the published generation's name (one line), replaced atomically
    DIR/generations/     the generation folders: the published one, retained snapshots, and the
                         shards of an interrupted build (``build-<key>``)
    DIR/history.json     the publish history (retention, rollback)
    DIR/lock             the writer lock

Indexes written before this layout (``DIR`` a symlink to ``.DIR.generations/<gen>``, with
``.DIR.history.json`` and ``.DIR.lock`` beside it) open as they are and are migrated to it by their
next writer (indexer/migration.py). Any other symlink given as ``DIR`` stands for the folder it
links to (:func:`index_dir`); inside ``DIR``, ``generations`` and its entries must not be symlinks
(:func:`generations_dir`), and only folders named as a writer names them are ever removed.
A generation folder ``DIR/generations/<gen>`` holds::

    manifest.json   encoder identity, bundle, counts, FAISS spec, fields, input fingerprint
    index.faiss     inner-product FAISS index of unit vectors t̂
    vectors.npy     the same unit vectors, float32 (n, d), memory-mapped for exact re-scoring,
                    --id queries and filtered search
    docstore.sqlite id, text, metadata, ‖h‖ per live position
    deleted.npy     positions of deleted / replaced documents (absent when none): rows of
                    vectors.npy that no longer count; still in index.faiss as tombstones unless the
                    FAISS type removes them (manifest ``counts.tombstones``)
    rejected.jsonl  input lines of the last run that were not indexed, with line number and reason

A build or a mutation (indexer/mutations.py) writes a new generation, writes its manifest last
(with the size and sha256 of every file, indexer/integrity.py), fsyncs it, and then replaces the
``current`` pointer with ``os.replace`` (atomic on POSIX): readers see the old index or the new one, never a
half-written one, and a killed writer leaves the previous index untouched. Writers of one index
take the writer lock (indexer/locking.py) so two mutations cannot both start from the same
generation (and a writer decides between building and appending under it). A full disk is one
:class:`NoSpaceError`. Readers open a generation with indexer/reader.py, which verifies its files
against the manifest and keeps them open.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import re
import shutil
import sqlite3
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

from ..version import __version__
from .. import faults
from ..files import replaced_atomically
from . import integrity
from .integrity import IndexCorruptError  # noqa: F401  (re-exported: callers catch it from here)
from .manifest import FILE as MANIFEST
from .manifest import FORMAT, Manifest
from .manifest import read as read_manifest  # noqa: F401  (re-exported)
from .manifest import write as write_manifest
FAISS_FILE = "index.faiss"
VECTORS_FILE = "vectors.npy"
DOCSTORE_FILE = "docstore.sqlite"
REJECTED_FILE = "rejected.jsonl"
DELETED_FILE = "deleted.npy"
ES_REJECTED_FILE = "rejected-es.jsonl"


CURRENT = "current"  # DIR/current: the published generation's name
GENERATIONS = "generations"
HISTORY = "history.json"
LOCK = "lock"
MAX_POINTER_BYTES = 4096
# the names new_generation gives (and the only generation folders a writer ever removes), and those
# of the build folders of pipelines/index.py
GENERATION_NAME = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9]+-[0-9a-f]{6}")
BUILD_NAME = re.compile(r"build-[0-9a-f]+")


def legacy(target: str | os.PathLike) -> bool:
    """True for an index of the layout before one-folder indexes: ``DIR`` a symlink to
    ``.DIR.generations/<gen>`` (migrated by its next writer), or to another generation folder. A
    symlink to anything else is a link to an index folder (:func:`index_dir`)."""
    target = Path(target).absolute()
    if not target.is_symlink():
        return False
    real = Path(os.path.realpath(target))
    # the parent test: an old-layout link whose generation was removed is still an old-layout index
    return os.path.lexists(real / MANIFEST) or real.parent == Path(os.path.realpath(legacy_path(target, "generations")))


def index_dir(target: str | os.PathLike) -> Path:
    """The absolute index folder ``target`` names: when ``target`` itself is a symlink to a folder
    (``ln -s /data/idx link``; not an index of the old layout), the folder it links to, so that
    reading and writing through the link act on that folder and a writer never replaces the link."""
    target = Path(target).absolute()
    if target.is_symlink() and not legacy(target):
        return Path(os.path.realpath(target))
    return target


def legacy_path(target: Path, suffix: str) -> Path:
    return target.parent / f".{target.name}.{suffix}"


def generations_dir(target: str | os.PathLike) -> Path:
    """``DIR/generations`` (``.DIR.generations`` beside an index of the old layout).

    IndexCorruptError when it, or any entry in it, is a symlink: an index folder received from
    someone else can carry one, and following it would read generations from, and remove folders
    in, a place that is not the index."""
    target = index_dir(target)
    if legacy(target):
        return legacy_path(target, "generations")
    gens = target / GENERATIONS
    if gens.is_symlink():
        raise IndexCorruptError(f"{gens} is a symlink; an index's generations must be a folder inside it: "
                                "replace the link with the folder it points to")
    try:
        links = sorted(e.name for e in os.scandir(gens) if e.is_symlink())
    except (FileNotFoundError, NotADirectoryError):  # no generation yet; or damage the caller names
        links = []
    if links:
        raise IndexCorruptError(f"{gens / links[0]} is a symlink; generations must be folders inside the index: "
                                "replace the link with the folder it points to")
    return gens


def current_generation(target: str | os.PathLike) -> Path | None:
    """The generation folder ``target`` publishes now, None when it publishes none (no index, or a
    first build that never finished). ``target`` is an index folder (``DIR/current`` names the
    generation), an index of the old layout (a symlink to it), or a generation folder itself."""
    target = index_dir(target)
    if legacy(target):
        return Path(os.path.realpath(target))
    try:
        fd = integrity.open_regular(target / CURRENT)
    except FileNotFoundError:
        return target if os.path.lexists(target / MANIFEST) else None
    except NotADirectoryError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_POINTER_BYTES)
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        name = ""
    if not safe_generation_name(name):
        raise IndexCorruptError(f"{target / CURRENT} does not name a generation of the index; the index is damaged")
    return generations_dir(target) / name


def is_published(target: str | os.PathLike) -> bool:
    """``target`` publishes a generation (an index exists there)."""
    try:
        return current_generation(target) is not None
    except (OSError, IndexCorruptError):
        return True  # damaged, but an index: never build over it as if it were absent


def _ours(target: Path) -> bool:
    """``target`` is absent, an index (either layout) or an index folder a writer started (its lock,
    its generations), or an empty folder: a writer may use it."""
    target = index_dir(target)
    if legacy(target) or not os.path.lexists(target):
        return True
    if not target.is_dir():
        return False
    names = set(os.listdir(target))
    return not names or bool(names & {CURRENT, GENERATIONS, LOCK})  # rejected.jsonl alone: not ours


def new_generation(target: str | os.PathLike) -> Path:
    """Create an empty generation folder in ``target`` (not yet visible to readers)."""
    target = index_dir(target)
    if legacy(target) or not _ours(target):
        raise FileExistsError(f"{target} exists and is not a relsearch index; choose another --index")
    gens = integrity.make_inside(target, generations_dir(target))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    gen = gens / f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    gen.mkdir()
    return gen


def publish(target: str | os.PathLike, gen: Path, *, remove_builds: bool = True) -> None:
    """Atomically point ``target`` at ``gen`` (a rename of ``DIR/current``), record it in the
    index's publish history, then remove generations that are neither retained (:func:`retained`)
    nor being opened. The caller holds the writer lock (indexer/locking.py), so the index has the one-folder
    layout.

    Shards of interrupted builds (``build-*``) go too: a build can be resumed until a build or
    append of other input to the same index starts (:func:`remove_stale_builds`) or succeeds.
    A rollback (``remove_builds=False``) is neither, so it leaves them.
    """
    target = index_dir(target)
    if gen.parent != generations_dir(target) or legacy(target):
        raise ValueError(f"{gen} is not a generation folder of {target}")
    published = current_generation(target) if os.path.lexists(target / CURRENT) else None
    if published is not None:  # a writer killed after its swap may not have recorded it
        _record_published(target, published.name)
    tmp = target / f".{CURRENT}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(gen.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    faults.point("publish.link-created")
    os.replace(tmp, target / CURRENT)
    fsync_dir(target)  # the swap itself survives a power cut once this returns
    faults.point("publish.swapped")
    show_rejected(target, gen)
    _record_published(target, gen.name)
    remove_stale_generations(target, keep=gen, builds=remove_builds)


def show_rejected(target: Path, gen: Path) -> None:
    """``DIR/rejected.jsonl``: a copy of the published generation's rejection log where users look
    for it (replaced atomically; nothing reads it back, and editing it harms no generation)."""
    source = gen / REJECTED_FILE
    try:
        if not source.is_file():
            (target / REJECTED_FILE).unlink(missing_ok=True)
            return
        with replaced_atomically(target / REJECTED_FILE) as tmp:
            shutil.copyfile(source, tmp)
    except OSError:  # a convenience: never fails a publish that already happened
        pass


# ---------------------------------------------------------------- snapshots: the publish history
#
# ``DIR/history.json`` (``.NAME.history.json`` beside an index of the old layout): {"keep": N,
# "published": [generation names, oldest first]}. Only publish() (under the writer lock, after or before a swap it made) adds names, so
# every name in it was the published index once: a generation a killed writer completed but never
# published is never listed, and is removed as debris. The newest ``keep`` listed generations that
# still exist (the published one always among them) are retained: ``relsearch snapshots`` lists
# them, ``relsearch rollback`` publishes one of them again.

KEEP_GENERATIONS = 3  # the published generation and the two before it
MAX_HISTORY = 100


def history_path(target: str | os.PathLike) -> Path:
    target = index_dir(target)
    return legacy_path(target, "history.json") if legacy(target) else target / HISTORY


def read_history(target: str | os.PathLike) -> dict:
    """``{"keep": N, "published": [...]}``; a missing or unreadable file is an empty history."""
    try:
        data = json.loads(history_path(target).read_text(encoding="utf-8"))
        keep, names = data.get("keep", KEEP_GENERATIONS), data.get("published", [])
        if isinstance(keep, int) and keep >= 1 and isinstance(names, list) and all(isinstance(n, str) for n in names):
            return {"keep": keep, "published": names}
    except (OSError, ValueError, AttributeError):
        pass
    return {"keep": KEEP_GENERATIONS, "published": []}


def write_history(target: str | os.PathLike, history: dict) -> None:
    with replaced_atomically(history_path(target)) as tmp:
        tmp.write_text(json.dumps({"keep": history["keep"], "published": history["published"][-MAX_HISTORY:]}) + "\n",
                       encoding="utf-8")


def _record_published(target: Path, name: str) -> None:
    history = read_history(target)
    if history["published"][-1:] != [name]:  # a name published again (a rollback) moves to the end
        history["published"] = [n for n in history["published"] if n != name] + [name]
        write_history(target, history)


def retained(target: str | os.PathLike) -> list[Path]:
    """The retained generations, newest first: the published one, then the most recently published
    others that still exist, ``keep`` in all."""
    target = index_dir(target)
    gens, history = generations_dir(target), read_history(target)
    try:
        published = current_generation(target)
    except (OSError, IndexCorruptError):
        published = None
    out = [published] if published is not None and published.parent == gens else []
    for name in reversed(history["published"]):
        if len(out) >= history["keep"]:
            break
        if safe_generation_name(name) and (gens / name).is_dir() and gens / name not in out:
            out.append(gens / name)
    return out


def safe_generation_name(name: str) -> bool:
    return integrity.safe_name(name) and not name.startswith((".", "build-"))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_generation(gen: Path) -> None:
    """Flush every file of ``gen`` and the folder itself to disk before it is published, so a
    power cut after the swap cannot leave the symlink pointing at files still in the page cache."""
    for path in gen.iterdir():
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(gen)


def remove_stale_generations(target: Path, *, keep: Path | None = None, builds: bool = True) -> None:
    """Delete generations other than the retained ones (:func:`retained`) and ``keep``: older
    snapshots, and debris of killed writers.

    Runs inside ``publish``, under the writer lock that every generation is created under, so no
    other writer of this index can be half-way through one: whatever was never published is debris
    (the writer's pid in the name is only for people reading the folder). A generation a reader is
    opening right now (shared lock on its manifest) is left for the next write; readers that have
    opened a removed generation keep answering from their open files.

    Only real folders named as :func:`new_generation` names them are removed: nothing else in
    ``generations`` (a folder someone put there, a link) was written by a writer of this index.
    """
    target = index_dir(target)
    gens = generations_dir(target)
    kept = set(retained(target)) | {keep}
    # temporary pointers of publishes killed before their swap
    for tmp in target.glob(f".{CURRENT}-*"):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
    if builds:
        remove_stale_builds(target)
    for gen in gens.glob("*") if gens.is_dir() else []:
        if gen in kept or not _ours_to_remove(gen, GENERATION_NAME):
            continue
        if not _being_opened(gen):  # else a reader is opening it: the next write removes it
            shutil.rmtree(gen, ignore_errors=True)


def _ours_to_remove(path: Path, name: re.Pattern) -> bool:
    """``path`` is a folder (not a link to one) named as a writer names the folders it makes."""
    try:
        return name.fullmatch(path.name) is not None and stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:  # gone meanwhile
        return False


def remove_if_empty(target: str | os.PathLike) -> None:
    """Remove the index folder ``target`` if it holds nothing but an empty ``generations`` folder
    (what a first build that failed on its input leaves). Reached through a symlink, the folder
    stays: the user made it, and removing it would leave the link dangling."""
    named = Path(target).absolute()
    target = index_dir(named)
    if legacy(target):
        return
    for path in (target / GENERATIONS, target) if target == named else (target / GENERATIONS,):
        try:
            os.rmdir(path)
        except OSError:  # not empty, or gone
            pass


def remove_stale_builds(target: str | os.PathLike, *, keep: Path | None = None) -> None:
    """Delete the shards of interrupted builds (``build-*``) other than ``keep``, unless a run
    holds them: a build starting on other input calls it first, so old shards never fill the disk
    it needs."""
    for build in generations_dir(target).glob("build-*"):
        if build != keep and _ours_to_remove(build, BUILD_NAME) and _unlocked(build / "lock"):
            shutil.rmtree(build, ignore_errors=True)


def _being_opened(gen: Path) -> bool:
    """True while a reader holds ``gen``'s manifest under a shared lock (see indexer/reader.py)."""
    try:
        with open(gen / MANIFEST, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
    except BlockingIOError:
        return True
    except OSError:  # no manifest: debris nothing can open
        return False


def open_lock_file(path: Path) -> int:
    """The writer lock file, opened (created if need be) without following a symlink: a link planted
    as ``DIR/lock`` would make every writer create or lock a file outside the index."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise IndexCorruptError(f"{path} is a symbolic link; the writer lock must be a regular file: "
                                    "remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IndexCorruptError(f"{path} is not a regular file; the writer lock must be one: remove it")
    return fd


class NoSpaceError(RuntimeError):
    """The disk filled up while writing an index; nothing was published."""


def _chain(e: BaseException | None):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _is_full(e: BaseException) -> bool:
    return (isinstance(e, NoSpaceError) or (isinstance(e, OSError) and e.errno == errno.ENOSPC)
            or (isinstance(e, sqlite3.OperationalError)
                and (getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(e))))


def raise_if_full(e: BaseException, target: str | os.PathLike, *, kept: Path | None = None) -> None:
    """Raise one NoSpaceError if ``e`` is a full disk in any of its forms (OSError ENOSPC, SQLite's
    "database or disk is full", a Beam step's RuntimeError around either); else return.

    ``kept``: a build folder of resumable shards; the message says how much space they take (a
    folder without a finished shard is removed instead). Call it after the half-written generation
    is removed.
    """
    chain = list(_chain(e))
    if not any(_is_full(x) for x in chain):
        return
    path = next((x.filename for x in chain if isinstance(x, OSError) and x.filename), None) or Path(target).absolute()
    message = f"no space left on device while writing {path}; nothing was published"
    if kept is not None and any(kept.glob("*.npz")):
        size = sum(f.stat().st_size for f in kept.iterdir() if f.is_file())
        message += (f"; {size / (1 << 20):.1f} MB of encoded shards kept in {kept} to resume: free space and "
                    "run the same command again, or delete that folder")
    elif kept is not None:
        shutil.rmtree(kept, ignore_errors=True)
    raise NoSpaceError(message) from e


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link an immutable file into a new generation (free); copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _unlocked(lock: Path) -> bool:
    try:
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def commit(target: str | os.PathLike, gen: Path, manifest: Manifest, mirrors=(),
           previous: tuple[Path, dict] | None = None) -> Manifest:
    """Finish ``gen`` and make it the index: load each mirror (e.g. Elasticsearch) from ``gen``,
    write the manifest with their counts, publish, then let each mirror switch (alias swap).

    The manifest is stamped here (format, version, time, and the size and sha256 of every file;
    files hard-linked from ``previous``, (root, files), keep their entries: integrity.checksum_files).
    A mirror is any object with ``name``, ``load(gen, manifest) -> dict`` and ``publish()``.
    Returns the manifest written. A backend of the previous generation that is not mirrored again
    is kept, marked ``"stale": true``: it still holds the older contents.
    """
    root = index_dir(target)
    backends = {name: {**entry, "stale": True} for name, entry in manifest.backends.items()}
    for mirror in mirrors:
        backends[mirror.name] = mirror.load(gen, manifest)
    faults.point("commit.mirrors-loaded")
    written = manifest.replace(backends=backends, format=FORMAT, version=__version__, created_at=utc_now(),
                               files=integrity.checksum_files(gen, previous))
    integrity.check_inside(root, gen)  # right before each write that makes it the index
    write_manifest(gen, written)
    fsync_generation(gen)
    faults.point("commit.manifest-written")
    integrity.check_inside(root, gen)
    publish(target, gen)
    integrity.remember(gen, written.files)  # after the old generation's links are gone (ctime)
    faults.point("commit.published")
    for mirror in mirrors:
        mirror.publish()
    return written


def publish_new(target: str | os.PathLike, fill: Callable[[Path], Manifest], mirrors=(),
                previous: tuple[Path, dict] | None = None) -> Manifest:
    """The one publish sequence of every writer (build, append, delete, compact): a new generation
    folder, ``fill(gen)`` writes its data files and returns their manifest, :func:`commit`. On any
    failure the folder is removed and the published index is untouched. The caller holds
    :func:`~.locking.writer_lock`.

    Every write stays inside the index folder, resolved here once: the generation is checked
    (integrity.check_inside) after ``fill`` and before each write of :func:`commit`; a folder on
    the way swapped for a link meanwhile stops the write in one IndexCorruptError, and nothing is
    removed through the link."""
    root = index_dir(target)
    gen = new_generation(root)
    try:
        manifest = fill(gen)
        integrity.check_inside(root, gen)
        return commit(target, gen, manifest, mirrors, previous)
    except BaseException as e:
        try:
            integrity.check_inside(root, gen)
        except IndexCorruptError as escaped:  # fill's writes went nowhere (or failed) through the link
            raise escaped from e
        shutil.rmtree(gen, ignore_errors=True)
        raise_if_full(e, target)
        raise
