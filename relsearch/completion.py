"""Completion of stored documents by the names people use (``GET /complete``, the explorer's id box).

A document matches a prefix by its id, by its name (NAME_FIELDS), or by an alias mined from its own
texts; the match is graded (:func:`match_tier`), then documents of one grade go by prominence, a
score read from the corpus itself. Names compare as people type them (:func:`name_words`): case,
accents and punctuation never matter, a leading article and trailing legal forms ("Inc.", "& Co.",
"Group Incorporated") are dropped, and words compare joined as well as apart ("jp morgan" finds
"JPMorgan Chase & Co.", "united health" finds "UnitedHealth Group Incorporated").

What the texts give — aliases and prominence — is mined once per generation, nothing hand-listed
(indexer/mining.py, which the recipe's prominence part reads too): "coca" lists The Coca-Cola
Company, which other companies' texts name, before Coca-Cola Consolidated.
"""
from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .indexer import mining
from .indexer.mining import (  # noqa: F401 (capitalised_runs, mine: what completion reads, re-exported)
    ARTICLES, LEGAL_FORMS, _naming_span, capitalised_runs, fold, mine, name_words, words)

# Completion holds a word-start index in memory for an index of at most this many documents, built
# at the first /complete of a generation (measured in complete()'s docstring); a bigger index
# completes prefixes of whole ids and names only (complete_by_scan), never building more: the build
# runs on the model thread, and at 100k documents it already takes ~2 s of CPU and ~120 MB at its peak.
COMPLETION_MAX_DOCS = 100_000
KEY_BYTES = 32  # UTF-8 bytes of a key (a name or id from a word start); a longer prefix is checked per match
MAX_WORD_STARTS = 16  # words of a name that completion finds (a title's 17th word does not complete)
MAX_CHECKED = 1_000  # matches per kind that a prefix longer than a key reads to check them whole
# in words(text) + " ": from each word start, the key's characters (one regex call, no Python loop)
_KEYS_FROM_WORD_STARTS = re.compile(f"(?<![^ ])(?=([^ ].{{0,{KEY_BYTES - 1}}}))", re.DOTALL)
_REST_FROM_WORD_STARTS = re.compile("(?<![^ ])(?=([^ ].*))", re.DOTALL)
_COMPLETIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a generation's docstore → Completions
_COMPLETIONS_LOCK = threading.Lock()


def complete(docs, name_field: str | None, mined: mining.Mined | None, prefix: str, limit: int) -> list[dict]:
    """Up to ``limit`` live documents of ``docs`` (a generation's Documents) matching ``prefix``, best
    first: ``[{"id", "name"}]``. Graded by :func:`match_tier` (the id itself, then ids starting with
    it, names starting with it, a word inside a name or id, an alias), then by prominence (:func:`mine`),
    then the shorter name, then the id (no name: last). The prefix is text, never a pattern: ``%``
    and ``_`` are punctuation like any other, not wildcards. ``mined``: the aliases and prominence
    the generation's writer mined of its texts (indexer/mining.py), None for none.

    Answered from keys held in memory per generation (:class:`Completions`), built at the first call.
    CPU time measured on 2 busy cores: the Russell 3000 with its three texts (2,924 documents) builds
    in ~1 s (mining its 6.1M characters of texts most of it; names alone took ~40 ms), then a call
    takes 0.4-3 ms; 100k documents (its names repeated, three texts each: too many to mine) build in
    ~5 s (~2 s before names were also keyed joined and without legal forms), then 0.3-4 ms a call. A SQLite ``LIKE
    '% coca%'`` scan of the names instead costs ~1 ms a call at 3k documents, 8-36 ms at 100k, every
    call. An index of more than COMPLETION_MAX_DOCS documents matches prefixes of whole ids and names
    only (:func:`complete_by_scan`): no call builds a structure the size of a huge index."""
    if docs.total > COMPLETION_MAX_DOCS:
        return complete_by_scan(docs, name_field, prefix, limit)
    with _COMPLETIONS_LOCK:  # built once per generation, whichever thread asks first
        index = _COMPLETIONS.get(docs)
        if index is None:
            index = _COMPLETIONS[docs] = Completions.build(docs, name_field, mined or mining.Mined())
    # a prefix as long as a key may match a key's end but not the rest of the name: check each whole
    long = max(len(fold(prefix).encode()), len(words(prefix).encode())) >= KEY_BYTES - 1
    rows = index.best(prefix, MAX_CHECKED if long else limit)
    positions = index.positions[rows].tolist()
    stored = docs.get(positions)
    found = [(row, stored[p]["id"], str(stored[p]["metadata"].get(name_field, "")) if name_field else "")
             for row, p in zip(rows, positions) if p in stored]
    if long:
        tiers = {row: match_tier(prefix, i, name, index.aliases.get(row, ())) for row, i, name in found}
        found = sorted((f for f in found if tiers[f[0]] is not None), key=lambda f: tiers[f[0]])  # stable: rank kept
    return [{"id": i, "name": name} for _, i, name in found[:limit]]


def complete_by_scan(docs, name_field: str | None, prefix: str, limit: int) -> list[dict]:
    """:func:`complete` on an index too big for a word-start index in memory: ids starting with
    ``prefix`` (as typed, or upper-cased), then names starting with it, any case; index range scans
    only (the docs table's unique id index and the side table's case-folded index)."""
    ids: list[str] = []
    for part in docs.parts:
        for start in dict.fromkeys((prefix, prefix.upper())):
            ids += [i for (i,) in part.conn.execute("SELECT id FROM docs WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                                                    (start, start + "\U0010ffff", limit))]
        if name_field is not None:
            folded = prefix.casefold()
            q = ("SELECT d.id FROM fields f JOIN docs d ON d.pos = f.pos WHERE f.field = ? AND f.elem = 0 "
                 "AND f.folded >= ? AND f.folded < ? ORDER BY f.folded LIMIT ?")
            ids += [i for (i,) in part.conn.execute(q, (name_field, folded, folded + "\U0010ffff", limit))]
    live = docs.positions(list(dict.fromkeys(ids)))  # deleted ids drop out; a replaced id keeps its newest row
    wanted = [i for i in dict.fromkeys(ids) if i in live][:limit]
    stored = docs.get([live[i] for i in wanted])
    by_id = {d["id"]: d["metadata"] for d in stored.values()}
    return [{"id": i, "name": str(by_id.get(i, {}).get(name_field, "")) if name_field else ""} for i in wanted]


# ---------------------------------------------------------------- how names compare


def word_keys(text: str) -> list[str]:
    """``words(text)`` and a space, from each of its first MAX_WORD_STARTS word starts, at most
    KEY_BYTES characters each ("coca cola company ", "cola company ", "company "); none for a text
    without a letter or digit."""
    w = words(text).rstrip()
    return _KEYS_FROM_WORD_STARTS.findall(w + " ")[:MAX_WORD_STARTS] if w else []


def name_keys(name: str, whole: bool = False) -> tuple[list[str], list[str]]:
    """``(starts, inner)``: the keys a prefix of ``name`` starts (its first word, its first naming word,
    and those joined: "the coca cola company ", "coca cola company ", "cocacola"), and those a word
    inside it starts, a leading article or a legal form excepted ("cola company ", "cola"; not
    "company "). At most KEY_BYTES characters each; ``whole``: uncut (:func:`match_tier`)."""
    w = words(name).rstrip()
    if not w:
        return [], []
    pattern = _REST_FROM_WORD_STARTS if whole else _KEYS_FROM_WORD_STARTS
    spaced = pattern.findall(w + " ")[:MAX_WORD_STARTS]
    split = w.split()
    skip, end = _naming_span(split)  # skip: the leading articles
    naming = split[skip:end]
    joined = ["".join(naming[i:]) for i in range(min(len(naming), MAX_WORD_STARTS))]
    joined = [k if whole else k[:KEY_BYTES] for k in joined]
    starts = list(dict.fromkeys([spaced[0], spaced[min(skip, len(spaced) - 1)], joined[0]]))
    inner = [k for k in spaced[skip + 1:] + joined[1:] if k.split(" ", 1)[0] not in LEGAL_FORMS | ARTICLES]
    return starts, list(dict.fromkeys(k for k in inner if k not in starts))


def _query_forms(prefix: str) -> list[str]:
    """The forms of ``prefix`` that keys are compared with: its words, and those joined ("jp morgan"
    → "jpmorgan") unless it is one word that a separator ends ("coca-" means the word is whole)."""
    w = words(prefix)
    if not w.strip():
        return []
    joined = w.replace(" ", "")
    return [w] if joined == w or (len(w.split()) == 1 and w.endswith(" ")) else [w, joined]


def match_tier(prefix: str, doc_id: str, name: str, aliases: tuple[str, ...] = ()) -> int | None:
    """How a document matches ``prefix``, 0 best: 0 its id is the prefix, 1 its id starts with it, 2
    its name starts with it, 3 a word inside its name or id does, 4 an alias (:func:`mine`) or a
    word of one does; None: no match (:func:`complete`). Names compare by :func:`name_keys`."""
    p = fold(prefix)
    if fold(doc_id) == p:
        return 0
    if fold(doc_id).startswith(p):
        return 1
    forms = _query_forms(prefix)
    starts, inner = name_keys(name, whole=True)
    inner += _REST_FROM_WORD_STARTS.findall(words(doc_id).rstrip() + " ")
    for tier, keys in ((2, starts), (3, inner), (4, [k for a in aliases for k in alias_keys(a, whole=True)])):
        if any(k.startswith(f) for k in keys for f in forms):
            return tier
    return None


def alias_keys(alias: str, whole: bool = False) -> list[str]:
    """The keys an alias is found by: from each of its word starts, and joined ("google cloud ", "cloud ",
    "googlecloud")."""
    w = words(alias).rstrip()
    spaced = (_REST_FROM_WORD_STARTS if whole else _KEYS_FROM_WORD_STARTS).findall(w + " ")[:MAX_WORD_STARTS]
    joined = w.replace(" ", "")
    return list(dict.fromkeys(spaced + [joined if whole else joined[:KEY_BYTES]])) if w else []


# ---------------------------------------------------------------- the keys held per generation


class _Keys:
    """Sorted keys (UTF-8, cut to KEY_BYTES), each with a rank: a prefix is a range found by
    bisection. A rank is ``grade * rows + row``, the row the document's rank among equals, so the
    best match of a range has the smallest rank. Held as numpy arrays, not a Python string per key:
    KEY_BYTES + 8 bytes a key."""

    def __init__(self, keys: list[bytes], ranks: list[int]):
        raw = np.array(keys, dtype=f"S{KEY_BYTES}")
        order = np.argsort(raw, kind="stable")
        self.keys, self.ranks = raw[order], np.asarray(ranks, np.int64)[order]

    def starting(self, prefix: str) -> np.ndarray:
        """Ranks of the keys starting with ``prefix`` (its first KEY_BYTES - 1 bytes: 0xff, which
        UTF-8 never holds, must fit after them as the range's end)."""
        p = prefix.encode()[:KEY_BYTES - 1]
        return self.ranks[np.searchsorted(self.keys, p):np.searchsorted(self.keys, p + b"\xff")]

    def equal(self, key: str) -> np.ndarray:
        k = key.encode()[:KEY_BYTES]
        return self.ranks[np.searchsorted(self.keys, k):np.searchsorted(self.keys, k, "right")]


@dataclass(frozen=True)
class Completions:
    """The live documents of one generation, for :func:`complete`. A document's row is its rank among
    equals (the more prominent first, then the shorter name, then the id; no name last)."""

    positions: np.ndarray  # row → position in the docstore
    ids: _Keys  # fold(id)
    names: _Keys  # name_keys(name)[0]
    inner: _Keys  # name_keys(name)[1], words(id) from each word start
    alias: _Keys  # alias_keys of each alias, graded by how much its document uses it
    aliases: dict[int, tuple[str, ...]]  # row → its aliases

    @classmethod
    def build(cls, docs, name_field: str | None, mined: mining.Mined) -> Completions:
        live = mining.live_names(docs, name_field)
        ranked = sorted((not name, -round(mined.prominence.get(pos, 0.0), 6), len(" ".join(name_words(name))),
                         doc_id, pos, name) for doc_id, (pos, name) in live.items())
        n = len(ranked)
        ids, names, inner, alias = ([], []), ([], []), ([], []), ([], [])  # (UTF-8 keys, ranks), encoded as made
        aliases: dict[int, tuple[str, ...]] = {}
        for row, (*_, doc_id, pos, name) in enumerate(ranked):
            starts, within = name_keys(name)
            for (out, ranks), found in ((ids, [fold(doc_id)]), (names, starts), (inner, within + word_keys(doc_id))):
                out.extend([k.encode() for k in found])
                ranks.extend([row] * len(found))
            said = mined.aliases.get(pos, [])
            aliases.update({row: tuple(a for a, _ in said)} if said else {})
            for a, uses in said:  # more uses, a better grade: a name its texts use 2**k times or more
                found = alias_keys(a)
                alias[0].extend([k.encode() for k in found])
                alias[1].extend([(16 - min(16, uses.bit_length())) * n + row] * len(found))
        return cls(np.fromiter((r[4] for r in ranked), np.int64, n), _Keys(*ids), _Keys(*names), _Keys(*inner),
                   _Keys(*alias), aliases)

    def best(self, prefix: str, limit: int) -> list[int]:
        """Rows of the best ``limit`` matches of ``prefix``, best first (:func:`complete`)."""
        p, forms = fold(prefix), _query_forms(prefix)
        tiers = [self.ids.equal(p), self.ids.starting(p)]
        tiers += [np.concatenate([keys.starting(f) for f in forms]) for keys in (self.names, self.inner, self.alias)
                  if forms]  # a prefix of punctuation alone names no word
        n = max(1, len(self.positions))
        taken = np.zeros(0, np.int64)
        for ranks in tiers:
            rows = np.unique(ranks) % n  # ranks sorted: best first
            _, first = np.unique(rows, return_index=True)
            rows = rows[np.sort(first)]
            fresh = rows[~np.isin(rows, taken)]
            taken = np.concatenate([taken, fresh[:limit - len(taken)]])
            if len(taken) >= limit:
                break
        return taken.tolist()
