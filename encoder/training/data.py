"""Training data readers: every problem is a ValueError naming ``file:line``.

Formats (docs/training.md, "Data formats"): triples ``{"head", "relation", "tail"[, "negative"][, "group"]}``;
pairs ``{"a", "b"[, "label"]}`` (no label = unlabelled, for PU learning); labelled corpora
``{"text", FIELD: label or [labels], ...}`` for aspects.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

@dataclass(frozen=True)
class Triple:
    head: str
    relation: str
    tail: str
    negative: str | None = None
    group: str | None = None
    where: str = ""  # "file:line"


def iter_jsonl(path: str | os.PathLike, what: str):
    """Yield ``(where, record)`` for each non-blank line of a JSONL file of objects."""
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such {what} file")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object")
            yield where, rec


def _require(where: str, rec: dict, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    missing = [k for k in fields if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)} (need {', '.join(fields)})")
    for k in fields + optional:
        if rec.get(k) is not None and not (isinstance(rec[k], str) and rec[k].strip()):
            raise ValueError(f"{where}: field {k!r} must be a non-empty string")


def read_triples(path: str | os.PathLike) -> list[Triple]:
    """Read one triples JSONL file."""
    out = []
    for where, rec in iter_jsonl(path, "triples"):
        _require(where, rec, ("head", "relation", "tail"), ("negative",))
        group = rec.get("group")
        out.append(Triple(rec["head"], rec["relation"].strip(), rec["tail"], rec.get("negative"),
                          None if group is None else str(group), where))
    if not out:
        raise ValueError(f"{path}: no triples (empty file)")
    return out


INVERSE_SUFFIX = "^-1"  # bench linkpred answers (?, r, t) with the operator named "<r>^-1"


def with_inverses(triples: list[Triple]) -> list[Triple]:
    """``triples`` plus each one reversed as relation ``<r>^-1`` (tail → head), so that head
    prediction (?, r, t) is trained like tail prediction. A hard negative stays with its head only."""
    return triples + [Triple(t.tail, t.relation + INVERSE_SUFFIX, t.head, None, t.group, t.where) for t in triples
                      if not t.relation.endswith(INVERSE_SUFFIX)]


def relations_to_train(loaded: dict[str, list[Triple]], wanted=None) -> list[str]:
    """The relations to train (``wanted``, default every relation of ``loaded["train"]``), after
    checking that each wanted relation and each dev/test triple's relation has training triples."""
    known = sorted({t.relation for t in loaded["train"]})
    for name in wanted or ():
        if name not in known:
            raise ValueError(f"relation {name!r} is not in the training data; known: {', '.join(known)}")
    for split in ("dev", "test"):
        for t in loaded.get(split, ()):
            if t.relation not in known:
                raise ValueError(f"{t.where}: relation {t.relation!r} of the {split} triples is not in the "
                                 f"training data; known: {', '.join(known)}")
    return list(wanted) if wanted else known


def load_triple_splits(train_files, dev_files=(), test_files=(), *, relations=None,
                       inverse: bool = False) -> tuple[dict[str, list[Triple]], list[str]]:
    """(``{"train", "dev", "test"}`` triples, relation names) for the relations to train (``relations``, default every
    relation of the training files; see :func:`relations_to_train`), with each triple also reversed
    when ``inverse``, and triples whose head is their tail dropped. ValueError if no training
    triple is left."""
    if isinstance(train_files, (str, os.PathLike)):
        train_files = [train_files]
    loaded = {s: [t for f in files for t in read_triples(f)] for s, files in
              (("train", train_files), ("dev", dev_files), ("test", test_files))}
    if inverse:
        loaded = {s: with_inverses(v) for s, v in loaded.items()}
    wanted = relations_to_train(loaded, relations)
    loaded = {s: [t for t in v if t.relation in wanted and t.head != t.tail] for s, v in loaded.items()}
    if not loaded["train"]:
        raise ValueError("no usable training triples")
    return loaded, wanted


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    label: str | None  # None: unlabelled
    group: str | None = None
    where: str = ""


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """Read a pairs JSONL file; ``label`` absent or null = unlabelled; labels are kept as strings."""
    out = []
    for where, rec in iter_jsonl(path, "pairs"):
        _require(where, rec, ("a", "b"))
        label = rec.get("label")
        if label is not None and not isinstance(label, (str, int, float, bool)):
            raise ValueError(f"{where}: field 'label' must be a string or number, got {type(label).__name__}")
        group = rec.get("group")
        out.append(Pair(rec["a"], rec["b"], None if label is None else str(label),
                        None if group is None else str(group), where))
    if not out:
        raise ValueError(f"{path}: no pairs (empty file)")
    return out


@dataclass(frozen=True)
class Labelled:
    text: str
    labels: dict[str, tuple[str, ...]]  # aspect field → its labels (several for multi-valued fields)
    id: str | None = None
    where: str = ""


def read_labelled(path: str | os.PathLike, fields: list[str] | tuple[str, ...], *, text_field: str = "text",
                  split: str | None = None) -> tuple[list[Labelled], int]:
    """Records with a text and at least one label per aspect ``field``; returns (records, skipped).

    A field may hold one label or a list of labels. Records whose text or one of the labels is
    missing/null are skipped and counted (a corpus rarely labels everything); a field that no record
    has at all is an error. ``split``: keep only records whose ``split`` field equals it.
    """
    out, skipped, seen = [], 0, set()
    for where, rec in iter_jsonl(path, "labelled corpus"):
        if split is not None and rec.get("split") != split:
            continue
        seen.update(k for k in fields if k in rec)
        text = rec.get(text_field)
        labels = {}
        for k in fields:
            v = rec.get(k)
            values = v if isinstance(v, list) else [v]
            labels[k] = tuple(str(x) for x in values if x is not None and str(x).strip())
        if not isinstance(text, str) or not text.strip() or not all(labels.values()):
            skipped += 1
            continue
        rid = rec.get("id")
        out.append(Labelled(text, labels, None if rid is None else str(rid), where))
    unseen = [k for k in fields if k not in seen]
    if unseen:
        raise ValueError(f"{path}: no record has the aspect field(s) {', '.join(unseen)}")
    if not out:
        raise ValueError(f"{path}: no record has a text and every aspect label"
                         + (f" in split {split!r}" if split else ""))
    return out, skipped
