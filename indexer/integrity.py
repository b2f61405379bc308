"""Checksums of an index generation's files, and their verification when an index is opened.

The manifest's ``files`` section names every data file of the generation with its size and
sha256. Opening an index checks, before any file is parsed (a damaged FAISS file can crash the
process, a damaged docstore can return wrong rows):

- the manifest has a ``files`` section (without it nothing could be verified: refused);
- every name is a plain file name inside the generation folder (no ``/``, ``..``), and a regular
  file, not a symlink (files a reader opens that the manifest does not list are refused too,
  indexer/store.py);
- every file exists with the recorded size (always: one ``stat`` per file);
- every file hashes to the recorded sha256, unless this user already verified this very file:
  a verified file is remembered in ``$RELSEARCH_CACHE_DIR/verified-by-index`` (default
  ``~/.cache/relsearch/verified-by-index``) by device, inode, size, mtime and ctime, so a file rewritten or
  damaged in place (which changes its mtime and ctime, even after ``touch -d``) is hashed again.
  The writer seeds this cache when it publishes, so queries normally hash nothing, and prunes it
  then. Markers live in one folder per index (the folder of its generations), so a publish reads
  its own index's markers, not those of every index on the machine: each marker holds the path
  and sha256 it was made for, and one whose file is gone or changed (a removed generation) is
  dropped; the folder of an index deleted by hand goes at the next publish of any index.

``RELSEARCH_VERIFY=full`` hashes every file on every open; ``RELSEARCH_VERIFY=size`` checks
sizes only (for very large indexes on trusted storage). The threat model is accidental damage
(truncated copies, full disks, bit rot, a file from another generation) and careless edits, not
an attacker who can rewrite the manifest too.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from ..files import sha256_file

MANIFEST = "manifest.json"
ENV_VERIFY = "RELSEARCH_VERIFY"
ENV_CACHE = "RELSEARCH_CACHE_DIR"
MODES = ("cached", "full", "size")
INDEX_FILE = "index"  # in a marker folder: the generations folder its markers are for


class IndexCorruptError(ValueError):
    """An index file is missing, truncated, altered or outside its generation folder."""


def safe_name(name: object) -> bool:
    """A bare file name: no separators, not ``.``/``..``, no NUL, not hidden-path tricks."""
    return (isinstance(name, str) and bool(name) and name not in (".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name and not os.path.isabs(name))


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file and not a symlink (a link
    could point anywhere; a FIFO would block the reader). FileNotFoundError when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        if os.path.islink(path):
            raise IndexCorruptError(f"{path} is a symlink; index files must be regular files inside the index") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IndexCorruptError(f"{path} is not a regular file; index files must be regular files inside the index")
    return fd


def checksum_files(gen: Path, previous: tuple[Path, dict] | None = None) -> dict[str, dict]:
    """``{name: {"size", "sha256"}}`` for every regular file of ``gen`` except the manifest.

    ``previous``: (root, files section) of the generation ``gen`` was made from. A file that is a
    hard link of the same name there (same inode, same size) keeps its recorded entry instead of
    being hashed again: the writer verified it when it opened that generation, and it cannot have
    changed since without changing its inode's size or being replaced. This is what keeps an
    append or a delete in proportion to its own size.
    """
    out = {}
    for path in sorted(Path(gen).iterdir()):
        if path.name != MANIFEST and path.is_file() and not path.is_symlink():
            out[path.name] = _linked_entry(path, previous) or {"size": path.stat().st_size,
                                                                "sha256": sha256_file(path)}
    return out


def _linked_entry(path: Path, previous: tuple[Path, dict] | None) -> dict | None:
    if previous is None or path.name not in previous[1]:
        return None
    try:
        mine, theirs = path.stat(), (Path(previous[0]) / path.name).stat()
    except OSError:
        return None
    entry = previous[1][path.name]
    same = (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino) and mine.st_size == entry.get("size")
    return dict(entry) if same else None


def _cache_root() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "relsearch"


def _cache_dir() -> Path:
    # not "verified", the flat layout of earlier versions: one of them running beside this one
    # would fail on the folders it finds there (it prunes by unlinking every entry)
    return _cache_root() / "verified-by-index"


def _generations(generation: Path) -> str:
    """The folder that holds ``generation`` and the index's other generations."""
    return os.path.dirname(os.path.realpath(generation))


def _index_markers(generation: Path) -> Path:
    """The marker folder of the index whose generation folder is ``generation``."""
    return _cache_dir() / hashlib.sha256(_generations(generation).encode()).hexdigest()[:32]


def _marker(path: Path, sha256: str) -> Path:
    st = os.stat(path)
    key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{sha256}"
    return _index_markers(Path(path).parent) / hashlib.sha256(key.encode()).hexdigest()


def _mark(path: Path, sha256: str) -> None:
    """Remember ``path`` as verified; the marker holds what :func:`prune` needs to tell if it is stale."""
    try:
        marker = _marker(path, sha256)
        if not (marker.parent / INDEX_FILE).exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            (marker.parent / INDEX_FILE).write_text(_generations(Path(path).parent), encoding="utf-8")
        marker.write_text(f"{os.path.abspath(path)}\n{sha256}\n", encoding="utf-8")
    except OSError:
        pass  # a read-only home only costs a re-hash later


def prune(generation: Path) -> None:
    """Drop the markers of ``generation``'s index whose file no longer exists or has changed since
    (they can never match again), and the marker folders of indexes that are gone."""
    _remove(_cache_root() / "verified")  # the flat layout of earlier versions: never read now
    try:
        folders = list(_cache_dir().iterdir())
    except OSError:
        return
    own = _index_markers(generation)
    for folder in folders:
        try:
            if folder == own:
                _prune_markers(folder)
            elif not os.path.isdir((folder / INDEX_FILE).read_text(encoding="utf-8")):
                _remove(folder)  # its index is gone
        except OSError:  # unreadable, or being created by another writer: at worst a re-hash later
            _remove(folder)


def _prune_markers(folder: Path) -> None:
    for marker in folder.iterdir():
        if marker.name == INDEX_FILE:
            continue
        try:
            path, sha256 = marker.read_text(encoding="utf-8").split("\n")[:2]
            if _marker(Path(path), sha256) == marker:
                continue
        except (OSError, UnicodeDecodeError, ValueError):
            pass  # the file is gone, or the marker is unreadable: either way it is stale
        marker.unlink(missing_ok=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def remember(gen: Path, files: dict[str, dict]) -> None:
    """Record ``gen``'s files as verified (after a writer computed their hashes itself), and drop
    markers of files that are gone: a publish is what removes generations."""
    prune(gen)
    for name, entry in files.items():
        _mark(Path(gen) / name, entry["sha256"])


def verify(root: Path, files: dict, *, required: tuple[str, ...] = (), mode: str | None = None) -> None:
    """Raise IndexCorruptError unless every file named by ``files`` (the manifest's) is intact.

    ``required``: names that must be listed (the data files a reader opens).
    """
    mode = mode or os.environ.get(ENV_VERIFY) or "cached"
    if mode not in MODES:
        raise ValueError(f"{ENV_VERIFY}={mode!r}: choose one of {', '.join(MODES)}")
    if not isinstance(files, dict):
        raise IndexCorruptError(f"{root / MANIFEST}: {'no' if files is None else 'malformed'} 'files' checksums "
                                "section, so the index cannot be verified; rebuild the index")
    for name in required:
        if name not in files:
            raise IndexCorruptError(f"{root / MANIFEST} does not list {name}")
    root = Path(root)
    real_root = os.path.realpath(root)
    for name, entry in files.items():
        if not safe_name(name):
            raise IndexCorruptError(f"{root / MANIFEST} names {name!r}, which is not a file inside the index")
        path = root / name
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise IndexCorruptError(f"{root / MANIFEST}: malformed checksum entry for {name}")
        if path.is_symlink() or os.path.dirname(os.path.realpath(path)) != real_root:
            raise IndexCorruptError(f"{path} is a symlink; index files must be regular files inside the index")
        if not os.path.lexists(path):
            raise IndexCorruptError(f"{path} is missing")
        if not path.is_file():
            raise IndexCorruptError(f"{path} is not a regular file; index files must be regular files inside the index")
        size = path.stat().st_size
        if size != entry["size"]:
            raise IndexCorruptError(f"{path} has {size} bytes, the manifest says {entry['size']}: "
                                    "the file is truncated or was replaced; rebuild the index")
        if mode == "size":
            continue
        marker = _marker(path, entry["sha256"])
        if mode == "cached" and marker.exists():
            continue
        if sha256_file(path) != entry["sha256"]:
            raise IndexCorruptError(f"{path} does not match its sha256 in the manifest: the file was altered "
                                    "or damaged; rebuild the index")
        _mark(path, entry["sha256"])


# ---------------------------------------------------------------- writes stay inside the index

def check_inside(root: str | os.PathLike, folder: str | os.PathLike) -> None:
    """IndexCorruptError unless ``folder`` is the index folder ``root`` (resolved once by the
    writer, store.index_dir) or a folder below it reached through real folders only: every
    component from ``root`` down is a directory, none a symlink, so the folder's real path lies
    inside ``root``. A writer calls it right before it creates files in ``folder``: a component
    swapped for a link meanwhile (``generations`` made a link to a folder elsewhere) would lead its
    writes out of the index, so it stops there, naming the link."""
    root, folder = Path(root), Path(folder)
    try:
        parts = folder.relative_to(root).parts
    except ValueError:
        raise IndexCorruptError(f"{folder} is not inside the index {root}; refusing to write there") from None
    for depth in range(len(parts) + 1):
        path = root.joinpath(*parts[:depth])
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise IndexCorruptError(f"{path} is gone: it was removed or moved while a writer wrote into it; "
                                    "the writer stops and publishes nothing") from None
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise IndexCorruptError(f"{path} is {'a symlink' if stat.S_ISLNK(mode) else 'no folder'} now; "
                                    f"a writer writes only inside the index folder {root}, so it stops and "
                                    "publishes nothing")


def make_inside(root: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """Create ``folder`` below the index folder ``root`` (``root`` too, with its parents, when
    absent) one level at a time, each level checked by :func:`check_inside` before a folder is
    made in it: ``mkdir(parents=True)`` would follow a link put in its way and create the folder,
    and what is then written into it, outside the index. Returns ``folder``."""
    root, folder = Path(root), Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    path = root
    for part in folder.relative_to(root).parts:
        check_inside(root, path)
        path = path / part
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
    check_inside(root, folder)
    return folder
